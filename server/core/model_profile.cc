#include "server/core/model_profile.h"

#include "absl/strings/str_cat.h"

namespace fitrun::server {
namespace {

constexpr int64_t kFloat = 4;
constexpr int64_t kFashionMnistTrainSamples = 60000;
constexpr int64_t kFashionMnistSampleBytes = 28 * 28 * kFloat + 8;  // image + int64 label

int64_t Linear(int64_t in, int64_t out) { return in * out + out; }
int64_t Conv(int64_t in, int64_t out, int64_t k) { return in * out * k * k + out; }

// mlp: 784-512-512-10 with ReLU. Autograd saves each Linear's input and each ReLU's output; backward
// holds one activation-gradient per layer at a time, counted as the widest layer twice.
ModelProfile Mlp() {
  ModelProfile p;
  p.parameter_count = Linear(784, 512) + Linear(512, 512) + Linear(512, 10);
  const int64_t saved = 784 + 512 + 512 + 512 + 512 + 10 + 10;  // inputs, pre/post ReLU, logits, softmax
  const int64_t backward_transient = 2 * 784;
  p.activation_bytes_per_sample = (saved + backward_transient) * kFloat;
  p.input_bytes_per_sample = kFashionMnistSampleBytes;
  p.train_samples = kFashionMnistTrainSamples;
  return p;
}

// cnn: conv 1->32 3x3, conv 32->64 3x3, max-pool 2, fc 9216->128, fc 128->10.
ModelProfile Cnn() {
  ModelProfile p;
  p.parameter_count = Conv(1, 32, 3) + Conv(32, 64, 3) + Linear(9216, 128) + Linear(128, 10);
  const int64_t conv1 = 32 * 26 * 26;
  const int64_t conv2 = 64 * 24 * 24;
  const int64_t pooled = 64 * 12 * 12;
  // conv outputs and their ReLUs, the pooled map (plus its int64 argmax indices), fc activations.
  const int64_t saved_floats = 784 + 2 * conv1 + 2 * conv2 + pooled + 2 * 128 + 2 * 10;
  const int64_t saved_bytes = saved_floats * kFloat + pooled * 8;
  // Backward materialises the gradient of the widest activations (conv2 and conv1) at once.
  const int64_t backward_transient = (conv2 + conv1) * kFloat;
  p.activation_bytes_per_sample = saved_bytes + backward_transient;
  p.input_bytes_per_sample = kFashionMnistSampleBytes;
  p.train_samples = kFashionMnistTrainSamples;
  return p;
}

}  // namespace

absl::StatusOr<ModelProfile> ProfileFor(const fitrun::v1::JobSpec& spec) {
  const std::string& builtin = spec.model().builtin();
  if (builtin == "mlp") return Mlp();
  if (builtin == "cnn") return Cnn();
  return absl::NotFoundError(absl::StrCat("spec.model.builtin: no memory profile for '", builtin, "'"));
}

}  // namespace fitrun::server
