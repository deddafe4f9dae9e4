#include "worker/models/workload.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/data/test_files.h"
#include "worker/trainer/fake_progress_sink.h"
#include "worker/trainer/trainer.h"

namespace fitrun::worker {
namespace {

struct TrainingRun {
  double first_loss = 0;  // step 1's loss: the model as initialised
  double last_loss = 0;   // mean of the last three steps' losses
  TrainResult result;
  std::vector<std::string> logs;
};

// Trains a workload for `steps` steps on one rank with Adam, the way a worker does.
absl::StatusOr<TrainingRun> Train(const fitrun::v1::JobSpec& spec, int64_t steps, int64_t batch, double lr) {
  absl::StatusOr<Workload> workload = LoadWorkload(spec, /*with_test=*/true);
  if (!workload.ok()) return workload.status();
  TrainerOptions options;
  options.per_device_batch = batch;
  options.learning_rate = lr;
  options.total_steps = steps;
  options.seed = spec.seed();
  options.optimizer.set_kind(fitrun::v1::OPTIMIZER_KIND_ADAM);
  options.progress_interval = absl::ZeroDuration();
  LocalGradientSynchronizer synchronizer;
  FakeProgressSink sink;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(options, workload->model, std::move(workload->train), std::move(workload->test),
                      &synchronizer, &sink);
  if (!trainer.ok()) return trainer.status();
  absl::StatusOr<TrainResult> result = (*trainer)->Run();
  if (!result.ok()) return result.status();
  const std::vector<StepProgress> progress = sink.progress();
  if (progress.size() != static_cast<size_t>(steps)) return absl::InternalError("a step was not reported");
  TrainingRun run;
  run.first_loss = progress.front().loss;
  for (int i = 0; i < 3; ++i) {
    run.last_loss += progress[progress.size() - 1 - i].loss / 3;
  }
  run.result = *result;
  run.logs = sink.logs();
  std::printf("%s: loss %.4f -> %.4f over %lld steps; %s\n", workload->description.c_str(), run.first_loss,
              run.last_loss, static_cast<long long>(steps), run.logs.empty() ? "" : run.logs.back().c_str());
  return run;
}

std::string WriteFile(const std::string& name, const std::string& bytes) {
  const std::string path = testing::MakeTempDir("workload_test") + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

fitrun::v1::JobSpec GptSpec(const std::string& path) {
  fitrun::v1::JobSpec spec;
  spec.set_seed(5);
  spec.mutable_model()->set_builtin("gpt");
  fitrun::v1::GptConfig* gpt = spec.mutable_model()->mutable_gpt();
  gpt->set_layers(1);
  gpt->set_heads(2);
  gpt->set_hidden(32);
  gpt->set_context(16);
  spec.mutable_data()->set_kind(fitrun::v1::DATA_KIND_TEXT);
  spec.mutable_data()->set_path(path);
  return spec;
}

// A few sentences repeated: next bytes are predictable from the previous few.
std::string RepetitiveText(size_t bytes) {
  const std::string sentences =
      "the quick brown fox jumps over the lazy dog. a stitch in time saves nine. "
      "all that glitters is not gold. ";
  std::string text;
  while (text.size() < bytes) text += sentences;
  text.resize(bytes);
  return text;
}

TEST(WorkloadTest, GptLossFallsAndTheTestLossIsLogged) {
  const fitrun::v1::JobSpec spec = GptSpec(WriteFile("sentences.txt", RepetitiveText(20000)));
  absl::StatusOr<TrainingRun> run = Train(spec, 60, 16, 3e-3);
  ASSERT_TRUE(run.ok()) << run.status();
  // Uniform over bytes is ln 256 = 5.55 nats; the repeated sentences need far fewer.
  EXPECT_GT(run->first_loss, 4.5);
  EXPECT_LT(run->last_loss, 3.0);
  EXPECT_FALSE(run->result.has_test_accuracy);
  ASSERT_FALSE(run->logs.empty());
  EXPECT_TRUE(absl::StrContains(run->logs.back(), "test loss")) << run->logs.back();
  EXPECT_TRUE(absl::StrContains(run->logs.back(), "nats/byte")) << run->logs.back();
}

TEST(WorkloadTest, GptChecksItsDataKindConfigAndFile) {
  const std::string path = WriteFile("short.txt", RepetitiveText(20000));
  fitrun::v1::JobSpec wrong_kind = GptSpec(path);
  wrong_kind.mutable_data()->set_kind(fitrun::v1::DATA_KIND_FASHION_MNIST);
  EXPECT_TRUE(absl::StrContains(LoadWorkload(wrong_kind, false).status().message(), "spec.data.kind"));

  fitrun::v1::JobSpec bad_heads = GptSpec(path);
  bad_heads.mutable_model()->mutable_gpt()->set_heads(3);
  EXPECT_TRUE(absl::StrContains(LoadWorkload(bad_heads, false).status().message(), "spec.model.gpt.heads"));

  fitrun::v1::JobSpec missing = GptSpec(path + ".missing");
  absl::Status status = LoadWorkload(missing, false).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "spec.data.path")) << status;
}

// Exports a module with Debian's PyTorch (torch.jit.script(...).save), as a user would.
absl::StatusOr<std::string> ExportTorchScript(const std::string& name, const std::string& module_source) {
  const std::string dir = testing::MakeTempDir("workload_test");
  const std::string script = dir + "/" + name + ".py";
  const std::string path = dir + "/" + name + ".pt";
  std::ofstream(script) << "import sys\nimport torch\n" << module_source
                        << "torch.manual_seed(0)\ntorch.jit.script(Net()).save(sys.argv[1])\n";
  const std::string command = absl::StrCat("/usr/bin/python3 ", script, " ", path);
  if (std::system(command.c_str()) != 0) return absl::InternalError(absl::StrCat("failed: ", command));
  return path;
}

// A conv net with BatchNorm, so buffers and train/eval mode go through the wrapper too.
constexpr char kConvNet[] = R"py(
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.norm = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 13 * 13, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.norm(self.conv(x))), 2)
        return self.fc(x.flatten(1))
)py";

