// The GPU offer: the flag's forms and every refusal naming what is wrong; whole GPUs and slices with
// their sizes and ids over a fake GPU inventory; slices that ask for more than the GPU holds, or a GPU
// NVML does not see, refused at start-up.
#include "server/devices/gpu_offer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

// Two 80 GiB GPUs with 79 GiB free.
class TwoGpus : public DeviceInventory {
 public:
  std::vector<fitrun::v1::Device> Snapshot() override {
    std::vector<fitrun::v1::Device> devices(2);
    for (int i = 0; i < 2; ++i) {
      devices[i].set_id(absl::StrCat("cuda:", i));
      devices[i].set_kind(fitrun::v1::DEVICE_KIND_CUDA);
      devices[i].set_name("NVIDIA H100 80GB HBM3");
      devices[i].set_total_bytes(80 * kGiB);
      devices[i].set_free_bytes(79 * kGiB);
    }
    return devices;
  }
};

TEST(GpuOfferTest, TheFlagsFormsAreRead) {
  EXPECT_TRUE(NamesGpus("cuda:0"));
  EXPECT_FALSE(NamesGpus("cpu:2x2GiB"));
  absl::StatusOr<std::vector<GpuOfferItem>> items = ParseGpuOffer("cuda:0@2GiBx3, cuda:1");
  ASSERT_TRUE(items.ok()) << items.status();
  ASSERT_EQ(items->size(), 2u);
  EXPECT_EQ((*items)[0].index, 0);
  EXPECT_EQ((*items)[0].slice_bytes, 2 * kGiB);
  EXPECT_EQ((*items)[0].count, 3);
  EXPECT_EQ((*items)[1].slice_bytes, 0);
}

TEST(GpuOfferTest, MalformedOffersAreRefusedNamingThePart) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"cuda:", "needs a GPU index"},
      {"cuda:x@2GiB", "needs a GPU index"},
      {"cuda:0@2", "slice size that is not one"},
      {"cuda:0@2GiBx0", "slice count from 1 to 64"},
      {"cuda:0,cuda:0@1GiB", "offers cuda:0 a second time"},
      {"cuda:0,cpu:1", "'cpu:1' does not name a GPU"},
  };
  for (const auto& [flag, why] : cases) {
    const absl::Status status = ParseGpuOffer(flag).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << flag;
    EXPECT_THAT(status.message(), HasSubstr(why)) << flag;
    EXPECT_THAT(status.message(), HasSubstr("--devices:")) << flag;
  }
}

TEST(GpuOfferTest, WholeGpusAndSlicesBecomeDevicesOfTheirOwn) {
  absl::StatusOr<std::unique_ptr<GpuOffer>> offer =
      GpuOffer::Create(*ParseGpuOffer("cuda:0@2GiBx2,cuda:1"), std::make_unique<TwoGpus>());
  ASSERT_TRUE(offer.ok()) << offer.status();
  const std::vector<fitrun::v1::Device> devices = (*offer)->Snapshot();
  ASSERT_EQ(devices.size(), 3u);
  EXPECT_EQ(devices[0].id(), "cuda:0#0");
  EXPECT_EQ(devices[1].id(), "cuda:0#1");
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(devices[i].slice_bytes(), 2 * kGiB);
    EXPECT_EQ(devices[i].total_bytes(), 2 * kGiB);
    EXPECT_EQ(devices[i].free_bytes(), 2 * kGiB);
    EXPECT_EQ(devices[i].name(), "NVIDIA H100 80GB HBM3");
  }
  EXPECT_EQ(devices[2].id(), "cuda:1");
  EXPECT_EQ(devices[2].slice_bytes(), 0);
  EXPECT_EQ(devices[2].total_bytes(), 80 * kGiB);
  // One slice of a GPU keeps the GPU's id.
  EXPECT_EQ((*GpuOffer::Create(*ParseGpuOffer("cuda:1@1GiB"), std::make_unique<TwoGpus>()))->Snapshot()[0].id(),
            "cuda:1");
}

TEST(GpuOfferTest, ImpossibleOffersAreRefusedAtStartUp) {
  absl::Status missing = GpuOffer::Create(*ParseGpuOffer("cuda:2"), std::make_unique<TwoGpus>()).status();
  EXPECT_THAT(missing.message(), HasSubstr("--devices: cuda:2, but NVML sees 2 GPU(s)"));
  absl::Status too_large = GpuOffer::Create(*ParseGpuOffer("cuda:0@30GiBx3"), std::make_unique<TwoGpus>()).status();
  EXPECT_THAT(too_large.message(), HasSubstr("asks for 90.00 GiB of cuda:0 (NVIDIA H100 80GB HBM3), which has 80.00 GiB"));
}

}  // namespace
}  // namespace fitrun::server
