// fitrun's communication hooks against PyTorch's own, number for number: PyTorch's hooks run on
// fixed gradients in two ranks of Debian's python3-torch (tests/parity/comm_hooks_reference.py
// records every bucket as it went in and as the hook left it), and the same buckets go through
// fitrun's hooks on two thread ranks. Steps where PowerSGD compresses, with its error feedback and
// warm-started Qs, are included.
#include <ATen/ATen.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "proto/contract/testing/temp_dir.h"
#include "worker/ddp/comm_hook.h"
#include "worker/ddp/numpy_random.h"
#include "worker/ddp/thread_ranks.h"

namespace fitrun::worker {
namespace {

constexpr int kWorld = 2;
constexpr double kTolerance = 1e-5;

struct RecordedBucket {
  int step = 0;
  int index = 0;
  bool is_last = false;
  std::vector<std::vector<int64_t>> shapes;
  at::Tensor input;   // the bucket as DDP handed it to PyTorch's hook
  at::Tensor output;  // as the hook left it
};

// Where PyTorch's reference recordings are: made before the suite (the recording takes seconds, so
// once for all its tests) and removed after it.
contract::TempDir* reference_dir = nullptr;

const std::string& ReferenceDir() { return reference_dir->path(); }

std::vector<RecordedBucket> LoadRecording(const std::string& config, int rank) {
  const std::string base = ReferenceDir() + "/" + config + ".rank" + std::to_string(rank);
  std::ifstream manifest(base + ".txt");
  std::ifstream values(base + ".f32", std::ios::binary);
  std::string line;
  std::getline(manifest, line);  // the configuration
  std::vector<RecordedBucket> buckets;
  while (std::getline(manifest, line)) {
    std::istringstream fields(line);
    RecordedBucket bucket;
    int is_last = 0;
    std::string shapes;
    fields >> bucket.step >> bucket.index >> is_last >> shapes;
    bucket.is_last = is_last != 0;
    int64_t numel = 0;
    for (absl::string_view shape : absl::StrSplit(shapes, ';')) {
      std::vector<int64_t> dims;
      if (shape != "scalar") {
        for (absl::string_view d : absl::StrSplit(shape, 'x')) dims.push_back(std::stoll(std::string(d)));
      }
      int64_t n = 1;
      for (int64_t d : dims) n *= d;
      numel += n;
      bucket.shapes.push_back(dims);
    }
    bucket.input = at::empty({numel});
    bucket.output = at::empty({numel});
    values.read(static_cast<char*>(bucket.input.data_ptr()), numel * sizeof(float));
    values.read(static_cast<char*>(bucket.output.data_ptr()), numel * sizeof(float));
    buckets.push_back(std::move(bucket));
  }
  EXPECT_TRUE(values.good()) << base << ".f32 is shorter than its manifest";
  EXPECT_FALSE(buckets.empty()) << "nothing recorded in " << base << ".txt";
  return buckets;
}

// The recorded bucket as the reducer lays it out: the gradients, then in the last bucket one exact
// element (a loss of rank + 1, whose mean must come back as 1.5 whatever the hook).
GradBucket BucketFrom(const RecordedBucket& recorded, int rank) {
  const int64_t numel = recorded.input.numel();
  const int64_t exact = recorded.is_last ? 1 : 0;
  GradBucket bucket;
  bucket.index = recorded.index;
  bucket.is_last = recorded.is_last;
  bucket.flat = at::empty({numel + exact});
  bucket.buffer = bucket.flat.narrow(0, 0, numel);
  bucket.exact = bucket.flat.narrow(0, numel, exact);
  bucket.buffer.copy_(recorded.input);
  bucket.exact.fill_(rank + 1.0f);
  int64_t offset = 0;
  for (const std::vector<int64_t>& shape : recorded.shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    bucket.gradients.push_back(bucket.buffer.narrow(0, offset, n).view(shape));
    offset += n;
  }
  return bucket;
}

struct Comparison {
  double max_abs_difference = 0;   // fitrun's hook against PyTorch's
  double max_compression_change = 0;  // PyTorch's hook against the plain mean of the inputs
  int buckets = 0;
};

// Replays `config`'s buckets through fitrun's hook on two thread ranks.
Comparison Replay(const std::string& config, const CommHookOptions& options) {
  std::vector<std::vector<RecordedBucket>> recorded = {LoadRecording(config, 0), LoadRecording(config, 1)};
  if (recorded[0].size() != recorded[1].size()) {
    ADD_FAILURE() << config << ": the ranks recorded different buckets";
    return {};
  }
  absl::Mutex mu;
  Comparison result;
  RunRanksAsThreads(kWorld, config + "_store", [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    absl::StatusOr<std::unique_ptr<CommHook>> hook = CreateCommHook(options, group);
    ASSERT_TRUE(hook.ok()) << hook.status();
    const std::vector<RecordedBucket>& mine = recorded[rank];
    for (size_t first = 0; first < mine.size();) {
      size_t end = first;
      while (end < mine.size() && mine[end].step == mine[first].step) ++end;
      // One step: every bucket started in index order, then waited for in the same order.
      std::vector<GradBucket> buckets;
      std::vector<PendingReduction> pending;
      for (size_t i = first; i < end; ++i) buckets.push_back(BucketFrom(mine[i], rank));
      for (GradBucket& bucket : buckets) pending.push_back((*hook)->Start(bucket));
      for (PendingReduction& p : pending) p.Wait();
      for (size_t i = first; i < end; ++i) {
        const GradBucket& bucket = buckets[i - first];
        const at::Tensor plain_mean = (recorded[0][i].input + recorded[1][i].input) / kWorld;
        const double difference = (bucket.buffer - mine[i].output).abs().max().item<double>();
        const double change = (mine[i].output - plain_mean).abs().max().item<double>();
        if (bucket.is_last) {
          EXPECT_EQ(bucket.exact.item<float>(), 1.5f) << config << " step " << mine[i].step;
        }
        absl::MutexLock lock(&mu);
        result.max_abs_difference = std::max(result.max_abs_difference, difference);
        result.max_compression_change = std::max(result.max_compression_change, change);
        ++result.buckets;
      }
      first = end;
    }
  });
  std::cout << config << ": " << result.buckets << " buckets, max abs difference from PyTorch "
            << result.max_abs_difference << ", PyTorch's hook moved values from the plain mean by up to "
            << result.max_compression_change << std::endl;
  return result;
}

class CommHooksPyTorchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    reference_dir = new contract::TempDir("comm_hooks_reference-");
    ASSERT_TRUE(reference_dir->ok());
    const char* srcdir = std::getenv("TEST_SRCDIR");
    const char* workspace = std::getenv("TEST_WORKSPACE");
    const std::string script = std::string(srcdir != nullptr ? srcdir : ".") + "/" +
                               (workspace != nullptr ? workspace : "fitrun") +
                               "/tests/parity/comm_hooks_reference.py";
    const std::string command = "/usr/bin/python3 " + script + " --out " + ReferenceDir();
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
  static void TearDownTestSuite() {
    delete reference_dir;
    reference_dir = nullptr;
  }
};

TEST_F(CommHooksPyTorchTest, PowerSgdSeedsAreNumpysRandomStateDraws) {
  std::ifstream drawn(ReferenceDir() + "/numpy.txt");
  LegacyNumpyRandomState random_state(0);
  int count = 0;
  for (int64_t expected; drawn >> expected; ++count) EXPECT_EQ(random_state.RandInt(1'000'000'000), expected);
  EXPECT_EQ(count, 8);
}

TEST_F(CommHooksPyTorchTest, Fp16HookMatchesFp16CompressHook) {
  CommHookOptions options;
  options.kind = CommHookOptions::Kind::kFp16;
  const Comparison c = Replay("fp16", options);
  EXPECT_LE(c.max_abs_difference, kTolerance);
  EXPECT_GT(c.max_compression_change, 1e-4) << "float16 should have rounded something";
}

TEST_F(CommHooksPyTorchTest, Bf16HookMatchesBf16CompressHookWithNcclsArithmetic) {
  CommHookOptions options;
  options.kind = CommHookOptions::Kind::kBf16;
  const Comparison c = Replay("bf16", options);
  EXPECT_LE(c.max_abs_difference, kTolerance);
  EXPECT_GT(c.max_compression_change, 1e-3) << "bfloat16 should have rounded something";
}

TEST_F(CommHooksPyTorchTest, PowerSgdMatchesPowerSgdHookWithGramSchmidt) {
  CommHookOptions options;
  options.kind = CommHookOptions::Kind::kPowerSgd;
  options.powersgd_rank = 1;
  options.powersgd_start_iter = 2;
  const Comparison c = Replay("powersgd_rank1", options);
  EXPECT_EQ(c.buckets, 2 * (1 + 5 * 2));  // step 0 in one bucket (before DDP rebuilds them), then 2
  EXPECT_LE(c.max_abs_difference, kTolerance);
  EXPECT_GT(c.max_compression_change, 0.1) << "PowerSGD should have compressed";
}

TEST_F(CommHooksPyTorchTest, PowerSgdMatchesPowerSgdHookWithQr) {
  CommHookOptions options;
  options.kind = CommHookOptions::Kind::kPowerSgd;
  options.powersgd_rank = 4;
  options.powersgd_start_iter = 3;
  const Comparison c = Replay("powersgd_rank4", options);
  EXPECT_LE(c.max_abs_difference, kTolerance);
  EXPECT_GT(c.max_compression_change, 0.1) << "PowerSGD should have compressed";
}

}  // namespace
}  // namespace fitrun::worker
