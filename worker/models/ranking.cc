#include "worker/models/ranking.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"

namespace fitrun::worker {

void RankingAt10::Add(const at::Tensor& scores) {
  constexpr int64_t kTopK = 10;
  // 0-based rank of the held-out item (column 0) among its candidates; ties rank it first.
  const at::Tensor rank = scores.narrow(1, 1, scores.size(1) - 1).gt(scores.narrow(1, 0, 1)).sum(1);
  const at::Tensor hit = rank.lt(kTopK);
  hits_ += hit.sum().item<int64_t>();
  ndcg_ += (hit.to(at::kDouble) / at::log2(rank.to(at::kDouble) + 2)).sum().item<double>();
  users_ += scores.size(0);
  negatives_ = scores.size(1) - 1;
}

Evaluation RankingAt10::Result() const {
  Evaluation evaluation;
  const double users = users_ > 0 ? static_cast<double>(users_) : 1.0;
  evaluation.accuracy = static_cast<double>(hits_) / users;
  evaluation.metrics["hr@10"] = *evaluation.accuracy;
  evaluation.metrics["ndcg@10"] = ndcg_ / users;
  evaluation.summary = absl::StrCat("test HR@10 ", *evaluation.accuracy, ", NDCG@10 ", ndcg_ / users, " over ", users_,
                                    " users (held-out last item against ", negatives_, " sampled negatives)");
  return evaluation;
}

}  // namespace fitrun::worker
