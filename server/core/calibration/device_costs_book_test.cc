// The book of GPU costs: defaults until a run is recorded, then the highest reserve ratio and outside
// footprint the runs showed (3% above), per GPU model and allocator setting; implausible peaks are
// ignored; runs survive a restart through the file, a torn last line skipped.
#include "server/core/calibration/device_costs_book.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr char kH100[] = "NVIDIA H100 80GB HBM3";
constexpr char kExpandable[] = "expandable_segments:True";

TEST(DeviceCostsBookTest, DefaultsUntilARunThenWhatRunsShowed) {
  std::unique_ptr<DeviceCostsBook> book = *DeviceCostsBook::Create("");
  const DeviceCosts before = book->CostsFor("", kH100, kExpandable);
  EXPECT_DOUBLE_EQ(before.reserve_ratio, DefaultCudaCosts(kExpandable).reserve_ratio);
  // The cnn with Adam at batch 4000: 2151 MiB allocated, 1.14x reserved, 745 MiB beside.
  book->RecordRun("", kH100, kExpandable, {2151 * kMiB, 2452 * kMiB, 3197 * kMiB});
  book->RecordRun("", kH100, kExpandable, {1000 * kMiB, 1100 * kMiB, 1800 * kMiB});
  const DeviceCosts after = book->CostsFor("", kH100, kExpandable);
  EXPECT_NEAR(after.reserve_ratio, 2452.0 / 2151 * 1.03, 1e-9);
  EXPECT_NEAR(static_cast<double>(after.outside_allocator_bytes()), 745.0 * kMiB * 1.03, 2.0);
  EXPECT_GT(after.context_bytes, after.library_workspace_bytes) << "the defaults' proportions";
  EXPECT_THAT(after.source, HasSubstr("2 run(s) on NVIDIA H100 80GB HBM3"));
  // Another GPU model, or another allocator setting, has learned nothing.
  EXPECT_DOUBLE_EQ(book->CostsFor("", "NVIDIA A100", kExpandable).reserve_ratio,
                   DefaultCudaCosts(kExpandable).reserve_ratio);
  EXPECT_DOUBLE_EQ(book->CostsFor("", kH100, "").reserve_ratio, DefaultCudaCosts("").reserve_ratio);
}

TEST(DeviceCostsBookTest, PeaksThatCannotBeTrueTeachNothing) {
  std::unique_ptr<DeviceCostsBook> book = *DeviceCostsBook::Create("");
  book->RecordRun("", kH100, kExpandable, {0, 0, 0});                           // a CPU rank's report
  book->RecordRun("", kH100, kExpandable, {100 * kMiB, 50 * kMiB, 700 * kMiB});  // reserved below allocated
  book->RecordRun("", kH100, kExpandable, {100 * kMiB, 150 * kMiB, 120 * kMiB}); // device below reserved
  EXPECT_DOUBLE_EQ(book->CostsFor("", kH100, kExpandable).reserve_ratio, DefaultCudaCosts(kExpandable).reserve_ratio);
}

TEST(DeviceCostsBookTest, OneAccountsRunsTeachOnlyItsOwnPlansAcrossRestarts) {
  const std::string path = (std::filesystem::path(::testing::TempDir()) / "device_costs_accounts.tsv").string();
  std::filesystem::remove(path);
  {
    std::unique_ptr<DeviceCostsBook> book = *DeviceCostsBook::Create(path);
    // A reserve of 60 GB over 1 GB handed out: whatever alice's ranks claim stays alice's.
    book->RecordRun("alice", kH100, kExpandable, {1000 * kMiB, 60000 * kMiB, 61000 * kMiB});
  }
  std::unique_ptr<DeviceCostsBook> book = *DeviceCostsBook::Create(path);
  EXPECT_NEAR(book->CostsFor("alice", kH100, kExpandable).reserve_ratio, 60.0 * 1.03, 1e-9);
  EXPECT_DOUBLE_EQ(book->CostsFor("bob", kH100, kExpandable).reserve_ratio,
                   DefaultCudaCosts(kExpandable).reserve_ratio);
  EXPECT_DOUBLE_EQ(book->CostsFor("", kH100, kExpandable).reserve_ratio, DefaultCudaCosts(kExpandable).reserve_ratio);
}

TEST(DeviceCostsBookTest, RunsSurviveARestartAndATornLineIsSkipped) {
  const std::string path = (std::filesystem::path(::testing::TempDir()) / "device_costs.tsv").string();
  std::filesystem::remove(path);
  {
    std::unique_ptr<DeviceCostsBook> book = *DeviceCostsBook::Create(path);
    book->RecordRun("", kH100, kExpandable, {1000 * kMiB, 1200 * kMiB, 2000 * kMiB});
  }
  std::ofstream(path, std::ios::app) << "run\tNVIDIA H100 80GB HBM3\texpandable_segments:True\t10";  // torn
  std::unique_ptr<DeviceCostsBook> book = *DeviceCostsBook::Create(path);
  EXPECT_NEAR(book->CostsFor("", kH100, kExpandable).reserve_ratio, 1.2 * 1.03, 1e-9);
}

}  // namespace
}  // namespace fitrun::server
