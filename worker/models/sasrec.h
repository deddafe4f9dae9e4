#ifndef FITRUN_WORKER_MODELS_SASREC_H_
#define FITRUN_WORKER_MODELS_SASREC_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fitrun/v1/job.pb.h"
#include "worker/models/model.h"

namespace fitrun::worker {

// Checks a sasrec config; errors name the field (spec.model.sasrec.heads, ...).
absl::Status ValidateSasRecConfig(const fitrun::v1::SasRecConfig& config);

// SASRec (Kang & McAuley 2018, "Self-Attentive Sequential Recommendation"): item embeddings scaled
// by sqrt(hidden) plus learned positions, `blocks` blocks of causal self-attention (queries
// LayerNorm-ed, as the authors' code) and a point-wise two-layer ReLU feed-forward net, each with a
// residual and padding positions zeroed, then a final LayerNorm. An item's score at a position is
// the dot product of that position's output with the item's embedding (shared with the input).
// Dropout is left out so that runs with one seed are reproducible.
//
// Batches are rows of MovieLensSplits (worker/data/movielens.h), items in [1, num_items] and 0 for
// padding. Loss: binary cross-entropy of the next item (positive) against one negative item drawn
// uniformly per position, redrawn while it is in the row's own items, over non-padding positions,
// as in the paper. Forward returns the last position's scores for every item [B, num_items + 1].
// Evaluate ranks each held-out item among its 100 negatives and reports HR@10 (as the accuracy)
// and NDCG@10.
absl::StatusOr<std::shared_ptr<Model>> CreateSasRec(const fitrun::v1::SasRecConfig& config, int64_t num_items,
                                                    uint64_t seed);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_MODELS_SASREC_H_
