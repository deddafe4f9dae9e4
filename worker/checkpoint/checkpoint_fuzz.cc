// Fuzz target: a damaged checkpoint as the worker loads it at resume, into a small model and its
// optimizer. The input edits a valid checkpoint of that model (saved once): its first 4 bytes say
// where to cut the file, every 3 bytes after that overwrite one byte (a 2-byte offset, a value). A
// file that does not load must be an error, never a crash: the store's checksum refuses a damaged
// file before LibTorch's reader (which can crash on one) sees it.
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>

#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include "tests/fuzz/fuzz_input.h"
#include "worker/checkpoint/checkpoint_store.h"

namespace {

struct Fixture {
  std::unique_ptr<fitrun::worker::CheckpointStore> store;
  std::string valid;  // the bytes of a checkpoint of step 1
};

Fixture* MakeFixture() {
  auto store = fitrun::worker::CheckpointStore::Create({fitrun::fuzz::InputDir() + "/checkpoints", 2});
  if (!store.ok()) return nullptr;
  torch::nn::Linear model(4, 3);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
  model->forward(torch::ones({2, 4})).sum().backward();
  optimizer.step();  // so the optimizer has state to save
  if (!(*store)->Save({1, 0, 1}, *model, optimizer).ok()) return nullptr;
  std::ifstream in((*store)->PathFor(1), std::ios::binary);
  auto* fixture = new Fixture{*std::move(store), std::string(std::istreambuf_iterator<char>(in), {})};
  return fixture;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* fixture = MakeFixture();
  if (fixture == nullptr || size < 4) return 0;
  std::string file = fixture->valid;
  const uint32_t cut = static_cast<uint32_t>(data[0]) | data[1] << 8 | data[2] << 16 |
                       static_cast<uint32_t>(data[3]) << 24;
  file.resize(cut % (file.size() + 1));
  for (size_t i = 4; i + 3 <= size && !file.empty(); i += 3) {
    file[(data[i] | data[i + 1] << 8) % file.size()] = static_cast<char>(data[i + 2]);
  }
  std::ofstream(fixture->store->PathFor(1), std::ios::binary | std::ios::trunc)
      .write(file.data(), static_cast<std::streamsize>(file.size()));
  torch::nn::Linear model(4, 3);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
  (void)fixture->store->Load(1, *model, optimizer);
  return 0;
}
