#include "server/core/specs/workload_profiles.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "proto/contract/data_contract.h"
#include "proto/contract/model_shapes.h"

namespace fitrun::server {
namespace {

constexpr int64_t kFloat = 4;
constexpr int64_t kByteVocabulary = 256;
constexpr int64_t kFashionMnistTrainSamples = 60000;
constexpr int64_t kFashionMnistSampleBytes = 28 * 28 * kFloat + 8;  // image + int64 label

int64_t Linear(int64_t in, int64_t out) { return in * out + out; }
int64_t Conv(int64_t in, int64_t out, int64_t k) { return in * out * k * k + out; }

// Bytes one transformer layer keeps per sample for backward: s*h*(34 + 5*a*s/h) in 16-bit
// (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", without
// dropout masks counted separately), doubled for fp32.
int64_t TransformerLayerActivationBytes(int64_t s, int64_t h, int64_t a) {
  return 2 * (s * h * 34 + 5 * a * s * s);
}

// What recomputing the blocks' activations adds to one sample's forward and backward: the blocks'
// forward (2 FLOPs per weight per token, and 4*s*h for attention's scores and sums) over the whole
// step's, about three forwards (backward is two: gradients of inputs and of weights).
double RecomputeShare(int64_t block_flops_per_token, int64_t other_flops_per_token) {
  return static_cast<double>(block_flops_per_token) /
         (3.0 * static_cast<double>(block_flops_per_token + other_flops_per_token));
}

// The gpt's parameters and activations over `vocabulary` tokens: the layers', plus the embedding
// sum and the logits with their log-softmax and gradient. With activation checkpointing a layer keeps
// only its input, and backward holds one layer's activations at a time, recomputed.
ModelProfile GptWithVocabulary(const fitrun::v1::GptConfig& c, int64_t vocabulary) {
  const int64_t h = c.hidden();
  const int64_t s = c.context();
  ModelProfile p;
  p.parameter_count = vocabulary * h + s * h + c.layers() * (12 * h * h + 13 * h) + 2 * h + (c.tied_head() ? 0 : vocabulary * h);
  const int64_t layer = TransformerLayerActivationBytes(s, h, c.heads());
  const int64_t layers = c.activation_checkpointing() ? c.layers() * s * h * kFloat + layer : c.layers() * layer;
  p.activation_bytes_per_sample = layers + 2 * s * h * kFloat + 3 * s * vocabulary * kFloat;
  p.activation_checkpointing = c.activation_checkpointing();
  p.recompute_share = RecomputeShare(c.layers() * (2 * 12 * h * h + 4 * s * h), 2 * vocabulary * h);
  return p;
}

// The facts a profile needs, read from the spec's files at submit (JobSpec.file_facts); a spec
// without them (never admitted) cannot be profiled.
absl::Status MissingFacts(const std::string& field, const std::string& what) {
  return absl::FailedPreconditionError(absl::StrCat(
      field, ": ", what, " was not read at submit (spec.file_facts is empty); submit the spec to fitrund"));
}

}  // namespace

// mlp: 784-512-512-10 with ReLU (proto/contract/model_shapes.h). Autograd saves each Linear's input
// and each ReLU's output; backward holds one activation-gradient per layer at a time, counted as the
// widest layer twice.
ModelProfile MlpProfile() {
  namespace shapes = fitrun::contract::models;
  ModelProfile p;
  p.parameter_count = Linear(shapes::kImagePixels, shapes::kMlpHidden) + Linear(shapes::kMlpHidden, shapes::kMlpHidden) +
                      Linear(shapes::kMlpHidden, shapes::kClasses);
  // Inputs, pre and post ReLU of both hidden layers, logits, softmax.
  const int64_t saved = shapes::kImagePixels + 4 * shapes::kMlpHidden + 2 * shapes::kClasses;
  const int64_t backward_transient = 2 * shapes::kImagePixels;
  p.activation_bytes_per_sample = (saved + backward_transient) * kFloat;
  p.input_bytes_per_sample = kFashionMnistSampleBytes;
  p.train_samples = kFashionMnistTrainSamples;
  return p;
}

// cnn: conv 1->32 3x3, conv 32->64 3x3, max-pool 2, fc 9216->128, fc 128->10
// (proto/contract/model_shapes.h).
ModelProfile CnnProfile() {
  namespace shapes = fitrun::contract::models;
  ModelProfile p;
  p.parameter_count = Conv(1, shapes::kCnnConv1Channels, shapes::kCnnKernel) +
                      Conv(shapes::kCnnConv1Channels, shapes::kCnnConv2Channels, shapes::kCnnKernel) +
                      Linear(shapes::kCnnFlattened, shapes::kCnnHidden) + Linear(shapes::kCnnHidden, shapes::kClasses);
  const int64_t conv1 = shapes::kCnnConv1Channels * shapes::kCnnConv1Side * shapes::kCnnConv1Side;
  const int64_t conv2 = shapes::kCnnConv2Channels * shapes::kCnnConv2Side * shapes::kCnnConv2Side;
  const int64_t pooled = shapes::kCnnFlattened;
  // conv outputs and their ReLUs, the pooled map (plus its int64 argmax indices), fc activations.
  const int64_t saved_floats =
      shapes::kImagePixels + 2 * conv1 + 2 * conv2 + pooled + 2 * shapes::kCnnHidden + 2 * shapes::kClasses;
  const int64_t saved_bytes = saved_floats * kFloat + pooled * 8;
  // Backward materialises the gradient of the widest activations (conv2 and conv1) at once.
  const int64_t backward_transient = (conv2 + conv1) * kFloat;
  p.activation_bytes_per_sample = saved_bytes + backward_transient;
  p.input_bytes_per_sample = kFashionMnistSampleBytes;
  p.train_samples = kFashionMnistTrainSamples;
  return p;
}

absl::StatusOr<ModelProfile> OnFashionMnist(ModelProfile profile, const fitrun::v1::JobSpec& spec) {
  const int64_t images = spec.file_facts().image_samples();
  if (images <= 0) return MissingFacts("spec.data.path", "the training images' count");
  profile.train_samples = images;
  return profile;
}

// gpt: see worker/models/gpt.h. Parameters as GptParameterCount there; activations are the layers'
// plus the embedding sum and the 256-way logits with their log-softmax and gradient.
absl::StatusOr<ModelProfile> GptProfile(const fitrun::v1::JobSpec& spec) {
  const int64_t s = spec.model().gpt().context();
  ModelProfile p = GptWithVocabulary(spec.model().gpt(), kByteVocabulary);
  p.input_bytes_per_sample = 2 * s;  // uint8 window and its shifted targets
  // As worker/data/text.h: windows of context + 1 bytes every context bytes over the first 90%.
  const int64_t bytes = spec.file_facts().data_bytes();
  if (bytes <= 0) return MissingFacts("spec.data.path", "the text file's size");
  const int64_t train_bytes = bytes * 9 / 10;
  p.train_samples = train_bytes < 1 ? 0 : (train_bytes - 1) / s;
  return p;
}

// sasrec: see worker/models/sasrec.h; sized by its ratings file (its items and trainable users).
absl::StatusOr<ModelProfile> SasRecProfile(const fitrun::v1::JobSpec& spec) {
  const fitrun::v1::SpecFileFacts& ratings = spec.file_facts();
  if (ratings.ratings_trainable_users() <= 0) return MissingFacts("spec.data.path", "the ratings file's counts");
  const fitrun::v1::SasRecConfig& c = spec.model().sasrec();
  const int64_t d = c.hidden();
  const int64_t s = c.max_len();
  ModelProfile p;
  p.parameter_count = (ratings.ratings_items() + 1) * d + s * d + c.blocks() * (6 * d * d + 10 * d) + 2 * d;
  // The blocks (with activation checkpointing each keeps its input, and backward holds one block's
  // activations at a time, recomputed), plus the sequence, positive and negative embeddings and their
  // gradients.
  const int64_t layer = TransformerLayerActivationBytes(s, d, c.heads());
  const int64_t blocks = c.activation_checkpointing() ? c.blocks() * s * d * kFloat + layer : c.blocks() * layer;
  p.activation_bytes_per_sample = blocks + 6 * s * d * kFloat;
  p.activation_checkpointing = c.activation_checkpointing();
  // Its logits are dot products with one next and one negative item per position.
  p.recompute_share = RecomputeShare(c.blocks() * (2 * 6 * d * d + 4 * s * d), 4 * d);
  p.input_bytes_per_sample = 2 * s * 8;  // int64 item sequence and next items
  p.train_samples = ratings.ratings_trainable_users();
  return p;
}

// The gpt recommender (worker/models/gpt.h, CreateGptRecommender): the gpt over a vocabulary of the
// ratings file's items plus padding, one sample per user with 3 or more ratings.
absl::StatusOr<ModelProfile> GptRecommenderProfile(const fitrun::v1::JobSpec& spec) {
  const fitrun::v1::SpecFileFacts& ratings = spec.file_facts();
  if (ratings.ratings_trainable_users() <= 0) return MissingFacts("spec.data.path", "the ratings file's counts");
  ModelProfile p = GptWithVocabulary(spec.model().gpt(), ratings.ratings_items() + 1);
  p.input_bytes_per_sample = 2 * int64_t{spec.model().gpt().context()} * 8;  // int64 items and next items
  p.train_samples = ratings.ratings_trainable_users();
  return p;
}

// A TorchScript model on a tensors file: parameters bounded by the module file's size, samples and
// their bytes from the tensors file's header. Its activations are unknown without running it, so
// they are guessed generously (64x a sample's bytes, at least the cnn's): the probe measures the
// workload before any of its plans launches.
absl::StatusOr<ModelProfile> TorchScriptOnTensorsProfile(const fitrun::v1::JobSpec& spec) {
  absl::StatusOr<ModelProfile> p = TorchScriptProfile(spec);
  if (!p.ok()) return p.status();
  const int64_t n = spec.file_facts().tensor_samples();
  const int64_t sample_bytes = spec.file_facts().tensor_sample_bytes();
  if (n <= 0) return MissingFacts("spec.data.path", "the tensors file's shapes");
  p->input_bytes_per_sample = sample_bytes;
  p->activation_bytes_per_sample = std::max(p->activation_bytes_per_sample, 64 * sample_bytes);
  p->train_samples = spec.data().test_path().empty()
                         ? n - fitrun::contract::data::TestSamples(n, spec.data().has_test_fraction()
                                                                     ? spec.data().test_fraction()
                                                                     : fitrun::contract::data::kDefaultTestFraction)
                         : n;
  p->memory_source = "analytic: parameters bounded by the TorchScript file's size, activations guessed as 64x a "
                     "sample's bytes (the probe measures them)";
  return p;
}

// A TorchScript file cannot be read here without LibTorch. Its parameters are stored uncompressed
// in the file's zip archive beside small code and pickle entries, so size / 4 bounds the float32
// parameter count from above; activations are unknown and taken as the builtin cnn's.
absl::StatusOr<ModelProfile> TorchScriptProfile(const fitrun::v1::JobSpec& spec) {
  const int64_t bytes = spec.file_facts().torchscript_bytes();
  if (bytes <= 0) return MissingFacts("spec.model.torchscript", "the TorchScript file's size");
  ModelProfile p = CnnProfile();
  p.parameter_count = bytes / kFloat;
  p.memory_source = "analytic: parameters bounded by the TorchScript file's size, activations taken as the cnn's";
  return p;
}

}  // namespace fitrun::server
