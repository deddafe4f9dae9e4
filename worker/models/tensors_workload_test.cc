// TorchScript models on a user's own tensors (spec.data.kind: tensors): files written by the real
// torch.save and torch.jit.script (Debian's python3-torch; in worker/CMakeLists.txt's build, the
// FITRUN_TEST_PYTHON whose torch is the LibTorch the worker links), loaded and trained by the worker.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/tensors.h"
#include "worker/data/test_files.h"
#include "worker/ddp/bucketed_reducer.h"
#include "worker/ddp/process_group.h"
#include "worker/ddp/thread_ranks.h"
#include "worker/models/workload.h"
#include "worker/testing/trainer_options.h"
#include "worker/trainer/fake_progress_sink.h"
#include "worker/trainer/trainer.h"

namespace fitrun::worker {
namespace {

using ::testing::HasSubstr;

// The files every test reads, written once by Python as a user would.
class TensorsWorkloadTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testing::MakeTempDir("tensors_workload_test"));
    const std::string script = R"PY(
import collections, sys, torch
d = sys.argv[1]
g = torch.Generator().manual_seed(3)
n = 96
a = torch.randn(n, 3, generator=g)
b = torch.randn(n, 2, generator=g)
classes = ((a[:, 0] + b[:, 1]) > 0).long() + 2 * (a[:, 1] > 0).long()
torch.save({"a": a, "b": b, "target": classes}, d + "/two_inputs.pt")
torch.save({"a": a[:10], "b": b[:10], "target": classes[:10]}, d + "/test.pt")
torch.save({"a": a[:10], "b": b[:10, :1], "target": classes[:10]}, d + "/test_wrong_shape.pt")
torch.save({"a": a, "b": b[:50], "target": classes}, d + "/uneven.pt")
torch.save({"a": a, "label": classes}, d + "/other_key.pt")
torch.save({"a": a, "n": torch.tensor(3), "target": classes}, d + "/scalar.pt")
torch.save([a, classes], d + "/list.pt")

class TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(5, 16)
        self.fc2 = torch.nn.Linear(16, 4)
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(torch.cat([a, b], 1))))
    @torch.jit.export
    def compute_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(output, target) * 2.0

torch.manual_seed(0)
torch.jit.script(TwoInputs()).save(d + "/two_inputs_model.pt")
)PY";
    const std::string path = *dir_ + "/write.py";
    std::ofstream(path) << script;
    const char* python = std::getenv("FITRUN_TEST_PYTHON");
    const std::string command =
        absl::StrCat(python != nullptr ? python : "/usr/bin/python3", " ", path, " ", *dir_);
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }

  static std::string Path(const std::string& name) { return *dir_ + "/" + name; }

  static fitrun::v1::JobSpec Spec(const std::string& data = "two_inputs.pt") {
    fitrun::v1::JobSpec spec;
    spec.set_seed(5);
    spec.mutable_model()->set_torchscript(Path("two_inputs_model.pt"));
    spec.mutable_data()->set_kind(fitrun::v1::DATA_KIND_TENSORS);
    spec.mutable_data()->set_path(Path(data));
    spec.mutable_loss()->set_kind(fitrun::v1::LOSS_KIND_CROSS_ENTROPY);
    return spec;
  }

  static std::string* dir_;
};
std::string* TensorsWorkloadTest::dir_ = nullptr;

TrainerOptions Options(int rank, int world, int64_t batch, int accumulation) {
  TrainerOptions options = testing::SmallTrainerOptions(rank, world, batch, accumulation);
  options.total_steps = 10;
  options.seed = 7;
  return options;
}

double MaxAbsDifference(const torch::nn::Module& a, const torch::nn::Module& b) {
  double worst = 0;
  const std::vector<at::Tensor> pa = a.parameters();
  const std::vector<at::Tensor> pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) worst = std::max(worst, (pa[i] - pb[i]).abs().max().item<double>());
  return worst;
}

