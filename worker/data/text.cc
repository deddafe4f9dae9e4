#include "worker/data/text.h"

#include <ATen/ATen.h>

#include <fstream>
#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fitrun::worker {
namespace {

// [begin, end) of a split within a file of `file_bytes`.
std::pair<int64_t, int64_t> SplitRange(int64_t file_bytes, Split split) {
  const int64_t train_end = file_bytes * 9 / 10;
  return split == Split::kTrain ? std::make_pair(int64_t{0}, train_end) : std::make_pair(train_end, file_bytes);
}

}  // namespace

int64_t TextWindowCount(int64_t file_bytes, int64_t context, Split split) {
  if (context < 1) return 0;
  const auto [begin, end] = SplitRange(file_bytes, split);
  const int64_t n = end - begin;
  return n < 1 ? 0 : (n - 1) / context;
}

absl::StatusOr<TensorDataset> LoadTextWindows(const std::string& path, int64_t context, Split split) {
  if (context < 1) return absl::InvalidArgumentError(absl::StrCat("context must be >= 1 (got ", context, ")"));
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::InvalidArgumentError(absl::StrCat("cannot read '", path, "'"));
  const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (file.bad()) return absl::InvalidArgumentError(absl::StrCat("error reading '", path, "'"));

  const int64_t size = static_cast<int64_t>(bytes.size());
  const int64_t windows = TextWindowCount(size, context, split);
  if (windows < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path, "' has ", size, " bytes: its ", split == Split::kTrain ? "training" : "test",
        " split (", split == Split::kTrain ? "first 90%" : "last 10%", ") holds no window of ",
        context + 1, " bytes; use a file of at least ", 10 * (context + 1) + 10, " bytes or a smaller context"));
  }
  const int64_t begin = SplitRange(size, split).first;
  const at::Tensor all = at::from_blob(const_cast<char*>(bytes.data()) + begin, {size - begin}, at::kByte);
  // as_strided views overlapping windows without copying; the clones below own their memory.
  const at::Tensor framed = all.as_strided({windows, context + 1}, {context, 1});
  TensorDataset set;
  set.inputs = {framed.narrow(1, 0, context).clone()};
  set.targets = framed.narrow(1, 1, context).clone();
  return set;
}

}  // namespace fitrun::worker
