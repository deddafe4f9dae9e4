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

// Parameters of a gpt config: embeddings, 12h^2 + 13h per block, the final LayerNorm and, untied,
// the output head. The coordinator's memory profile computes the same number.
int64_t GptParameterCount(const fitrun::v1::GptConfig& config);

// A byte-level decoder-only transformer language model (GPT-2's layout at small sizes): byte and
// learned position embeddings, `layers` pre-LayerNorm blocks of causal self-attention and a 4x GELU
// MLP, a final LayerNorm and a 256-way head (tied to the byte embedding when config.tied_head).
// Dropout is left out so that runs with one seed are reproducible.
//
// Inputs are byte windows [B, T] (uint8 or int64, T <= context); Forward returns next-byte logits
// [B, T, 256]. Loss is the mean cross-entropy in nats per byte against targets [B, T] (the same
// windows shifted by one); Evaluate reports the test split's loss and has no accuracy.
absl::StatusOr<std::shared_ptr<Model>> CreateGpt(const fitrun::v1::GptConfig& config, uint64_t seed);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_MODELS_GPT_H_
