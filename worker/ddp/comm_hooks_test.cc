// The communication hooks on ranks as threads over a real Gloo group: what each leaves in the
// bucket, that the bucket's exact elements (the loss) stay exact, and PowerSGD's properties.
// Agreement with PyTorch's own hooks, number for number, is comm_hooks_pytorch_test's.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/ddp/comm_hook.h"
#include "worker/ddp/compress_hooks.h"
#include "worker/ddp/numpy_random.h"
#include "worker/ddp/powersgd_hook.h"
#include "worker/ddp/thread_ranks.h"

namespace fitrun::worker {
namespace {

// A bucket over fresh storage holding `gradients` (copied in, in order) and, when `loss` is given,
// one exact element after them: the layout the reducer builds.
GradBucket MakeBucket(const std::vector<at::Tensor>& gradients, std::optional<float> loss, int index = 0,
                      bool is_last = true) {
  int64_t elements = 0;
  for (const at::Tensor& g : gradients) elements += g.numel();
  const int64_t exact = loss.has_value() ? 1 : 0;
  GradBucket bucket;
  bucket.index = index;
  bucket.is_last = is_last;
  bucket.flat = at::zeros({elements + exact});
  bucket.buffer = bucket.flat.narrow(0, 0, elements);
  bucket.exact = bucket.flat.narrow(0, elements, exact);
  int64_t offset = 0;
  for (const at::Tensor& g : gradients) {
    bucket.gradients.push_back(bucket.buffer.narrow(0, offset, g.numel()).view(g.sizes()));
    bucket.gradients.back().copy_(g);
    offset += g.numel();
  }
  if (loss.has_value()) bucket.exact.fill_(*loss);
  return bucket;
}

// Rank r's values: the same for a given (seed, rank) on every run, drawn from a generator of
// their own (ranks are threads: the global generator is shared).
at::Tensor RankValues(at::IntArrayRef shape, int rank, uint64_t seed = 5) {
  at::Generator generator = at::detail::createCPUGenerator(seed * 1000 + rank);
  return at::randn(shape, generator);
}

TEST(LegacyNumpyRandomStateTest, DrawsWhatNumpysRandomStateDraws) {
  // numpy 1.24: [np.random.RandomState(0).randint(1_000_000_000) for ...], the seeds PowerSGD's Qs
  // start from; and RandomState(4294967295), RandomState(7) with other bounds.
  LegacyNumpyRandomState zero(0);
  for (int64_t expected : {209652396, 398764591, 924231285, 404868288, 441365315, 463622907}) {
    EXPECT_EQ(zero.RandInt(1'000'000'000), expected);
  }
  LegacyNumpyRandomState top(4294967295u);
  for (int64_t expected : {419326371, 479346978, 697429004}) EXPECT_EQ(top.RandInt(1'000'000'000), expected);
  LegacyNumpyRandomState seven(7);
  for (int64_t expected : {4, 9, 6, 3, 3, 7, 7, 9}) EXPECT_EQ(seven.RandInt(10), expected);
  EXPECT_EQ(seven.RandInt(int64_t{1} << 32), 2312822158);
  EXPECT_EQ(seven.RandInt(1), 0);  // draws nothing
  EXPECT_EQ(seven.RandInt(1000), 535);
}

TEST(CommHookTest, PlainHookLeavesTheMean) {
  RunRanksAsThreads(2, "plain_store", [](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    auto hook = CreateCommHook({}, group);
    ASSERT_TRUE(hook.ok()) << hook.status();
    EXPECT_EQ((*hook)->Describe(), "none");
    GradBucket bucket = MakeBucket({RankValues({3, 4}, rank)}, rank == 0 ? 1.0f : 2.0f);
    (*hook)->Start(bucket).Wait();
    const at::Tensor mean = (RankValues({3, 4}, 0) + RankValues({3, 4}, 1)) / 2;
    EXPECT_TRUE(at::equal(bucket.gradients[0], mean));
    EXPECT_EQ(bucket.exact.item<float>(), 1.5f);
  });
}

// fp16_compress_hook: x.half() / world, summed in float16 (Gloo adds in float and rounds to
// half, as at::add on half tensors does), back to float32. The loss is the float32 mean.
TEST(CommHookTest, Fp16HookCompressesDividesFirstAndKeepsTheLossExact) {
  RunRanksAsThreads(2, "fp16_store", [](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    CommHookOptions options;
    options.kind = CommHookOptions::Kind::kFp16;
    auto hook = CreateCommHook(options, group);
    ASSERT_TRUE(hook.ok()) << hook.status();
    // A large value too: dividing before the sum keeps 2 x 40000 from overflowing float16.
    const auto values = [](int r) {
      at::Tensor v = RankValues({64}, r) * 1000;
      v[0].fill_(40000.0f);
      return v;
    };
    const float loss = rank == 0 ? 1.0001f : 2.0003f;
    GradBucket bucket = MakeBucket({values(rank).narrow(0, 0, 40).view({5, 8}), values(rank).narrow(0, 40, 24)}, loss);
    (*hook)->Start(bucket).Wait();

    const auto compressed = [&](int r) { return values(r).to(at::kHalf).div_(2); };
    const at::Tensor expected = (compressed(0) + compressed(1)).to(at::kFloat);
    EXPECT_TRUE(at::equal(bucket.buffer, expected));
    EXPECT_EQ(bucket.buffer[0].item<float>(), 40000.0f);
    EXPECT_FALSE(at::equal(bucket.buffer, (values(0) + values(1)) / 2)) << "not compressed";
    EXPECT_EQ((*hook)->Describe(), "fp16 (all-gathered, summed in float32)");
    EXPECT_EQ(bucket.exact.item<float>(), (1.0001f + 2.0003f) / 2);
  });
}

// At 3 ranks Gloo reduces the float16 values itself (rounding after each addition): the hook's
// division is ATen's float16 division, bit for bit, and the ranks agree.
TEST(CommHookTest, Fp16HookAtThreeRanksLetsGlooReduce) {
  std::vector<at::Tensor> results(3);
  RunRanksAsThreads(3, "fp16_three_store", [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    CommHookOptions options;
    options.kind = CommHookOptions::Kind::kFp16;
    auto hook = CreateCommHook(options, group);
    ASSERT_TRUE(hook.ok()) << hook.status();
    EXPECT_EQ((*hook)->Describe(), "fp16");
    GradBucket bucket = MakeBucket({RankValues({500}, rank)}, 1.0f + rank);
    (*hook)->Start(bucket).Wait();
    EXPECT_EQ(bucket.exact.item<float>(), 2.0f);
    results[rank] = bucket.buffer.clone();
  });
  at::Tensor sum = RankValues({500}, 0).to(at::kHalf).div_(3);
  for (int r = 1; r < 3; ++r) sum = sum + RankValues({500}, r).to(at::kHalf).div_(3);
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(at::equal(results[r], results[0])) << "rank " << r;
  // Gloo's ring adds in its own order: within one float16 rounding of each addition.
  EXPECT_TRUE(at::allclose(results[0], sum.to(at::kFloat), 2e-3, 1e-3));
}

// bf16 on Gloo: the bfloat16 values of x / world summed in float32 and rounded once to bfloat16,
// all-gathered up to 3 ranks and all-reduced in float32 beyond; every rank gets the same bits.
void CheckBf16Hook(int world) {
  std::vector<at::Tensor> results(world);
  RunRanksAsThreads(world, "bf16_store_" + std::to_string(world),
                    [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
                      CommHookOptions options;
                      options.kind = CommHookOptions::Kind::kBf16;
                      auto hook = CreateCommHook(options, group);
                      ASSERT_TRUE(hook.ok()) << hook.status();
                      EXPECT_NE((*hook)->Describe().find(world <= HalfCompressHook::kMaxAllGatherWorld
                                                             ? "bf16 (all-gathered, summed in float32)"
                                                             : "bf16 (all-reduced as float32)"),
                                std::string::npos);
                      GradBucket bucket = MakeBucket({RankValues({1000}, rank)}, 1.0f + rank);
                      (*hook)->Start(bucket).Wait();
                      EXPECT_EQ(bucket.exact.item<float>(), 1.0f + (world - 1) / 2.0f);
                      results[rank] = bucket.buffer.clone();
                    });
  at::Tensor sum = at::zeros({1000});
  for (int r = 0; r < world; ++r) sum += RankValues({1000}, r).to(at::kBFloat16).div_(world).to(at::kFloat);
  const at::Tensor expected = sum.to(at::kBFloat16).to(at::kFloat);
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(results[r].defined());
    EXPECT_TRUE(at::equal(results[r], results[0])) << "rank " << r << " differs from rank 0";
  }
  if (world <= HalfCompressHook::kMaxAllGatherWorld) {
    // Summed in rank order, as here: bit for bit.
    EXPECT_TRUE(at::equal(results[0], expected));
  } else {
    // Gloo's ring sums in its own order: equal up to float32 rounding before the bfloat16 one.
    EXPECT_LE((results[0] - expected).abs().max().item<float>(), expected.abs().max().item<float>() / 128);
  }
  EXPECT_GT((results[0] - sum).abs().max().item<float>(), 0) << "not rounded to bfloat16";
}

TEST(CommHookTest, Bf16HookOnGlooSumsTheBfloat16ValuesInFloat32) {
  CheckBf16Hook(2);
  CheckBf16Hook(3);
  CheckBf16Hook(4);
}

PowerSgdOptions StartingAt(int64_t start, int rank = 1) {
  PowerSgdOptions options;
  options.start_powersgd_iter = start;
  options.matrix_approximation_rank = rank;
  return options;
}

TEST(PowerSgdHookTest, RefusesWhatPyTorchsPowerSgdStateRefuses) {
  RunRanksAsThreads(1, "powersgd_refuse_store", [](int, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    auto early = PowerSgdHook::Create(group, StartingAt(1));
    EXPECT_EQ(early.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(early.status().message().find("spec.ddp.powersgd_start_iter: must be >= 2"), std::string::npos)
        << early.status();
    PowerSgdOptions without_state = StartingAt(1);
    without_state.use_error_feedback = false;
    without_state.warm_start = false;
    EXPECT_TRUE(PowerSgdHook::Create(group, without_state).ok());
    auto rank0 = PowerSgdHook::Create(group, StartingAt(2, 0));
    EXPECT_NE(rank0.status().message().find("spec.ddp.powersgd_rank: must be >= 1 (got 0)"), std::string::npos);
  });
}

// Before start_powersgd_iter the hook all-reduces plainly; a step counts when the last bucket is
// reduced. Afterwards a matrix whose mean over ranks has rank 1 comes back exactly (P Q^T of a
// rank-1 matrix is the matrix), vectors and the loss are averaged uncompressed.
TEST(PowerSgdHookTest, PlainUntilItsStartThenRankOneMatricesComeBackWhole) {
  RunRanksAsThreads(2, "powersgd_store", [](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    auto hook = PowerSgdHook::Create(group, StartingAt(2));
    ASSERT_TRUE(hook.ok()) << hook.status();
    at::Generator generator = at::detail::createCPUGenerator(11);
    const at::Tensor u = at::randn({16, 1}, generator);
    const at::Tensor v = at::randn({1, 12}, generator);
    const at::Tensor matrix = u.matmul(v) * (rank + 1.0);  // mean: 1.5 u v^T
    const at::Tensor bias = RankValues({16}, rank);
    for (int step = 0; step < 4; ++step) {
      GradBucket first = MakeBucket({bias, matrix}, std::nullopt, 0, false);
      GradBucket last = MakeBucket({matrix.t().contiguous()}, 3.0f * rank, 1, true);
      PendingReduction a = (*hook)->Start(first);
      PendingReduction b = (*hook)->Start(last);
      a.Wait();
      b.Wait();
      EXPECT_EQ((*hook)->iter(), step + 1);
      const at::Tensor mean = u.matmul(v) * 1.5;
      // Exactly the mean until error feedback starts adding each rank's departure from the mean of
      // the previous step, which PyTorch keeps for uncompressed gradients too (the errors sum to
      // zero over ranks, so only rounding changes).
      const at::Tensor bias_mean = (RankValues({16}, 0) + RankValues({16}, 1)) / 2;
      if (step < 3) EXPECT_TRUE(at::equal(first.gradients[0], bias_mean)) << "step " << step;
      EXPECT_TRUE(at::allclose(first.gradients[0], bias_mean, 1e-6, 1e-6)) << "step " << step;
      EXPECT_TRUE(at::allclose(first.gradients[1], mean, 1e-5, 1e-5)) << "step " << step;
      EXPECT_TRUE(at::allclose(last.gradients[0], mean.t(), 1e-5, 1e-5)) << "step " << step;
      EXPECT_EQ(last.exact.item<float>(), 1.5f) << "step " << step;
      if (step < 2) EXPECT_TRUE(at::equal(first.gradients[1], mean)) << "plain all-reduce at step " << step;
    }
    // 16x12 and 12x16 compressed to (16 + 12) x 1 each; the bias is not.
    EXPECT_EQ((*hook)->numel_before_compression(), 2 * (16 + 192 + 192));
    EXPECT_EQ((*hook)->numel_after_compression(), 2 * (16 + 28 + 28));
  });
}

// Error feedback: what compression leaves out of one step is added to the next, so over many steps
// the decompressed gradients of a constant full-rank gradient average to it.
TEST(PowerSgdHookTest, ErrorFeedbackMakesTheAverageOfManyStepsTheTrueMean) {
  RunRanksAsThreads(2, "powersgd_feedback_store", [](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    auto hook = PowerSgdHook::Create(group, StartingAt(2));
    ASSERT_TRUE(hook.ok()) << hook.status();
    const at::Tensor gradient = RankValues({8, 10}, rank);
    const at::Tensor mean = (RankValues({8, 10}, 0) + RankValues({8, 10}, 1)) / 2;
    at::Tensor total = at::zeros({8, 10});
    const int kSteps = 200;
    float first_compressed_error = 0;
    for (int step = 0; step < 2 + kSteps; ++step) {
      GradBucket bucket = MakeBucket({gradient}, std::nullopt);
      (*hook)->Start(bucket).Wait();
      if (step < 2) continue;
      if (step == 2) first_compressed_error = (bucket.gradients[0] - mean).abs().max().item<float>();
      total += bucket.gradients[0];
    }
    const float averaged_error = (total / kSteps - mean).abs().max().item<float>();
    EXPECT_GT(first_compressed_error, 0.1) << "a full-rank matrix should not survive rank-1 compression";
    EXPECT_LT(averaged_error, first_compressed_error / 20);
  });
}

// _orthogonalize: Gram-Schmidt for rank <= 2, QR beyond; the columns come out orthonormal.
TEST(PowerSgdHookTest, OrthogonalizeLeavesOrthonormalColumns) {
  at::Generator generator = at::detail::createCPUGenerator(3);
  for (int64_t rank : {1, 2, 4}) {
    at::Tensor matrices = at::randn({3, 20, rank}, generator);
    Orthogonalize(matrices, 0);
    const at::Tensor gram = at::bmm(matrices.transpose(1, 2), matrices);
    EXPECT_TRUE(at::allclose(gram, at::eye(rank).expand({3, rank, rank}), 1e-5, 1e-5)) << "rank " << rank;
  }
}

}  // namespace
}  // namespace fitrun::worker
