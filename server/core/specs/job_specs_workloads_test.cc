// Specs of every workload kind: gpt on text, sasrec on MovieLens ratings, TorchScript modules, users'
// scripts, tensor files, and the Fashion-MNIST files each is checked against.
#include "server/core/specs/job_specs.h"
#include "server/core/specs/job_specs_testing.h"
#include "server/core/specs/workloads.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include "server/testing/temp_dir.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

// ---- the workload zoo: gpt on text, sasrec on MovieLens ratings, TorchScript modules -------------

std::string GptYaml(const std::string& text_path, const std::string& gpt = "{layers: 2, heads: 4, hidden: 128, context: 64}") {
  return "name: gpt\nmodel: {builtin: gpt, gpt: " + gpt + "}\ndata: {kind: text, path: " + text_path +
         "}\noptimizer: {kind: adamw, lr: 0.001}\nglobal_batch_size: 32\nmax_steps: 10\n";
}

TEST(JobSpecTest, GptSpecParsesItsConfig) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string text = dir.Write("gpt.txt", std::string(5000, 'a'));
  absl::StatusOr<fitrun::v1::JobSpec> spec =
      Normalize(GptYaml(text, "{layers: 3, heads: 4, hidden: 64, context: 32, tied_head: true, "
                              "activation_checkpointing: true}"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->model().gpt().activation_checkpointing());
  EXPECT_EQ(spec->model().builtin(), "gpt");
  EXPECT_EQ(spec->model().gpt().layers(), 3);
  EXPECT_EQ(spec->model().gpt().heads(), 4);
  EXPECT_EQ(spec->model().gpt().hidden(), 64);
  EXPECT_EQ(spec->model().gpt().context(), 32);
  EXPECT_TRUE(spec->model().gpt().tied_head());
  EXPECT_EQ(spec->data().kind(), fitrun::v1::DATA_KIND_TEXT);
}

TEST(JobSpecTest, GptConfigErrorsNameTheField) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string text = dir.Write("gpt.txt", std::string(5000, 'a'));
  absl::Status heads = Normalize(GptYaml(text, "{layers: 2, heads: 3, hidden: 128, context: 64}")).status();
  EXPECT_EQ(heads.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(heads.message(), HasSubstr("spec.model.gpt.heads: must divide hidden"));
  EXPECT_THAT(Normalize(GptYaml(text, "{layers: 0, heads: 4, hidden: 128, context: 64}")).status().message(),
              HasSubstr("spec.model.gpt.layers"));
  EXPECT_THAT(Normalize("name: g\nmodel: {builtin: gpt}\ndata: {kind: text, path: " + text +
                        "}\nglobal_batch_size: 8\nmax_steps: 1\n")
                  .status()
                  .message(),
              HasSubstr("spec.model.gpt: required"));
  EXPECT_THAT(Normalize(GptYaml(text, "{layers: 2, heads: 4, hidden: 128, context: 64, tied_head: maybe}"))
                  .status()
                  .message(),
              HasSubstr("spec.model.gpt.tied_head: expected true or false"));
  EXPECT_THAT(Normalize(GptYaml(text, "{layers: 2, heads: 4, hidden: 128, context: 64, activation_checkpointing: 1x}"))
                  .status()
                  .message(),
              HasSubstr("spec.model.gpt.activation_checkpointing: expected true or false"));
}

TEST(JobSpecTest, GptDataMustBeAnExistingLargeEnoughTextFile) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  absl::Status missing = Normalize(GptYaml("/nonexistent/corpus.txt")).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.message(), HasSubstr("spec.data.path: no file '/nonexistent/corpus.txt'"));

  // context 64 needs 10 * 65 + 10 = 660 bytes so the last 10% holds a window.
  const std::string small = dir.Write("small.txt", std::string(659, 'a'));
  EXPECT_THAT(Normalize(GptYaml(small)).status().message(), HasSubstr("needs at least 660"));
  const std::string enough = dir.Write("enough.txt", std::string(660, 'a'));
  EXPECT_TRUE(Normalize(GptYaml(enough)).ok());

  const std::string text = dir.Write("gpt.txt", std::string(5000, 'a'));
  std::string wrong_kind = GptYaml(text);
  wrong_kind.replace(wrong_kind.find("kind: text"), 10, "kind: fashion_mnist");
  EXPECT_THAT(Normalize(wrong_kind).status().message(),
              HasSubstr("spec.data.kind: model gpt trains on text or movielens data; set kind: text"));
}