fitrun::v1::JobSpec TorchScriptSpec(const std::string& model_path, const std::string& data_dir) {
  fitrun::v1::JobSpec spec;
  spec.set_seed(5);
  spec.mutable_model()->set_torchscript(model_path);
  spec.mutable_data()->set_kind(fitrun::v1::DATA_KIND_FASHION_MNIST);
  spec.mutable_data()->set_path(data_dir);
  return spec;
}

TEST(WorkloadTest, TorchScriptModuleTrainsThroughItsOwnParameters) {
  absl::StatusOr<std::string> path = ExportTorchScript("convnet", kConvNet);
  ASSERT_TRUE(path.ok()) << path.status();
  const std::string data_dir = testing::MakeTempDir("torchscript_fashion_mnist");
  testing::WriteFakeFashionMnist(data_dir, 640, 200);
  const fitrun::v1::JobSpec spec = TorchScriptSpec(*path, data_dir);

  absl::StatusOr<Workload> workload = LoadWorkload(spec, false);
  ASSERT_TRUE(workload.ok()) << workload.status();
  int64_t parameters = 0;
  for (const at::Tensor& p : workload->model->parameters()) parameters += p.numel();
  EXPECT_EQ(parameters, (4 * 9 + 4) + (4 + 4) + (4 * 13 * 13 * 10 + 10));
  // BatchNorm's running mean and variance; its integer step counter stays out of the broadcast.
  EXPECT_EQ(workload->model->buffers().size(), 2u);

  absl::StatusOr<TrainingRun> run = Train(spec, 30, 32, 1e-2);
  ASSERT_TRUE(run.ok()) << run.status();
  // Ten classes start near ln 10 = 2.3 nats.
  EXPECT_GT(run->first_loss, 1.5);
  EXPECT_LT(run->last_loss, 0.2);
  EXPECT_TRUE(run->result.has_test_accuracy);
  EXPECT_GT(run->result.test_accuracy, 0.5);
}

TEST(WorkloadTest, TorchScriptContractViolationsNameTheField) {
  const std::string data_dir = testing::MakeTempDir("torchscript_contract");
  testing::WriteFakeFashionMnist(data_dir, 20, 10);

  const std::string not_a_module = WriteFile("not_a_module.pt", "just text");
  absl::Status status = LoadWorkload(TorchScriptSpec(not_a_module, data_dir), false).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "spec.model.torchscript")) << status;

  absl::StatusOr<std::string> scalar = ExportTorchScript("scalar", R"py(
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(784, 3)

    def forward(self, x):
        return self.fc(x.flatten(1))
)py");
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  status = LoadWorkload(TorchScriptSpec(*scalar, data_dir), false).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "classes >= 10")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "[2, 3]")) << status;
}

