#include "worker/models/gpt.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/utils.h>

#include <cmath>
#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/models/attention.h"
#include "worker/models/ranking.h"
#include "worker/models/recompute.h"

namespace fitrun::worker {
namespace {

namespace F = torch::nn::functional;

// GPT-2's initialisation: N(0, 0.02) weights, zero biases.
constexpr double kInitStd = 0.02;

void InitLinear(torch::nn::Linear& linear) {
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(linear->weight, 0.0, kInitStd);
  if (linear->bias.defined()) torch::nn::init::zeros_(linear->bias);
}

class Block final : public torch::nn::Module {
 public:
  Block(int64_t hidden, int64_t heads)
      : heads_(heads),
        ln1_(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})))),
        qkv_(register_module("qkv", torch::nn::Linear(hidden, 3 * hidden))),
        proj_(register_module("proj", torch::nn::Linear(hidden, hidden))),
        ln2_(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})))),
        fc_(register_module("fc", torch::nn::Linear(hidden, 4 * hidden))),
        fc_proj_(register_module("fc_proj", torch::nn::Linear(4 * hidden, hidden))) {
    for (torch::nn::Linear* linear : {&qkv_, &proj_, &fc_, &fc_proj_}) InitLinear(*linear);
  }

  at::Tensor forward(const at::Tensor& x) {
    const std::vector<at::Tensor> qkv = qkv_->forward(ln1_->forward(x)).chunk(3, -1);
    at::Tensor h = x + proj_->forward(CausalAttention(qkv[0], qkv[1], qkv[2], heads_));
    return h + fc_proj_->forward(F::gelu(fc_->forward(ln2_->forward(h))));
  }

 private:
  int64_t heads_;
  torch::nn::LayerNorm ln1_;
  torch::nn::Linear qkv_;
  torch::nn::Linear proj_;
  torch::nn::LayerNorm ln2_;
  torch::nn::Linear fc_;
  torch::nn::Linear fc_proj_;
};

// A language model over `vocabulary` tokens: bytes (the text workload), or the items of a ratings
// file with 0 as padding (the recommender, whose loss skips padded positions and whose evaluation
// ranks each user's held-out item).
class Gpt final : public Model {
 public:
  enum class Task { kBytes, kNextItem };