TEST_F(TensorsWorkloadTest, ATwoInputModelTrainsOnTheSpecsLossAndReportsItsTestFigures) {
  fitrun::v1::JobSpec spec = Spec();
  spec.mutable_data()->set_test_fraction(0.25);
  absl::StatusOr<Workload> workload = LoadWorkload(spec, /*with_test=*/true);
  ASSERT_TRUE(workload.ok()) << workload.status();
  // The inputs in sorted key order (a, b), 72 training and the last 24 test samples.
  ASSERT_EQ(workload->train.inputs.size(), 2u);
  EXPECT_EQ(workload->train.inputs[0].sizes(), (at::IntArrayRef{72, 3}));
  EXPECT_EQ(workload->train.inputs[1].sizes(), (at::IntArrayRef{72, 2}));
  EXPECT_EQ(workload->test->size(), 24);

  LocalGradientSynchronizer synchronizer;
  FakeProgressSink sink;
  TrainerOptions options = Options(0, 1, 24, 1);
  options.total_steps = 60;
  auto trainer = Trainer::Create(options, workload->model, workload->train, workload->test, &synchronizer, &sink);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  absl::StatusOr<TrainResult> result = (*trainer)->Run();
  ASSERT_TRUE(result.ok()) << result.status();
  const std::vector<StepProgress> progress = sink.progress();
  EXPECT_LT(progress.back().loss, 0.6 * progress.front().loss);
  ASSERT_TRUE(result->has_test_accuracy);  // cross_entropy: top-1 accuracy and the test loss
  EXPECT_GT(result->test_accuracy, 0.5);
  EXPECT_EQ(result->test_metrics.count("test_loss"), 1u);
}

TEST_F(TensorsWorkloadTest, InputsComeInTheSpecsOrderAndATestFileIsTheTestSplit) {
  fitrun::v1::JobSpec spec = Spec();
  spec.mutable_data()->add_inputs("b");
  spec.mutable_data()->add_inputs("a");
  spec.mutable_data()->set_test_path(Path("test.pt"));
  absl::StatusOr<TensorDataset> train = LoadTensors(spec.data(), Split::kTrain);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->size(), 96);  // all of it: the test split is its own file
  EXPECT_EQ(train->inputs[0].size(1), 2);  // b first
  absl::StatusOr<TensorDataset> test = LoadTensors(spec.data(), Split::kTest);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->size(), 10);
  // forward(a, b) given only a fails before any rendezvous, naming the model and what it was given.
  fitrun::v1::JobSpec one_input = Spec();
  one_input.mutable_data()->add_inputs("a");
  EXPECT_THAT(LoadWorkload(one_input, false).status().message(),
              HasSubstr("spec.model.torchscript: '" + Path("two_inputs_model.pt") +
                        "': forward must accept the dataset's inputs (Float [2, 3] for two samples)"));
}

TEST_F(TensorsWorkloadTest, MalformedFilesAndFieldsAreRefusedNamingTheField) {
  auto error = [](const fitrun::v1::JobSpec& spec) {
    return std::string(LoadTensors(spec.data(), Split::kTrain).status().message());
  };
  EXPECT_THAT(error(Spec("list.pt")), HasSubstr("spec.data.path: '" + Path("list.pt") + "' holds a GenericList, not a dict"));
  EXPECT_THAT(error(Spec("other_key.pt")), HasSubstr("has no tensor 'target' (it has a, label)"));
  fitrun::v1::JobSpec named = Spec("other_key.pt");
  named.mutable_data()->set_target("label");
  EXPECT_TRUE(LoadTensors(named.data(), Split::kTrain).ok());
  named.mutable_data()->add_inputs("missing");
  EXPECT_THAT(error(named), HasSubstr("spec.data.inputs[0]: '" + Path("other_key.pt") + "' has no tensor 'missing'"));
  EXPECT_THAT(error(Spec("uneven.pt")),
              HasSubstr("'b' is Float [50, 2] but 'target' is Long [96]; every tensor needs the same number of samples"));
  EXPECT_THAT(error(Spec("scalar.pt")), HasSubstr("'n' is a scalar"));
  EXPECT_THAT(error(Spec("no_such.pt")), HasSubstr("spec.data.path: cannot read"));
  fitrun::v1::JobSpec wrong_test = Spec();
  wrong_test.mutable_data()->set_test_path(Path("test_wrong_shape.pt"));
  EXPECT_THAT(std::string(LoadTensors(wrong_test.data(), Split::kTest).status().message()),
              HasSubstr("spec.data.test_path: '" + Path("test_wrong_shape.pt") + "' must hold 'b' like the training file"));
  fitrun::v1::JobSpec nothing_held_out = Spec();
  nothing_held_out.mutable_data()->set_test_fraction(0.001);
  EXPECT_THAT(std::string(LoadTensors(nothing_held_out.data(), Split::kTest).status().message()),
              HasSubstr("spec.data.test_fraction: holds out no test sample of 96"));
}

