#ifndef FITRUN_WORKER_DATA_TEST_FILES_H_
#define FITRUN_WORKER_DATA_TEST_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace fitrun::worker::testing {

// The bytes of an IDX file of unsigned bytes: header (magic, dimensions) followed by `data`.
std::string IdxBytes(const std::vector<int32_t>& dims, const std::vector<uint8_t>& data);

// Writes `bytes` gzip-compressed to `path`; aborts the test binary on failure.
void WriteGz(const std::string& path, const std::string& bytes);

// A fresh directory under the test's temporary directory.
std::string MakeTempDir(const std::string& name);

// Writes the four Fashion-MNIST files into `dir` with `train` and `test` images of 28x28 pixels;
// pixel values and labels follow a simple pattern a model can learn.
void WriteFakeFashionMnist(const std::string& dir, int train, int test);

}  // namespace fitrun::worker::testing

#endif  // FITRUN_WORKER_DATA_TEST_FILES_H_