TEST(JobSpecTest, SasRecSpecParsesAndChecksItsConfig) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string ratings = dir.Write("ratings.dat", "1::10::5::100\n1::11::4::101\n1::12::3::102\n");
  const std::string yaml = "name: rec\nmodel: {builtin: sasrec, sasrec: {max_len: 50, hidden: 64, blocks: 2, heads: HEADS}}\n"
                           "data: {kind: movielens, path: " + ratings + "}\noptimizer: {kind: adam, lr: 0.001}\nglobal_batch_size: 8\nepochs: 1\n";
  auto with_heads = [&](const std::string& heads) {
    std::string y = yaml;
    y.replace(y.find("HEADS"), 5, heads);
    return y;
  };
  absl::StatusOr<fitrun::v1::JobSpec> spec = Normalize(with_heads("1"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().sasrec().max_len(), 50);
  EXPECT_EQ(spec->model().sasrec().hidden(), 64);
  EXPECT_EQ(spec->model().sasrec().blocks(), 2);
  EXPECT_FALSE(spec->model().sasrec().activation_checkpointing());
  EXPECT_EQ(spec->data().kind(), fitrun::v1::DATA_KIND_MOVIELENS);
  spec = Normalize(with_heads("1, activation_checkpointing: true"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->model().sasrec().activation_checkpointing());
  EXPECT_THAT(Normalize(with_heads("3")).status().message(), HasSubstr("spec.model.sasrec.heads: must divide hidden"));

  std::string missing = with_heads("1");
  missing.replace(missing.find(ratings), ratings.size(), "/nonexistent/ratings.dat");
  EXPECT_THAT(Normalize(missing).status().message(), HasSubstr("spec.data.path: no file '/nonexistent/ratings.dat'"));
}

TEST(JobSpecTest, TorchScriptNeedsAFileAndFashionMnist) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string module = dir.Write("model.pt", "not checked here");
  const std::string yaml = "name: ts\nmodel: {torchscript: PATH}\n"
                           "data: {kind: fashion_mnist, path: /usr/share/datasets/fashion-mnist}\n"
                           "optimizer: {kind: sgd, lr: 0.05}\nglobal_batch_size: 8\nepochs: 1\n";
  auto at = [&](const std::string& path) {
    std::string y = yaml;
    y.replace(y.find("PATH"), 4, path);
    return y;
  };
  absl::StatusOr<fitrun::v1::JobSpec> spec = Normalize(at(module));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().torchscript(), module);
  EXPECT_THAT(Normalize(at("/nonexistent/model.pt")).status().message(),
              HasSubstr("spec.model.torchscript: no file '/nonexistent/model.pt'"));
  EXPECT_THAT(Normalize("name: x\nmodel: {builtin: mlp, gpt: {layers: 1}}\n"
                        "data: {kind: fashion_mnist, path: /usr/share/datasets/fashion-mnist}\n"
                        "global_batch_size: 8\nepochs: 1\n")
                  .status()
                  .message(),
              HasSubstr("spec.model.gpt: only for builtin gpt"));
}


// A script job whose working directory holds train.py, submitted from `client_dir`.
absl::StatusOr<fitrun::v1::JobSpec> NormalizeScript(const std::string& script_yaml, const std::string& client_dir) {
  absl::StatusOr<fitrun::v1::JobSpec> spec =
      ParseJobSpecYaml("name: s\nscript: " + script_yaml + "\nglobal_batch_size: 16\noptimizer: {lr: 0.001}\n");
  if (!spec.ok()) return spec.status();
  if (absl::Status resolved = ResolveClientPaths(*spec, client_dir); !resolved.ok()) return resolved;
  return NormalizeJobSpec(*spec);
}

