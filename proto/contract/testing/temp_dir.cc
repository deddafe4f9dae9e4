#include "proto/contract/testing/temp_dir.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace fitrun::contract {

namespace {

int RemoveOne(const char* path, const struct stat*, int, struct FTW*) {
  (void)remove(path);  // what cannot be removed stays; the walk goes on
  return 0;
}

}  // namespace

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
  // Depth first, never through a symlink. Not std::filesystem::remove_all: pip's libtorch.so exports
  // its own copy of it, which a worker test linked against that LibTorch resolves and crashes in. A
  // test that already failed may leave what cannot be removed; that is no second failure.
  (void)nftw(path_.c_str(), RemoveOne, 16, FTW_DEPTH | FTW_PHYS);
}

std::string TempDir::Join(std::string_view name) const { return path_ + "/" + std::string(name); }

std::string TempDir::Write(std::string_view name, std::string_view bytes) const {
  const std::string path = Join(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  return out ? path : "";
}

}  // namespace fitrun::contract
