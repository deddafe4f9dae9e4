#ifndef FITRUN_WORKER_MODELS_RANKING_H_
#define FITRUN_WORKER_MODELS_RANKING_H_

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "worker/models/model.h"

namespace fitrun::worker {

// The recommenders' test figures (SASRec's evaluation, Kang & McAuley 2018): each user's held-out
// item ranked among its sampled negatives, HR@10 and NDCG@10 over the users. sasrec and the gpt
// recommender score the same candidates, so their figures compare on one ratings file.
class RankingAt10 {
 public:
  // `scores` [n, 1 + negatives]: the held-out item's score in column 0, one row per user.
  void Add(const at::Tensor& scores);
  // HR@10 as the accuracy, and both as metrics "hr@10" and "ndcg@10".
  Evaluation Result() const;

 private:
  int64_t users_ = 0;
  int64_t hits_ = 0;
  double ndcg_ = 0;
  int64_t negatives_ = 0;
};

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_MODELS_RANKING_H_