TEST(JobSpecTest, AScriptSpecIsCheckedWhereItsRanksWillRunIt) {
  TempDir client_dir;
  ASSERT_TRUE(client_dir.ok());
  const std::string dir =
      std::filesystem::path(client_dir.Write("train.py", "print('hi')\n")).parent_path().string();
  absl::StatusOr<fitrun::v1::JobSpec> spec = NormalizeScript(
      "{command: [/usr/bin/python3, train.py, --epochs, '1'], working_dir: ., env: {OMP_NUM_THREADS: '1'}, "
      "batch_flag: --batch_size, grad_accum_flag: --accum}",
      dir);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->script().working_dir(), dir);  // resolved against the client's directory
  EXPECT_EQ(spec->script().grad_accum_flag(), "--accum");
  EXPECT_EQ(spec->script().env().at("OMP_NUM_THREADS"), "1");

  auto error = [&](const std::string& script) { return std::string(NormalizeScript(script, dir).status().message()); };
  EXPECT_THAT(error("{command: [no-such-python-here, train.py], working_dir: .}"),
              HasSubstr("spec.script.command[0]: 'no-such-python-here' is not on PATH"));
  EXPECT_THAT(error("{command: [/usr/bin/python3, missing.py], working_dir: .}"),
              HasSubstr("spec.script.command[1]: no file 'missing.py' in spec.script.working_dir"));
  EXPECT_THAT(error("{command: [/usr/bin/python3, train.py], working_dir: no/such/dir}"),
              HasSubstr("spec.script.working_dir"));
  EXPECT_THAT(error("{command: [/usr/bin/python3, train.py], working_dir: ., batch_flag: batch}"),
              HasSubstr("spec.script.batch_flag: a flag such as --batch_size"));
  EXPECT_THAT(error("{command: [/usr/bin/python3, train.py], working_dir: ., grad_accum_flag: accum}"),
              HasSubstr("spec.script.grad_accum_flag: a flag such as --grad_accum_steps"));
  EXPECT_THAT(error("{command: [/usr/bin/python3, train.py], working_dir: ., env: {RANK: '3'}}"),
              HasSubstr("spec.script.env.RANK: set by fitrun for every rank"));
  EXPECT_THAT(error("{command: [/usr/bin/python3, train.py], working_dir: ., env: {FITRUN_LR: '3'}}"),
              HasSubstr("spec.script.env.FITRUN_LR: set by fitrun for every rank"));
  EXPECT_THAT(error("{command: [], working_dir: .}"), HasSubstr("spec.script.command"));

  // A script's DDP is its own: fitrun's communication hooks are the built-in trainer's.
  spec = ParseJobSpecYaml("name: s\nscript: {command: [/usr/bin/python3, train.py], working_dir: " + dir +
                          "}\nglobal_batch_size: 16\noptimizer: {lr: 0.001}\nddp: {comm_hook: fp16}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(std::string(NormalizeJobSpec(*spec).status().message()),
              HasSubstr("spec.ddp.comm_hook: applies to fitrun's built-in training (got fp16 on a script job)"));
  spec = ParseJobSpecYaml("name: s\nscript: {command: [/usr/bin/python3, train.py], working_dir: " + dir +
                          "}\nglobal_batch_size: 16\noptimizer: {lr: 0.001}\nddp: {zero_stage: 1}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(std::string(NormalizeJobSpec(*spec).status().message()),
              HasSubstr("spec.ddp.zero_stage: a script shards its optimizer states itself: set "
                        "spec.script.applies_strategy: true"));
  // A script that applies the plan's strategy may have it pinned; one that does not, never.
  spec = ParseJobSpecYaml("name: s\nscript: {command: [/usr/bin/python3, train.py], working_dir: " + dir +
                          ", applies_strategy: true, activation_checkpointing: true}\nglobal_batch_size: 16\n"
                          "optimizer: {lr: 0.001}\nddp: {zero_stage: 1}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(NormalizeJobSpec(*spec).ok()) << NormalizeJobSpec(*spec).status();
  EXPECT_THAT(error("{command: [/usr/bin/python3, train.py], working_dir: ., activation_checkpointing: false}"),
              HasSubstr("spec.script.activation_checkpointing: only a script that applies the plan's strategy can "
                        "recompute its activations: set spec.script.applies_strategy: true"));
}


