// For fuzz targets whose code under test reads a file: the input, written to a file of this process's
// own under TEST_TMPDIR (or /tmp), rewritten for every input.
#ifndef FITRUN_TESTS_FUZZ_FUZZ_INPUT_H_
#define FITRUN_TESTS_FUZZ_FUZZ_INPUT_H_

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace fitrun::fuzz {

// The directory the inputs' files go to (created once).
inline const std::string& InputDir() {
  static const std::string* dir = [] {
    const char* tmp = std::getenv("TEST_TMPDIR");
    auto* path = new std::string(std::string(tmp != nullptr ? tmp : "/tmp") + "/fitrun-fuzz-" +
                                 std::to_string(getpid()));
    std::filesystem::create_directories(*path);
    return path;
  }();
  return *dir;
}

inline std::string WriteInput(const uint8_t* data, size_t size, const std::string& name) {
  const std::string path = InputDir() + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), size);
  return path;
}

}  // namespace fitrun::fuzz

#endif  // FITRUN_TESTS_FUZZ_FUZZ_INPUT_H_