// Synthetic ratings with learnable order: 200 items on a ring, and each user rates a run of
// consecutive items from a random start, so the next item follows from the last one.
std::string SequentialRatings(int users, int items, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::string text;
  for (int u = 1; u <= users; ++u) {
    const int start = static_cast<int>(random() % items);
    const int length = 6 + static_cast<int>(random() % 10);
    for (int k = 0; k < length; ++k) {
      absl::StrAppend(&text, u, "::", 1000 + (start + k) % items, "::", 1 + k % 5, "::", 978300000 + k, "\n");
    }
  }
  return text;
}

fitrun::v1::JobSpec SasRecSpec(const std::string& path) {
  fitrun::v1::JobSpec spec;
  spec.set_seed(5);
  spec.mutable_model()->set_builtin("sasrec");
  fitrun::v1::SasRecConfig* sasrec = spec.mutable_model()->mutable_sasrec();
  sasrec->set_max_len(10);
  sasrec->set_hidden(32);
  sasrec->set_blocks(1);
  sasrec->set_heads(1);
  spec.mutable_data()->set_kind(fitrun::v1::DATA_KIND_MOVIELENS);
  spec.mutable_data()->set_path(path);
  return spec;
}

TEST(WorkloadTest, SasRecLossFallsAndItRanksHeldOutItems) {
  const fitrun::v1::JobSpec spec = SasRecSpec(WriteFile("ratings.dat", SequentialRatings(400, 200, 1)));
  absl::StatusOr<TrainingRun> run = Train(spec, 80, 32, 5e-3);
  ASSERT_TRUE(run.ok()) << run.status();
  // Two binary cross-entropies start near 2 ln 2 = 1.39.
  EXPECT_GT(run->first_loss, 1.0);
  EXPECT_LT(run->last_loss, 0.6 * run->first_loss);
  // Ranking at random among 101 candidates hits the top 10 about 10% of the time.
  ASSERT_TRUE(run->result.has_test_accuracy);
  EXPECT_GT(run->result.test_accuracy, 0.5);
  ASSERT_FALSE(run->logs.empty());
  EXPECT_TRUE(absl::StrContains(run->logs.back(), "NDCG@10")) << run->logs.back();
}

TEST(WorkloadTest, TheGptRecommenderLearnsNextItemsAndRanksHeldOutItemsAsSasRecDoes) {
  fitrun::v1::JobSpec spec = GptSpec(WriteFile("ratings_gpt.dat", SequentialRatings(400, 200, 1)));
  spec.mutable_data()->set_kind(fitrun::v1::DATA_KIND_MOVIELENS);
  spec.mutable_model()->mutable_gpt()->set_context(10);
  absl::StatusOr<TrainingRun> run = Train(spec, 80, 32, 5e-3);
  ASSERT_TRUE(run.ok()) << run.status();
  // Uniform over the 200 items (and padding) starts near ln 201 = 5.3 nats.
  EXPECT_GT(run->first_loss, 4.5);
  EXPECT_LT(run->last_loss, 0.6 * run->first_loss);
  ASSERT_TRUE(run->result.has_test_accuracy);
  EXPECT_GT(run->result.test_accuracy, 0.5);
  EXPECT_DOUBLE_EQ(run->result.test_metrics.at("hr@10"), run->result.test_accuracy);
  EXPECT_GT(run->result.test_metrics.at("ndcg@10"), 0.2);
  EXPECT_LE(run->result.test_metrics.at("ndcg@10"), run->result.test_accuracy);

  fitrun::v1::JobSpec on_images = spec;
  on_images.mutable_data()->set_kind(fitrun::v1::DATA_KIND_FASHION_MNIST);
  EXPECT_TRUE(absl::StrContains(LoadWorkload(on_images, false).status().message(),
                                "spec.data.kind: gpt trains on text or movielens data (got fashion_mnist)"));
}

TEST(WorkloadTest, SasRecChecksItsConfigAndData) {
  const std::string path = WriteFile("few.dat", SequentialRatings(20, 200, 2));
  fitrun::v1::JobSpec bad_heads = SasRecSpec(path);
  bad_heads.mutable_model()->mutable_sasrec()->set_heads(3);
  EXPECT_TRUE(absl::StrContains(LoadWorkload(bad_heads, false).status().message(), "spec.model.sasrec.heads"));
  const std::string malformed = WriteFile("malformed.dat", "1::2::3::4\n1,2,3,4\n");
  absl::Status status = LoadWorkload(SasRecSpec(malformed), false).status();
  EXPECT_TRUE(absl::StrContains(status.message(), "spec.data.path")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "line 2")) << status;
}

}  // namespace
}  // namespace fitrun::worker
