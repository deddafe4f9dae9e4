#ifndef FITRUN_WORKER_DATA_MOVIELENS_H_
#define FITRUN_WORKER_DATA_MOVIELENS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "worker/data/tensor_dataset.h"

namespace fitrun::worker {

// Candidates per held-out item in the test split: the item itself and this many sampled negatives,
// as in SASRec's evaluation (Kang & McAuley 2018, section IV-B).
inline constexpr int64_t kMovieLensTestNegatives = 100;

// A MovieLens ratings file split leave-one-out for next-item recommendation.
//
// Every line is user::item::rating::timestamp (MovieLens-1M's ratings.dat); each rating counts as an
// interaction whatever its value. A user's items are ordered by timestamp (file order breaks ties)
// and item ids are renumbered densely to [1, num_items] in ascending order of their original id,
// 0 being padding. Users with fewer than 3 interactions are left out: training needs an input and a
// next item besides the held-out last one. The coordinator counts samples with the same rules.
//
// train: one row per user, from all but the last item. The input [U, max_len] int64 holds the
// items before the last training item, left-padded with 0 (only the most recent max_len); the
// targets [U, max_len] the item following each position (0 under padding).
// test: the input [U', max_len] all but the last item, left-padded; the targets [U', 1 + 100] the
// held-out item followed by 100 items the user never interacted with, drawn with `seed`. Users with fewer
// than 100 unseen items cannot be ranked this way and are left out of the test split only.
struct MovieLensSplits {
  TensorDataset train;
  TensorDataset test;
  int64_t num_items = 0;
};

absl::StatusOr<MovieLensSplits> LoadMovieLens(const std::string& path, int64_t max_len, uint64_t seed);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DATA_MOVIELENS_H_