// Tensors datasets checked at submit from the files Python's torch.save writes (no LibTorch here).
class TensorsSpecTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("tensors-spec-test-");
    ASSERT_TRUE(dir_->ok());
    const std::string dir = std::filesystem::path(dir_->Write("tensors_write.py", R"PY(
import sys, torch
d = sys.argv[1]
x = torch.randn(40, 3)
classes = torch.randint(0, 4, (40,))
torch.save({"x": x, "mask": torch.ones(40, 5, dtype=torch.bool), "target": classes}, d + "/train.pt")
torch.save({"x": x[:8], "mask": torch.ones(8, 5, dtype=torch.bool), "target": classes[:8]}, d + "/test.pt")
torch.save({"x": x[:8], "mask": torch.ones(8, 4, dtype=torch.bool), "target": classes[:8]}, d + "/test_bad.pt")
torch.save({"x": x, "target": torch.randn(40)}, d + "/regression.pt")
torch.save({"x": x[:30], "target": classes}, d + "/uneven.pt")
torch.save({"inputs": x}, d + "/no_target.pt")
torch.save(x, d + "/bare_tensor.pt")
open(d + "/model.pt", "wb").write(b"only its size is read at submit")
)PY")).parent_path().string();
    const std::string command = "/usr/bin/python3 " + dir + "/tensors_write.py " + dir;
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string Yaml(const std::string& data, const std::string& extra = "") {
    return "name: t\nmodel: {torchscript: " + dir_->Join("model.pt") + "}\ndata: {kind: tensors, path: " +
           dir_->Join(data) + "}\noptimizer: {kind: adam, lr: 0.001}\nglobal_batch_size: 8\nepochs: 1\n" + extra;
  }
  static std::string Error(const std::string& yaml) { return std::string(Normalize(yaml).status().message()); }
  static TempDir* dir_;
};
TempDir* TensorsSpecTest::dir_ = nullptr;

