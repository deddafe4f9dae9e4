// Fuzz target: the worker's dataset readers on one file each: the first byte picks the reader (an
// IDX file, a MovieLens ratings file, a text file's windows), the rest is the file.
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/fuzz_input.h"
#include "worker/data/idx.h"
#include "worker/data/movielens.h"
#include "worker/data/text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string path = fitrun::fuzz::WriteInput(data + 1, size - 1, "input");
  switch (data[0] % 3) {
    case 0:
      for (int dims : {1, 3}) (void)fitrun::worker::ReadIdxFile(path, dims);
      break;
    case 1:
      (void)fitrun::worker::LoadMovieLens(path, 8, 1);
      break;
    default:
      for (auto split : {fitrun::worker::Split::kTrain, fitrun::worker::Split::kTest}) {
        (void)fitrun::worker::LoadTextWindows(path, 16, split);
      }
  }
  return 0;
}
