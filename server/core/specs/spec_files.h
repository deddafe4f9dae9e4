// How fitrund opens a file a spec names: at submit only, with the owner's rights (the caller holds
// a FileAccessAs when jobs run as accounts), never a kernel or device file, never blocking, a
// regular file only, and read within a bound. What planning needs of the files is read then and kept
// with the spec (JobSpec.file_facts; the paths a spec may name are data_roots.h's): a spec's files are its owner's, who may replace them with a
// FIFO, /dev/zero or a symlink to another user's data the moment the submit returns.
#ifndef FITRUN_SERVER_CORE_SPECS_SPEC_FILES_H_
#define FITRUN_SERVER_CORE_SPECS_SPEC_FILES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fitrun::server {

// A spec's file, open for reading. Not copyable; closes on destruction.
class SpecFile {
 public:
  // Opens `path` non-blocking: NOT_FOUND when missing, INVALID_ARGUMENT (saying what it is) when it
  // is not a regular file or lies on /proc or /sys. Messages name the path, not a field.
  static absl::StatusOr<SpecFile> Open(const std::string& path);
  SpecFile(SpecFile&& other) noexcept;
  SpecFile& operator=(SpecFile&&) = delete;
  ~SpecFile();

  int fd() const { return fd_; }
  // As opened: later writes to the file are not read past this size.
  int64_t size() const { return size_; }
  // "<path>@<mtime ns>:<size>": the version recorded in SpecFileFacts.versions.
  const std::string& version() const { return version_; }

 private:
  SpecFile(int fd, int64_t size, std::string version) : fd_(fd), size_(size), version_(std::move(version)) {}
  int fd_ = -1;
  int64_t size_ = 0;
  std::string version_;
};

// What sizes a ratings workload: its distinct items and the users with 3 or more ratings, read from
// a MovieLens-1M style file (user::item::rating::timestamp per line). INVALID_ARGUMENT naming the
// line for anything else; bounded: lines of at most 4 KiB, files of at most kMaxRatingsFileBytes
// with at most kMaxRatingsIds items and as many users.
struct RatingsCounts {
  int64_t items = 0;
  int64_t trainable_users = 0;
};
inline constexpr int64_t kMaxRatingsFileBytes = int64_t{1} << 30;
inline constexpr size_t kMaxRatingsIds = 10'000'000;
absl::StatusOr<RatingsCounts> CountRatings(const SpecFile& file, const std::string& path);

// The header of a gzipped IDX file (Fashion-MNIST's train-images-idx3-ubyte.gz and the like): its
// element type code (0x08: unsigned bytes) and dimensions, the first being the item count. Only the
// header is inflated, from at most the file's first 64 KiB; INVALID_ARGUMENT naming the path when the
// file is not gzip or its header is not IDX's.
struct IdxHeader {
  int type_code = 0;
  std::vector<int64_t> dims;
};
absl::StatusOr<IdxHeader> ReadGzippedIdxHeader(const SpecFile& file, const std::string& path);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_SPECS_SPEC_FILES_H_
