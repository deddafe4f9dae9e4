// A directory of a test's own: made fresh (mkdtemp) when the object is built, removed with all it holds
// when the object goes. Tests write their files there instead of naming paths in TEST_TMPDIR by hand,
// so two tests (or two runs of one) never meet in the same directory. fitrund's tests and the worker's
// share it (fitrund's name it fitrun::server::TempDir, server/testing/temp_dir.h). One thread at a time.
#ifndef FITRUN_PROTO_CONTRACT_TESTING_TEMP_DIR_H_
#define FITRUN_PROTO_CONTRACT_TESTING_TEMP_DIR_H_

#include <string>
#include <string_view>

namespace fitrun::contract {

class TempDir {
 public:
  // `prefix` and six random characters, under `parent`; an empty `parent` is TEST_TMPDIR, or /tmp
  // where that is unset. A test whose files another account must reach passes "/tmp" (Bazel's
  // TEST_TMPDIR may lie under a directory only root can enter).
  explicit TempDir(std::string_view prefix = "fitrun-", std::string_view parent = "");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // False when the directory could not be made (path() is then empty): a test asserts it first.
  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  // path()/name.
  std::string Join(std::string_view name) const;
  // Writes `bytes` to path()/name (replacing it) and returns that path; empty when it could not.
  std::string Write(std::string_view name, std::string_view bytes) const;

 private:
  std::string path_;
};

}  // namespace fitrun::contract

#endif  // FITRUN_PROTO_CONTRACT_TESTING_TEMP_DIR_H_
