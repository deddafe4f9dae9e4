#include "server/core/specs/data_roots.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/testing/temp_dir.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

class DataRootsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    base_ = dir_.path();
    std::filesystem::create_directories(base_ / "root" / "project");
    std::filesystem::create_directories(base_ / "elsewhere");
    std::ofstream(base_ / "root" / "project" / "train.pt") << "x";
    std::ofstream(base_ / "elsewhere" / "secret.pt") << "x";
    // A link inside the root that leads out of it, and one that stays inside.
    std::filesystem::create_symlink(base_ / "elsewhere" / "secret.pt", base_ / "root" / "escape.pt");
    std::filesystem::create_symlink(base_ / "root" / "project" / "train.pt", base_ / "root" / "alias.pt");
  }

  fitrun::v1::JobSpec Tensors(const std::string& path) const {
    fitrun::v1::JobSpec spec;
    spec.mutable_model()->set_torchscript((base_ / "root" / "project" / "model.pt").string());
    spec.mutable_data()->set_path(path);
    return spec;
  }

  std::string Error(const fitrun::v1::JobSpec& spec) const {
    return std::string(DataRoots({(base_ / "root").string(), "/usr/share/datasets"}).Check(spec).message());
  }

  TempDir dir_;
  std::filesystem::path base_;
};

TEST_F(DataRootsTest, PathsUnderARootPassWhetherOrNotTheyExistYet) {
  DataRoots roots({(base_ / "root").string()});
  EXPECT_TRUE(roots.Check(Tensors((base_ / "root" / "project" / "train.pt").string())).ok());
  EXPECT_TRUE(roots.Check(Tensors((base_ / "root" / "alias.pt").string())).ok());
  EXPECT_TRUE(roots.Check(Tensors((base_ / "root" / "not-yet.pt").string())).ok());
}

TEST_F(DataRootsTest, SystemFilesLinksOutAndDotDotEscapesAreRefusedNamingTheField) {
  EXPECT_THAT(Error(Tensors("/etc/shadow")),
              HasSubstr("spec.data.path: '/etc/shadow' is outside the folders fitrund may read (" +
                        (base_ / "root").string() + ", /usr/share/datasets)"));
  EXPECT_THAT(Error(Tensors((base_ / "root" / "escape.pt").string())),
              HasSubstr("(" + (base_ / "elsewhere" / "secret.pt").string() + ") is outside"));
  EXPECT_THAT(Error(Tensors((base_ / "root" / ".." / "elsewhere" / "secret.pt").string())),
              HasSubstr("spec.data.path:"));
  // A root's name as a prefix of another folder is not that root.
  std::filesystem::create_directories(base_ / "rootless");
  EXPECT_THAT(Error(Tensors((base_ / "rootless" / "x.pt").string())), HasSubstr("is outside"));
  fitrun::v1::JobSpec model = Tensors((base_ / "root" / "project" / "train.pt").string());
  model.mutable_model()->set_torchscript("/etc/passwd");
  EXPECT_THAT(Error(model), HasSubstr("spec.model.torchscript: '/etc/passwd'"));
  fitrun::v1::JobSpec test = Tensors((base_ / "root" / "project" / "train.pt").string());
  test.mutable_data()->set_test_path("/proc/self/environ");
  EXPECT_THAT(Error(test), HasSubstr("spec.data.test_path:"));
}

TEST_F(DataRootsTest, AScriptsDirectoryAndFileAreChecked) {
  fitrun::v1::JobSpec spec;
  spec.mutable_script()->add_command("/usr/bin/python3");
  spec.mutable_script()->add_command("../../elsewhere/secret.pt");
  spec.mutable_script()->set_working_dir((base_ / "root" / "project").string());
  EXPECT_THAT(Error(spec), HasSubstr("spec.script.command[1]:"));
  spec.mutable_script()->set_command(1, "train.py");
  EXPECT_TRUE(DataRoots({(base_ / "root").string()}).Check(spec).ok());
  spec.mutable_script()->set_working_dir("/etc");
  EXPECT_THAT(Error(spec), HasSubstr("spec.script.working_dir: '/etc'"));
}

}  // namespace
}  // namespace fitrun::server
