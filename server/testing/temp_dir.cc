#include "server/testing/temp_dir.h"

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"

namespace fitrun::server {

TempDir::TempDir(absl::string_view prefix, absl::string_view parent) {
  std::string base(parent);
  if (base.empty()) {
    const char* test_tmpdir = std::getenv("TEST_TMPDIR");
    base = test_tmpdir != nullptr && *test_tmpdir != '\0' ? test_tmpdir : "/tmp";
  }
  const std::string pattern = absl::StrCat(base, "/", prefix, "XXXXXX");
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (mkdtemp(buffer.data()) != nullptr) path_ = buffer.data();
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  std::error_code ignored;  // a test that already failed may leave what cannot be removed; no second failure
  std::filesystem::remove_all(path_, ignored);
}

std::string TempDir::Join(absl::string_view name) const { return absl::StrCat(path_, "/", name); }

}  // namespace fitrun::server