TEST_F(TensorsSpecTest, AGoodFileGetsItsDefaultsAndALoss) {
  absl::StatusOr<fitrun::v1::JobSpec> spec = Normalize(Yaml("train.pt"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data().kind(), fitrun::v1::DATA_KIND_TENSORS);
  EXPECT_EQ(spec->data().target(), "target");
  EXPECT_DOUBLE_EQ(spec->data().test_fraction(), 0.1);
  EXPECT_EQ(spec->loss().kind(), fitrun::v1::LOSS_KIND_CROSS_ENTROPY);
  absl::StatusOr<fitrun::v1::JobSpec> mapped =
      Normalize(Yaml("train.pt", "loss: {kind: cross_entropy, ignore_index: -100}\n"));
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(mapped->loss().ignore_index(), -100);
  EXPECT_TRUE(Normalize(Yaml("regression.pt", "loss: mse\n")).ok());
  std::string with_test = Yaml("train.pt");
  with_test.replace(with_test.find("}\noptimizer"), 1, ", test_path: " + dir_->path() + "/test.pt, inputs: [mask, x]}");
  absl::StatusOr<fitrun::v1::JobSpec> tested = Normalize(with_test);
  ASSERT_TRUE(tested.ok()) << tested.status();
  EXPECT_FALSE(tested->data().has_test_fraction());
  EXPECT_EQ(tested->data().inputs_size(), 2);
}

TEST_F(TensorsSpecTest, EveryMalformedFileOrFieldIsRefusedNamingTheFieldAndWhatWasFound) {
  EXPECT_THAT(Error(Yaml("no_target.pt")),
              HasSubstr("spec.data.path: '" + dir_->path() + "/no_target.pt' has no tensor 'target' (it has inputs float32 "
                        "[40, 3]); name the target's key in spec.data.target"));
  EXPECT_THAT(Error(Yaml("train.pt").replace(Yaml("train.pt").find("}\noptimizer"), 1, ", target: label}")),
              HasSubstr("spec.data.target: '" + dir_->path() + "/train.pt' has no tensor 'label'"));
  EXPECT_THAT(Error(Yaml("train.pt").replace(Yaml("train.pt").find("}\noptimizer"), 1, ", inputs: [x, y]}")),
              HasSubstr("spec.data.inputs[1]: '" + dir_->path() + "/train.pt' has no tensor 'y'"));
  EXPECT_THAT(Error(Yaml("uneven.pt")), HasSubstr("'x' is float32 [30, 3] but 'target' is int64 [40]"));
  EXPECT_THAT(Error(Yaml("bare_tensor.pt")), HasSubstr("spec.data.path: '" + dir_->path() + "/bare_tensor.pt': it holds an "
                                                       "object made by torch._utils._rebuild_tensor_v2; save a dict"));
  EXPECT_THAT(Error(Yaml("model.pt")), HasSubstr("spec.data.path: '" + dir_->path() + "/model.pt': not a zip archive"));
  EXPECT_THAT(Error(Yaml("nothing.pt")), HasSubstr("spec.data.path: no file '" + dir_->path() + "/nothing.pt'"));
  EXPECT_THAT(Error(Yaml("train.pt").replace(Yaml("train.pt").find("}\noptimizer"), 1,
                                              ", test_path: " + dir_->path() + "/test_bad.pt}")),
              HasSubstr("spec.data.test_path: '" + dir_->path() + "/test_bad.pt' must hold 'mask' like the training file "
                        "(bool [40, 5] there, all with one sample count); it has bool [8, 4]"));
  EXPECT_THAT(Error(Yaml("train.pt").replace(Yaml("train.pt").find("}\noptimizer"), 1, ", test_fraction: 0.01}")),
              HasSubstr("spec.data.test_fraction: holds out no test sample of 40"));
  EXPECT_THAT(Error(Yaml("regression.pt")),
              HasSubstr("spec.loss: cross_entropy needs integer classes as its target; 'target' is float32 [40]. "
                        "For a regression set loss: mse"));
  EXPECT_THAT(Error(Yaml("train.pt", "loss: mse\n")), HasSubstr("needs a floating-point target; 'target' is int64 [40]"));
  EXPECT_THAT(Error(Yaml("regression.pt", "loss: {kind: mse, ignore_index: 0}\n")),
              HasSubstr("spec.loss.ignore_index: only for cross_entropy"));
  EXPECT_THAT(Error(Yaml("train.pt", "loss: hinge\n")), HasSubstr("spec.loss"));
  EXPECT_THAT(Error(std::string(kValidYaml) + "loss: mse\n"),
              HasSubstr("spec.loss: only for torchscript models; the builtin mlp trains with its own loss"));
}

TEST(JobSpecTest, RelativeDataAndModelPathsAreTheClients) {
  absl::StatusOr<fitrun::v1::JobSpec> spec = ParseJobSpecYaml(
      "name: t\nmodel: {torchscript: models/m.pt}\ndata: {kind: tensors, path: data/train.pt, test_path: "
      "./data/../data/test.pt}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(ResolveClientPaths(*spec, "/home/me/project").ok());
  EXPECT_EQ(spec->model().torchscript(), "/home/me/project/models/m.pt");
  EXPECT_EQ(spec->data().path(), "/home/me/project/data/train.pt");
  EXPECT_EQ(spec->data().test_path(), "/home/me/project/data/test.pt");
  fitrun::v1::JobSpec relative = *ParseJobSpecYaml("name: t\ndata: {kind: tensors, path: x.pt}\n");
  EXPECT_THAT(ResolveClientPaths(relative, "").message(),
              HasSubstr("spec.data.path: 'x.pt' is relative and the request gave no client_dir"));
}

// A gzipped IDX file of `dims` holding only its header (admission reads no further), or `raw` as is.
void WriteGzipped(const std::string& path, int type_code, const std::vector<uint32_t>& dims, const std::string& raw = "") {
  std::string bytes = raw;
  if (raw.empty()) {
    bytes = {0, 0, static_cast<char>(type_code), static_cast<char>(dims.size())};
    for (uint32_t d : dims) {
      for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<char>((d >> shift) & 0xff));
    }
  }
  gzFile out = gzopen(path.c_str(), "wb");
  ASSERT_NE(out, nullptr);
  ASSERT_EQ(gzwrite(out, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  gzclose(out);
}

// A Fashion-MNIST directory of `train` and `test` images (and as many labels, unless told otherwise).
std::string FashionMnistDir(const TempDir& parent, const std::string& name, uint32_t train, uint32_t test,
                            uint32_t train_labels = 0) {
  const std::string dir = parent.Join(name);
  std::filesystem::create_directories(dir);
  WriteGzipped(dir + "/train-images-idx3-ubyte.gz", 0x08, {train, 28, 28});
  WriteGzipped(dir + "/train-labels-idx1-ubyte.gz", 0x08, {train_labels > 0 ? train_labels : train});
  WriteGzipped(dir + "/t10k-images-idx3-ubyte.gz", 0x08, {test, 28, 28});
  WriteGzipped(dir + "/t10k-labels-idx1-ubyte.gz", 0x08, {test});
  return dir;
}

absl::StatusOr<fitrun::v1::JobSpec> OnImagesAt(const std::string& dir) {
  std::string yaml = kValidYaml;
  yaml.replace(yaml.find("/usr/share/datasets/fashion-mnist"), 33, dir);
  return Normalize(yaml);
}

TEST(JobSpecTest, TheTrainingImagesAreCountedFromTheirIdxHeader) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  absl::StatusOr<fitrun::v1::JobSpec> full = Normalize(kValidYaml);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->file_facts().image_samples(), 60000) << "Debian's dataset-fashion-mnist";
  // A subset (the GPU kit carries 20,000 of the images) is an epoch of its own size.
  absl::StatusOr<fitrun::v1::JobSpec> subset = OnImagesAt(FashionMnistDir(dir, "subset", 20000, 1000));
  ASSERT_TRUE(subset.ok()) << subset.status();
  EXPECT_EQ(subset->file_facts().image_samples(), 20000);
  EXPECT_EQ(ProfileFor(*subset)->train_samples, 20000);
}

TEST(JobSpecTest, FashionMnistFilesThatAreNotItsIdxAreRefusedNamingTheFile) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  EXPECT_THAT(OnImagesAt(FashionMnistDir(dir, "labels", 20000, 1000, /*train_labels=*/19999)).status().message(),
              HasSubstr("the train images file has 20000 images and its labels file 19999 labels"));
  const std::string wrong_shape = FashionMnistDir(dir, "shape", 100, 10);
  WriteGzipped(wrong_shape + "/train-images-idx3-ubyte.gz", 0x08, {100, 32, 32});
  EXPECT_THAT(OnImagesAt(wrong_shape).status().message(),
              HasSubstr("train-images-idx3-ubyte.gz' is not Fashion-MNIST's images (unsigned bytes, N x 28 x 28): its "
                        "IDX header says type 0x8, dimensions 100 x 32 x 32"));
  const std::string text = FashionMnistDir(dir, "text", 100, 10);
  WriteGzipped(text + "/t10k-labels-idx1-ubyte.gz", 0, {}, "user::item::rating\n");
  EXPECT_THAT(OnImagesAt(text).status().message(), HasSubstr("t10k-labels-idx1-ubyte.gz' is not an IDX file"));
  const std::string plain = FashionMnistDir(dir, "plain", 100, 10);
  std::ofstream(plain + "/train-labels-idx1-ubyte.gz") << "not gzip at all";
  EXPECT_THAT(OnImagesAt(plain).status().message(), HasSubstr("spec.data.path: '"));
  EXPECT_THAT(OnImagesAt(plain).status().message(), HasSubstr("train-labels-idx1-ubyte.gz' is not"));
}

}  // namespace
}  // namespace fitrun::server
