#include "worker/data/movielens.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <random>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace fitrun::worker {
namespace {

struct Interaction {
  int64_t timestamp;
  int64_t item;
};

// Writes the last `max_len` of items[0, end) right-aligned into row `row` of `out` [rows, max_len].
void FillLeftPadded(const std::vector<int64_t>& items, size_t begin, size_t end, int64_t max_len,
                    int64_t* row) {
  const size_t take = std::min<size_t>(end - begin, static_cast<size_t>(max_len));
  for (size_t i = 0; i < take; ++i) row[max_len - take + i] = items[end - take + i];
}

}  // namespace

absl::StatusOr<MovieLensSplits> LoadMovieLens(const std::string& path, int64_t max_len, uint64_t seed) {
  if (max_len < 1) return absl::InvalidArgumentError(absl::StrCat("max_len must be >= 1 (got ", max_len, ")"));
  std::ifstream file(path);
  if (!file) return absl::InvalidArgumentError(absl::StrCat("cannot read '", path, "'"));

  std::map<int64_t, std::vector<Interaction>> by_user;  // ordered, so users come out the same on every rank
  std::map<int64_t, int64_t> item_ids;
  std::string line;
  int64_t line_number = 0;
  while (std::getline(file, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const std::vector<absl::string_view> fields = absl::StrSplit(line, "::");
    int64_t user = 0, item = 0, timestamp = 0;
    if (fields.size() != 4 || !absl::SimpleAtoi(fields[0], &user) || !absl::SimpleAtoi(fields[1], &item) ||
        !absl::SimpleAtoi(fields[3], &timestamp)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", path, "' line ", line_number, " is not user::item::rating::timestamp: '", line, "'"));
    }
    by_user[user].push_back({timestamp, item});
    item_ids[item] = 0;
  }
  int64_t next_id = 0;
  for (auto& [item, id] : item_ids) id = ++next_id;
  const int64_t num_items = next_id;

  std::vector<std::vector<int64_t>> sequences;
  for (auto& [user, interactions] : by_user) {
    if (interactions.size() < 3) continue;
    std::stable_sort(interactions.begin(), interactions.end(),
                     [](const Interaction& a, const Interaction& b) { return a.timestamp < b.timestamp; });
    std::vector<int64_t> items;
    for (const Interaction& i : interactions) items.push_back(item_ids[i.item]);
    sequences.push_back(std::move(items));
  }
  if (sequences.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' has no user with 3 or more ratings"));
  }

  const int64_t users = static_cast<int64_t>(sequences.size());
  MovieLensSplits splits;
  splits.num_items = num_items;
  splits.train.inputs = {at::zeros({users, max_len}, at::kLong)};
  splits.train.targets = at::zeros({users, max_len}, at::kLong);
  for (int64_t u = 0; u < users; ++u) {
    const std::vector<int64_t>& items = sequences[u];
    const size_t n = items.size() - 1;  // the last item is held out
    FillLeftPadded(items, 0, n - 1, max_len, splits.train.inputs[0][u].data_ptr<int64_t>());
    FillLeftPadded(items, 1, n, max_len, splits.train.targets[u].data_ptr<int64_t>());
  }

  std::mt19937_64 random(seed ^ 0x5a5ec);
  std::uniform_int_distribution<int64_t> any_item(1, num_items);
  std::vector<int64_t> test_users;
  for (int64_t u = 0; u < users; ++u) {
    const std::unordered_set<int64_t> seen(sequences[u].begin(), sequences[u].end());
    if (num_items - static_cast<int64_t>(seen.size()) >= kMovieLensTestNegatives) test_users.push_back(u);
  }
  const int64_t tested = static_cast<int64_t>(test_users.size());
  splits.test.inputs = {at::zeros({tested, max_len}, at::kLong)};
  splits.test.targets = at::zeros({tested, 1 + kMovieLensTestNegatives}, at::kLong);
  for (int64_t t = 0; t < tested; ++t) {
    const std::vector<int64_t>& items = sequences[test_users[t]];
    const std::unordered_set<int64_t> seen(items.begin(), items.end());
    FillLeftPadded(items, 0, items.size() - 1, max_len, splits.test.inputs[0][t].data_ptr<int64_t>());
    int64_t* candidates = splits.test.targets[t].data_ptr<int64_t>();
    candidates[0] = items.back();
    for (int64_t k = 1; k <= kMovieLensTestNegatives; ++k) {
      int64_t item = any_item(random);
      while (seen.count(item) > 0) item = any_item(random);
      candidates[k] = item;
    }
  }
  return splits;
}

}  // namespace fitrun::worker
