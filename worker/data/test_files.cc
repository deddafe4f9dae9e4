#include "worker/data/test_files.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/contract/log.h"

namespace fitrun::worker::testing {

std::string IdxBytes(const std::vector<int32_t>& dims, const std::vector<uint8_t>& data) {
  std::string bytes = {0, 0, 0x08, static_cast<char>(dims.size())};
  for (int32_t d : dims) {
    bytes.push_back(static_cast<char>((d >> 24) & 0xff));
    bytes.push_back(static_cast<char>((d >> 16) & 0xff));
    bytes.push_back(static_cast<char>((d >> 8) & 0xff));
    bytes.push_back(static_cast<char>(d & 0xff));
  }
  bytes.append(data.begin(), data.end());
  return bytes;
}

void WriteGz(const std::string& path, const std::string& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  if (file == nullptr || gzwrite(file, bytes.data(), bytes.size()) != static_cast<int>(bytes.size()) ||
      gzclose(file) != Z_OK) {
    contract::LogError("cannot write %s", path);
    std::abort();
  }
}

std::string MakeTempDir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(root != nullptr ? root : "/tmp", "/", name);
  mkdir(dir.c_str(), 0755);
  return dir;
}

void WriteFakeFashionMnist(const std::string& dir, int train, int test) {
  for (const auto& [prefix, n] : {std::pair<std::string, int>{"train", train}, {"t10k", test}}) {
    std::vector<uint8_t> pixels(static_cast<size_t>(n) * 28 * 28);
    std::vector<uint8_t> labels(n);
    for (int i = 0; i < n; ++i) {
      labels[i] = static_cast<uint8_t>(i % 10);
      // Class c lights up row block c; the rest is a faint, index-dependent background.
      for (int p = 0; p < 28 * 28; ++p) {
        const int row = p / 28;
        const bool lit = row / 3 == labels[i];
        pixels[static_cast<size_t>(i) * 784 + p] = lit ? 200 : static_cast<uint8_t>((i * 7 + p) % 40);
      }
    }
    WriteGz(absl::StrCat(dir, "/", prefix, "-images-idx3-ubyte.gz"), IdxBytes({n, 28, 28}, pixels));
    WriteGz(absl::StrCat(dir, "/", prefix, "-labels-idx1-ubyte.gz"), IdxBytes({n}, labels));
  }
}

}  // namespace fitrun::worker::testing
