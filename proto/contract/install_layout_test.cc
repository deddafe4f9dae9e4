#include "proto/contract/install_layout.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace fitrun::contract::layout {
namespace {

std::string MakeFile(const std::filesystem::path& path) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << "x";
  return path.string();
}

std::filesystem::path Scratch(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::filesystem::path dir = std::filesystem::path(tmp != nullptr ? tmp : "/tmp") / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(InstallLayout, FitrundInTheDebianPackageFindsTheWorkerUnderLibFitrun) {
  const std::filesystem::path usr = Scratch("package/usr");
  const std::string fitrund = MakeFile(usr / "bin/fitrund");
  const std::string worker = MakeFile(usr / "lib/fitrun" / kWorker);
  const std::string shim = MakeFile(usr / "lib/fitrun" / kCivetwebSslShim);
  EXPECT_EQ(std::filesystem::canonical(FindUnder(RootsOf(fitrund, false), kWorker)), worker);
  EXPECT_EQ(std::filesystem::canonical(FindUnder(RootsOf(fitrund, false), kCivetwebSslShim)), shim);
}

TEST(InstallLayout, FitrundInBazelsOutputTreeFindsTheWorkerBesideServer) {
  const std::filesystem::path bin = Scratch("bazel-bin");
  const std::string fitrund = MakeFile(bin / "server/fitrund");
  const std::string worker = MakeFile(bin / kWorker);
  EXPECT_EQ(std::filesystem::canonical(FindUnder(RootsOf(fitrund, false), kWorker)), worker);
}

TEST(InstallLayout, TheWorkerFindsItsLibraryAndPythonModuleInItsOwnRoot) {
  const std::filesystem::path root = Scratch("lib-fitrun");
  const std::string supervisor = MakeFile(root / kSupervisor);
  const std::string library = MakeFile(root / kMemoryLibrary);
  MakeFile(root / kPythonModule);
  EXPECT_EQ(std::filesystem::canonical(FindUnder(RootsOf(supervisor, true), kMemoryLibrary)), library);
  EXPECT_FALSE(FindUnder(RootsOf(supervisor, true), kPythonModule).empty());
}

TEST(InstallLayout, NothingFoundIsEmpty) {
  const std::filesystem::path root = Scratch("empty");
  EXPECT_EQ(FindUnder(RootsOf((root / "bin/fitrund").string(), false), kWorker), "");
}

}  // namespace
}  // namespace fitrun::contract::layout