  Gpt(const fitrun::v1::GptConfig& config, int64_t vocabulary, Task task)
      : Model("Gpt"),
        context_(config.context()),
        vocabulary_(vocabulary),
        task_(task),
        tied_head_(config.tied_head()),
        recompute_blocks_(config.activation_checkpointing()),
        token_embedding_(register_module("token_embedding", torch::nn::Embedding(vocabulary, config.hidden()))),
        position_embedding_(register_module("position_embedding", torch::nn::Embedding(config.context(), config.hidden()))),
        blocks_(register_module("blocks", torch::nn::ModuleList())),
        final_norm_(register_module("final_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.hidden()})))) {
    for (int i = 0; i < config.layers(); ++i) {
      blocks_->push_back(std::make_shared<Block>(config.hidden(), config.heads()));
    }
    if (!tied_head_) {
      head_ = register_module(
          "head", torch::nn::Linear(torch::nn::LinearOptions(config.hidden(), vocabulary).bias(false)));
      InitLinear(head_);
    }
    torch::NoGradGuard no_grad;
    torch::nn::init::normal_(token_embedding_->weight, 0.0, kInitStd);
    torch::nn::init::normal_(position_embedding_->weight, 0.0, kInitStd);
  }

  at::Tensor Forward(const ModelInputs& inputs) override {
    const at::Tensor tokens = inputs.at(0).to(at::kLong);
    const int64_t time = tokens.size(1);
    TORCH_CHECK(time <= context_, "gpt: a window of ", time, " bytes is longer than the context ", context_);
    at::Tensor x = token_embedding_->forward(tokens) +
                   position_embedding_->forward(at::arange(time, tokens.options()));
    // Recomputed only where backward will follow: evaluation keeps nothing for backward anyway.
    const bool recompute = recompute_blocks_ && is_training() && at::GradMode::is_enabled();
    for (const std::shared_ptr<torch::nn::Module>& module : *blocks_) {
      Block* block = static_cast<Block*>(module.get());
      x = recompute ? RecomputedInBackward([block](const at::Tensor& in) { return block->forward(in); }, x)
                    : block->forward(x);
    }
    x = final_norm_->forward(x);
    return tied_head_ ? at::matmul(x, token_embedding_->weight.t()) : head_->forward(x);
  }

  at::Tensor Loss(const ModelInputs& inputs, const at::Tensor& targets) override {
    // The recommender's padded positions (target item 0) predict nothing.
    return F::cross_entropy(Forward(inputs).reshape({-1, vocabulary_}), targets.to(at::kLong).reshape({-1}),
                            F::CrossEntropyFuncOptions().ignore_index(task_ == Task::kNextItem ? 0 : -100));
  }

  absl::StatusOr<Evaluation> Evaluate(const TensorDataset& test, int64_t batch) override {
    if (task_ == Task::kNextItem) return EvaluateRanking(test, batch);
    double loss_sum = 0;  // summed over windows; every window has the same number of bytes
    absl::Status evaluated = ForEachTestBatch(test, batch, [&](const TensorDataset& rows) {
      loss_sum += Loss(rows.inputs, rows.targets).item<double>() * rows.size();
    });
    if (!evaluated.ok()) return evaluated;
    const double loss = loss_sum / test.size();
    Evaluation evaluation;
    evaluation.metrics["test_loss"] = loss;
    evaluation.summary = absl::StrCat("test loss ", loss, " nats/byte (", loss / std::log(2.0), " bits/byte) over ",
                                      test.size(), " windows of ", test.inputs.at(0).size(1), " bytes");
    return evaluation;
  }

 private:
  // Each user's held-out item (targets column 0) against its negatives, scored by the next-item
  // logits at the last position of its history.
  absl::StatusOr<Evaluation> EvaluateRanking(const TensorDataset& test, int64_t batch) {
    RankingAt10 ranking;
    absl::Status evaluated = ForEachTestBatch(test, batch, [&](const TensorDataset& rows) {
      const at::Tensor last = Forward(rows.inputs).select(1, -1);  // [n, vocabulary]
      ranking.Add(last.gather(1, rows.targets.to(at::kLong)));
    });
    if (!evaluated.ok()) return evaluated;
    return ranking.Result();
  }

  int64_t context_;
  int64_t vocabulary_;
  Task task_;
  bool tied_head_;
  // spec.model.gpt.activation_checkpointing: each block's activations recomputed in backward.
  bool recompute_blocks_;
  torch::nn::Embedding token_embedding_;
  torch::nn::Embedding position_embedding_;
  torch::nn::ModuleList blocks_;
  torch::nn::LayerNorm final_norm_;
  torch::nn::Linear head_{nullptr};
};

}  // namespace

absl::Status ValidateGptConfig(const fitrun::v1::GptConfig& c) {
  auto positive = [](const char* field, int32_t value) -> absl::Status {
    if (value >= 1) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("spec.model.gpt.", field, ": must be >= 1 (got ", value, ")"));
  };
  for (const auto& [field, value] : {std::pair<const char*, int32_t>{"layers", c.layers()},
                                     {"heads", c.heads()},
                                     {"hidden", c.hidden()},
                                     {"context", c.context()}}) {
    if (absl::Status s = positive(field, value); !s.ok()) return s;
  }
  if (c.hidden() % c.heads() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("spec.model.gpt.heads: must divide hidden (", c.hidden(),
                                                   " is not a multiple of ", c.heads(), ")"));
  }
  return absl::OkStatus();
}

int64_t GptParameterCount(const fitrun::v1::GptConfig& c, int64_t vocabulary) {
  const int64_t h = c.hidden();
  const int64_t embeddings = vocabulary * h + int64_t{c.context()} * h;
  const int64_t per_block = 12 * h * h + 13 * h;
  const int64_t head = c.tied_head() ? 0 : vocabulary * h;
  return embeddings + c.layers() * per_block + 2 * h + head;
}

absl::StatusOr<std::shared_ptr<Model>> CreateGpt(const fitrun::v1::GptConfig& config, uint64_t seed) {
  if (absl::Status s = ValidateGptConfig(config); !s.ok()) return s;
  torch::manual_seed(seed);
  return std::make_shared<Gpt>(config, kByteVocabulary, Gpt::Task::kBytes);
}

absl::StatusOr<std::shared_ptr<Model>> CreateGptRecommender(const fitrun::v1::GptConfig& config, int64_t num_items,
                                                            uint64_t seed) {
  if (absl::Status s = ValidateGptConfig(config); !s.ok()) return s;
  if (num_items < 1) return absl::InvalidArgumentError("spec.data.path: the ratings file has no items");
  torch::manual_seed(seed);
  return std::make_shared<Gpt>(config, num_items + 1, Gpt::Task::kNextItem);
}

}  // namespace fitrun::worker
