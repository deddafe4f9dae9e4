#include "server/core/specs/tensor_file.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/testing/temp_dir.h"

namespace fitrun::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Files written by the real torch.save (Debian's python3-torch), once for the whole test.
class TensorFileTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("tensor-file-test-");
    ASSERT_TRUE(dir_->ok());
    const std::string script = R"PY(
import collections, sys, torch
d = sys.argv[1]
torch.save({"inputs": torch.randn(6, 3), "target": torch.arange(6), "mask": torch.ones(6, 5, dtype=torch.bool),
            "half": torch.zeros(6, 2, dtype=torch.float16), "tokens": torch.zeros(6, 7, dtype=torch.int32)},
           d + "/dict.pt")
torch.save(collections.OrderedDict(x=torch.zeros(4, 2, 2)), d + "/ordered.pt")
torch.save({"w": torch.nn.Parameter(torch.zeros(3, 4)), "view": torch.arange(100)[10:30].view(4, 5)}, d + "/views.pt")
torch.save([torch.zeros(2)], d + "/list.pt")
torch.save({"x": torch.zeros(2), "n": 3}, d + "/not_tensor.pt")
torch.save({"x": torch.zeros(2, dtype=torch.complex64)}, d + "/complex.pt")
torch.save({"x": torch.zeros(2)}, d + "/legacy.pt", _use_new_zipfile_serialization=False)
torch.save({"big": torch.zeros(1000, 100)}, d + "/big.pt")
cycle = []
cycle.append(cycle)
torch.save({"x": cycle}, d + "/cycle.pt")
)PY";
    const std::string script_path = dir_->Join("write.py");
    std::ofstream(script_path) << script;
    const std::string command = "/usr/bin/python3 " + script_path + " " + dir_->path();
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  static std::string Dir() { return dir_->path(); }
  static std::string Path(const std::string& name) { return dir_->Join(name); }
  static std::string Bytes(const std::string& name) {
    std::ifstream in(Path(name), std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  static TempDir* dir_;
};
TempDir* TensorFileTest::dir_ = nullptr;

TEST_F(TensorFileTest, ReadsEveryTensorsDtypeAndShape) {
  absl::StatusOr<std::map<std::string, TensorInfo>> dict = ReadTensorDict(Path("dict.pt"));
  ASSERT_TRUE(dict.ok()) << dict.status();
  ASSERT_EQ(dict->size(), 5u);
  EXPECT_EQ(dict->at("inputs").Describe(), "float32 [6, 3]");
  EXPECT_EQ(dict->at("target").Describe(), "int64 [6]");
  EXPECT_EQ(dict->at("mask").Describe(), "bool [6, 5]");
  EXPECT_EQ(dict->at("half").Describe(), "float16 [6, 2]");
  EXPECT_EQ(dict->at("tokens").Describe(), "int32 [6, 7]");
  EXPECT_TRUE(dict->at("inputs").floating());
  EXPECT_TRUE(dict->at("target").integral());
  EXPECT_FALSE(dict->at("mask").integral());
  EXPECT_FALSE(dict->at("mask").floating());
}

TEST_F(TensorFileTest, OrderedDictsParametersAndViews) {
  absl::StatusOr<std::map<std::string, TensorInfo>> ordered = ReadTensorDict(Path("ordered.pt"));
  ASSERT_TRUE(ordered.ok()) << ordered.status();
  EXPECT_EQ(ordered->at("x").Describe(), "float32 [4, 2, 2]");
  absl::StatusOr<std::map<std::string, TensorInfo>> views = ReadTensorDict(Path("views.pt"));
  ASSERT_TRUE(views.ok()) << views.status();
  EXPECT_EQ(views->at("w").Describe(), "float32 [3, 4]");
  EXPECT_EQ(views->at("view").Describe(), "int64 [4, 5]");
}

TEST_F(TensorFileTest, AnythingButADictOfTensorsSaysWhatItFound) {
  EXPECT_THAT(ReadTensorDict(Path("list.pt")).status().message(), HasSubstr("it holds a list; save a dict of tensors"));
  EXPECT_THAT(ReadTensorDict(Path("not_tensor.pt")).status().message(), HasSubstr("'n' is an int, not a tensor"));
  EXPECT_THAT(ReadTensorDict(Path("complex.pt")).status().message(), HasSubstr("torch.ComplexFloatStorage"));
  EXPECT_THAT(ReadTensorDict(Path("legacy.pt")).status().message(), HasSubstr("_use_new_zipfile_serialization=False"));
  EXPECT_EQ(ReadTensorDict(Path("no-such-file.pt")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ReadTensorDict(Dir()).status().message(), HasSubstr("is not a regular file"));
  EXPECT_THAT(ParseTensorDict("hello").status().message(), HasSubstr("not a zip archive"));
}

// Found by tools/fuzz.sh (a leak under LeakSanitizer): a pickle can make a container that holds
// itself, which reference-counted values never freed. `bazel test --config=asan` checks the freeing.
TEST_F(TensorFileTest, ASelfContainingListIsRefusedAndFreed) {
  EXPECT_THAT(ReadTensorDict(Path("cycle.pt")).status().message(), HasSubstr("'x' is a list, not a tensor"));
}

TEST_F(TensorFileTest, ATruncatedFileIsRefused) {
  const std::string whole = Bytes("big.pt");
  ASSERT_TRUE(ParseTensorDict(whole).ok());
  // The central directory is at the end: cutting the file anywhere loses it or the tensor's bytes.
  for (size_t keep : {whole.size() - 1, whole.size() / 2, size_t{100}, size_t{0}}) {
    EXPECT_FALSE(ParseTensorDict(whole.substr(0, keep)).ok()) << keep;
  }
}

// The reader's input is untrusted: any mutation of a real file is refused or read, never a crash,
// a hang or an out-of-bounds access (run under the sanitizers, this is the fuzzer's seed corpus).
TEST_F(TensorFileTest, MutatedFilesNeverCrashTheReader) {
  const std::string whole = Bytes("dict.pt");
  std::mt19937 random(7);
  int refused = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string mutated = whole;
    const int flips = 1 + static_cast<int>(random() % 8);
    for (int f = 0; f < flips; ++f) mutated[random() % mutated.size()] = static_cast<char>(random());
    refused += ParseTensorDict(mutated).ok() ? 0 : 1;
  }
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace fitrun::server