TEST_F(TensorsWorkloadTest, TheLossMustFitTheOutputAndTheModulesOwnLossIsUsed) {
  fitrun::v1::JobSpec mse = Spec();
  mse.mutable_loss()->set_kind(fitrun::v1::LOSS_KIND_MSE);
  EXPECT_THAT(LoadWorkload(mse, false).status().message(),
              HasSubstr("spec.loss: mse cannot compare the model's output (Float [2, 4] for inputs Float [2, 3], "
                        "Float [2, 2]) with the target (Long [2])"));
  fitrun::v1::JobSpec module = Spec();
  module.mutable_loss()->set_kind(fitrun::v1::LOSS_KIND_MODULE);
  absl::StatusOr<Workload> with_module = LoadWorkload(module, false);
  ASSERT_TRUE(with_module.ok()) << with_module.status();
  absl::StatusOr<Workload> with_cross_entropy = LoadWorkload(Spec(), false);
  ASSERT_TRUE(with_cross_entropy.ok());
  const TensorDataset rows = with_module->train.Slice(0, 8);
  // The module's compute_loss is twice cross-entropy.
  EXPECT_NEAR(with_module->model->Loss(rows.inputs, rows.targets).item<double>(),
              2 * with_cross_entropy->model->Loss(rows.inputs, rows.targets).item<double>(), 1e-6);
}

// The issue's definition of correct data parallelism, for a user's model on a user's tensors: 2
// ranks x B/2 end with the parameters of 1 rank x B.
TEST_F(TensorsWorkloadTest, TwoRanksMatchOneRankWithTheWholeBatch) {
  SkipUnlessCpuRanks(2);
  const fitrun::v1::JobSpec spec = Spec();
  absl::StatusOr<Workload> alone = LoadWorkload(spec, false);
  ASSERT_TRUE(alone.ok()) << alone.status();
  const std::string initial = ParameterChecksum(*alone->model);
  {
    LocalGradientSynchronizer local;
    FakeProgressSink sink;
    auto trainer = Trainer::Create(Options(0, 1, 16, 1), alone->model, alone->train, std::nullopt, &local, &sink);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    ASSERT_TRUE((*trainer)->Run().ok());
  }
  EXPECT_NE(ParameterChecksum(*alone->model), initial);  // training moved the weights

  const std::string store_path = testing::MakeTempDir("tensors_ddp") + "/store";
  std::vector<std::shared_ptr<Model>> models;
  for (int rank = 0; rank < 2; ++rank) {
    absl::StatusOr<Workload> workload = LoadWorkload(spec, false);
    ASSERT_TRUE(workload.ok());
    models.push_back(workload->model);
  }
  const TensorDataset train = *LoadTensors(spec.data(), Split::kTrain);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      auto store = c10::make_intrusive<c10d::FileStore>(store_path, 2);
      auto group = CreateGlooProcessGroup(store, rank, 2, absl::Seconds(20));
      ASSERT_TRUE(group.ok()) << group.status();
      ASSERT_TRUE(BroadcastModuleState(**group, *models[rank]).ok());
      auto reducer = BucketedReducer::Create(*group, models[rank]->parameters(), BucketedReducer::Options());
      ASSERT_TRUE(reducer.ok()) << reducer.status();
      FakeProgressSink sink;
      auto trainer = Trainer::Create(Options(rank, 2, 8, 1), models[rank], train, std::nullopt, reducer->get(), &sink);
      ASSERT_TRUE(trainer.ok()) << trainer.status();
      ASSERT_TRUE((*trainer)->Run().ok());
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(MaxAbsDifference(*models[0], *alone->model), 1e-5);
  EXPECT_EQ(ParameterChecksum(*models[0]), ParameterChecksum(*models[1]));
}

}  // namespace
}  // namespace fitrun::worker
