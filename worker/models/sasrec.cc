#include "worker/models/sasrec.h"

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

#include "absl/strings/str_cat.h"
#include "worker/models/attention.h"
#include "worker/models/ranking.h"
#include "worker/models/recompute.h"

namespace fitrun::worker {
namespace {

namespace F = torch::nn::functional;

// Redraws of a negative that collides with the row's own items; what still collides after this many
// rounds (rare unless a user has seen most items) stays, as a slightly noisy negative.
constexpr int kNegativeRedraws = 4;

class SasRecBlock final : public torch::nn::Module {
 public:
  SasRecBlock(int64_t hidden, int64_t heads)
      : heads_(heads),
        attention_norm_(register_module("attention_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})))),
        query_(register_module("query", torch::nn::Linear(hidden, hidden))),
        key_(register_module("key", torch::nn::Linear(hidden, hidden))),
        value_(register_module("value", torch::nn::Linear(hidden, hidden))),
        out_(register_module("out", torch::nn::Linear(hidden, hidden))),
        forward_norm_(register_module("forward_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})))),
        conv1_(register_module("conv1", torch::nn::Linear(hidden, hidden))),
        conv2_(register_module("conv2", torch::nn::Linear(hidden, hidden))) {}

  // `keep` [B, T, 1] is 1 at real items and 0 at padding.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& keep) {
    const at::Tensor q = attention_norm_->forward(x);
    at::Tensor h = q + out_->forward(CausalAttention(query_->forward(q), key_->forward(x), value_->forward(x), heads_));
    h = forward_norm_->forward(h);
    h = h + conv2_->forward(F::relu(conv1_->forward(h)));
    return h * keep;
  }

 private:
  int64_t heads_;
  torch::nn::LayerNorm attention_norm_;
  torch::nn::Linear query_;
  torch::nn::Linear key_;
  torch::nn::Linear value_;
  torch::nn::Linear out_;
  torch::nn::LayerNorm forward_norm_;
  torch::nn::Linear conv1_;
  torch::nn::Linear conv2_;
};

class SasRec final : public Model {
 public:
  SasRec(const fitrun::v1::SasRecConfig& config, int64_t num_items)
      : Model("SasRec"),
        num_items_(num_items),
        hidden_(config.hidden()),
        recompute_blocks_(config.activation_checkpointing()),
        item_embedding_(register_module(
            "item_embedding", torch::nn::Embedding(torch::nn::EmbeddingOptions(num_items + 1, config.hidden()).padding_idx(0)))),
        position_embedding_(register_module("position_embedding", torch::nn::Embedding(config.max_len(), config.hidden()))),
        blocks_(register_module("blocks", torch::nn::ModuleList())),
        final_norm_(register_module("final_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.hidden()})))) {
    for (int i = 0; i < config.blocks(); ++i) {
      blocks_->push_back(std::make_shared<SasRecBlock>(config.hidden(), config.heads()));
    }
    // Xavier-normal weights as the authors' code; the padding item stays zero.
    torch::NoGradGuard no_grad;
    for (auto& p : named_parameters()) {
      if (p.value().dim() == 2) torch::nn::init::xavier_normal_(p.value());
    }
    item_embedding_->weight[0].zero_();
  }

  at::Tensor Forward(const ModelInputs& inputs) override {
    const at::Tensor last = Features(inputs.at(0)).select(1, -1);  // [B, hidden]
    return at::matmul(last, item_embedding_->weight.t());
  }

  at::Tensor Loss(const ModelInputs& model_inputs, const at::Tensor& positives) override {
    const at::Tensor& inputs = model_inputs.at(0);
    const at::Tensor features = Features(inputs);
    at::Tensor negatives;
    {
      at::NoGradGuard no_grad;
      const at::Tensor own = at::cat({inputs, positives}, 1).unsqueeze(1);  // [B, 1, 2T]
      negatives = at::randint(1, num_items_ + 1, positives.sizes(), positives.options());
      for (int round = 0; round < kNegativeRedraws; ++round) {
        const at::Tensor collides = negatives.unsqueeze(2).eq(own).any(2);
        if (!collides.any().item<bool>()) break;
        negatives = at::where(collides, at::randint(1, num_items_ + 1, positives.sizes(), positives.options()), negatives);
      }
    }
    const at::Tensor positive_logits = (features * item_embedding_->forward(positives)).sum(-1);
    const at::Tensor negative_logits = (features * item_embedding_->forward(negatives)).sum(-1);
    const at::Tensor real = positives.ne(0).to(at::kFloat);
    const at::Tensor per_position =
        F::binary_cross_entropy_with_logits(positive_logits, at::ones_like(positive_logits),
                                            F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kNone)) +
        F::binary_cross_entropy_with_logits(negative_logits, at::zeros_like(negative_logits),
                                            F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kNone));
    return (per_position * real).sum() / real.sum().clamp_min(1);
  }

  absl::StatusOr<Evaluation> Evaluate(const TensorDataset& test, int64_t batch) override {
    if (test.size() == 0) return absl::InvalidArgumentError("empty evaluation set (no user has 100 unseen items)");
    RankingAt10 ranking;
    absl::Status evaluated = ForEachTestBatch(test, batch, [&](const TensorDataset& rows) {
      const at::Tensor last = Features(rows.inputs.at(0)).select(1, -1);   // [n, hidden]
      const at::Tensor candidates = item_embedding_->forward(rows.targets);  // [n, 101, hidden]
      ranking.Add((candidates * last.unsqueeze(1)).sum(-1));
    });
    if (!evaluated.ok()) return evaluated;
    return ranking.Result();
  }

 private:
  // Per-position outputs [B, T, hidden] for item sequences [B, T].
  at::Tensor Features(const at::Tensor& input) {
    const at::Tensor items = input.to(at::kLong);
    const at::Tensor keep = items.ne(0).unsqueeze(-1).to(at::kFloat);
    at::Tensor x = item_embedding_->forward(items) * std::sqrt(static_cast<double>(hidden_)) +
                   position_embedding_->forward(at::arange(items.size(1), items.options()));
    x = x * keep;
    // Recomputed only where backward will follow: evaluation keeps nothing for backward anyway.
    const bool recompute = recompute_blocks_ && is_training() && at::GradMode::is_enabled();
    for (const std::shared_ptr<torch::nn::Module>& module : *blocks_) {
      SasRecBlock* block = static_cast<SasRecBlock*>(module.get());
      x = recompute ? RecomputedInBackward([block, keep](const at::Tensor& in) { return block->forward(in, keep); }, x)
                    : block->forward(x, keep);
    }
    return final_norm_->forward(x);
  }

  int64_t num_items_;
  int64_t hidden_;
  // spec.model.sasrec.activation_checkpointing: each block's activations recomputed in backward.
  bool recompute_blocks_;
  torch::nn::Embedding item_embedding_;
  torch::nn::Embedding position_embedding_;
  torch::nn::ModuleList blocks_;
  torch::nn::LayerNorm final_norm_;
};

}  // namespace

absl::Status ValidateSasRecConfig(const fitrun::v1::SasRecConfig& c) {
  for (const auto& [field, value] : {std::pair<const char*, int32_t>{"max_len", c.max_len()},
                                     {"hidden", c.hidden()},
                                     {"blocks", c.blocks()},
                                     {"heads", c.heads()}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat("spec.model.sasrec.", field, ": must be >= 1 (got ", value, ")"));
    }
  }
  if (c.hidden() % c.heads() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("spec.model.sasrec.heads: must divide hidden (", c.hidden(),
                                                   " is not a multiple of ", c.heads(), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Model>> CreateSasRec(const fitrun::v1::SasRecConfig& config, int64_t num_items,
                                                    uint64_t seed) {
  if (absl::Status s = ValidateSasRecConfig(config); !s.ok()) return s;
  if (num_items < 1) return absl::InvalidArgumentError("sasrec needs at least one item");
  torch::manual_seed(seed);
  return std::make_shared<SasRec>(config, num_items);
}

}  // namespace fitrun::worker
