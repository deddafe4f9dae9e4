#ifndef FITRUN_WORKER_MODELS_GPT_H_
#define FITRUN_WORKER_MODELS_GPT_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fitrun/v1/job.pb.h"
#include "worker/models/model.h"

namespace fitrun::worker {

inline constexpr int64_t kByteVocabulary = 256;

// Checks a gpt config; errors name the field (spec.model.gpt.heads, ...).
absl::Status ValidateGptConfig(const fitrun::v1::GptConfig& config);

// Parameters of a gpt config over `vocabulary` tokens: embeddings, 12h^2 + 13h per block, the final
// LayerNorm and, untied, the output head. The coordinator's memory profile computes the same number.
int64_t GptParameterCount(const fitrun::v1::GptConfig& config, int64_t vocabulary = kByteVocabulary);

// A byte-level decoder-only transformer language model (GPT-2's layout at small sizes): byte and
// learned position embeddings, `layers` pre-LayerNorm blocks of causal self-attention and a 4x GELU
// MLP, a final LayerNorm and a 256-way head (tied to the byte embedding when config.tied_head).
// Dropout is left out so that runs with one seed are reproducible.
//
// Inputs are byte windows [B, T] (uint8 or int64, T <= context); Forward returns next-byte logits
// [B, T, 256]. Loss is the mean cross-entropy in nats per byte against targets [B, T] (the same
// windows shifted by one); Evaluate reports the test split's loss and has no accuracy.
absl::StatusOr<std::shared_ptr<Model>> CreateGpt(const fitrun::v1::GptConfig& config, uint64_t seed);

// The same transformer as a next-item recommender (the GPT-2 recommender of the users' guides):
// each user's time-ordered items are its tokens (a vocabulary of num_items + 1, 0 for padding).
// Batches are rows of MovieLensSplits (worker/data/movielens.h) with context as their max_len. Loss:
// cross-entropy of the next item at every non-padding position; Evaluate ranks each held-out item
// among its 100 negatives by the last position's logits and reports HR@10 (as the accuracy) and
// NDCG@10, as sasrec does.
absl::StatusOr<std::shared_ptr<Model>> CreateGptRecommender(const fitrun::v1::GptConfig& config, int64_t num_items,
                                                            uint64_t seed);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_MODELS_GPT_H_
