#include "proto/contract/testing/temp_dir.h"

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace fitrun::contract {

TempDir::TempDir(std::string_view prefix, std::string_view parent) {
  std::string base(parent);
  if (base.empty()) {
    const char* test_tmpdir = std::getenv("TEST_TMPDIR");
    base = test_tmpdir != nullptr && *test_tmpdir != '\0' ? test_tmpdir : "/tmp";
  }
  const std::string pattern = base + "/" + std::string(prefix) + "XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (mkdtemp(buffer.data()) != nullptr) path_ = buffer.data();
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  std::error_code ignored;  // a test that already failed may leave what cannot be removed; no second failure
  std::filesystem::remove_all(path_, ignored);
}

std::string TempDir::Join(std::string_view name) const { return path_ + "/" + std::string(name); }

}  // namespace fitrun::contract
