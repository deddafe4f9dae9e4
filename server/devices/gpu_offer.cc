#include "server/devices/gpu_offer.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/core/units.h"
#include "server/devices/virtual_cpu_devices.h"

namespace fitrun::server {
namespace {

constexpr char kForm[] = "GPUs as cuda:N (whole), cuda:N@SIZE (a slice) or cuda:N@SIZExCOUNT (slices), "
                         "comma-separated, e.g. cuda:0@2GiB,cuda:1";

absl::Status Malformed(absl::string_view part, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--devices: '", part, "' ", why, "; expected ", kForm));
}

}  // namespace

bool NamesGpus(absl::string_view flag) {
  return absl::StartsWith(flag, "cuda:") || absl::StartsWith(flag, "gpu:");
}

absl::StatusOr<std::vector<GpuOfferItem>> ParseGpuOffer(absl::string_view flag) {
  std::vector<GpuOfferItem> items;
  std::set<int> seen;
  for (absl::string_view part : absl::StrSplit(flag, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    absl::string_view rest = part;
    if (!absl::ConsumePrefix(&rest, "cuda:") && !absl::ConsumePrefix(&rest, "gpu:")) {
      return Malformed(part, "does not name a GPU");
    }
    GpuOfferItem item;
    const std::vector<absl::string_view> at = absl::StrSplit(rest, absl::MaxSplits('@', 1));
    if (!absl::SimpleAtoi(at[0], &item.index) || item.index < 0 || item.index > 1023) {
      return Malformed(part, "needs a GPU index from 0 to 1023 after 'cuda:'");
    }
    if (at.size() == 2) {
      absl::string_view size = at[1];
      if (const size_t x = size.rfind('x'); x != absl::string_view::npos) {
        if (!absl::SimpleAtoi(size.substr(x + 1), &item.count) || item.count < 1 || item.count > 64) {
          return Malformed(part, "needs a slice count from 1 to 64 after 'x'");
        }
        size = size.substr(0, x);
      }
      absl::StatusOr<int64_t> bytes = ParseByteSize(size);
      if (!bytes.ok()) return Malformed(part, absl::StrCat("has a slice size that is not one: ", bytes.status().message()));
      item.slice_bytes = *bytes;
    }
    if (!seen.insert(item.index).second) {
      return Malformed(part, absl::StrCat("offers cuda:", item.index,
                                          " a second time; give each GPU once (cuda:N@SIZExCOUNT for several slices)"));
    }
    items.push_back(item);
  }
  if (items.empty()) return Malformed(flag, "names no GPU");
  return items;
}

absl::StatusOr<std::unique_ptr<GpuOffer>> GpuOffer::Create(std::vector<GpuOfferItem> items,
                                                           std::unique_ptr<DeviceInventory> gpus) {
  std::map<std::string, fitrun::v1::Device> by_id;
  for (fitrun::v1::Device& device : gpus->Snapshot()) by_id[device.id()] = std::move(device);
  for (const GpuOfferItem& item : items) {
    const std::string id = absl::StrCat("cuda:", item.index);
    auto it = by_id.find(id);
    if (it == by_id.end()) {
      return absl::InvalidArgumentError(absl::StrCat("--devices: ", id, ", but NVML sees ", by_id.size(),
                                                     " GPU(s)", by_id.empty() ? "" : " (cuda:0 and up)",
                                                     "; name one of those"));
    }
    const int64_t asked = item.slice_bytes * item.count;
    if (item.slice_bytes > 0 && asked > it->second.total_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--devices: cuda:", item.index, "@", FormatBytes(item.slice_bytes),
          item.count > 1 ? absl::StrCat("x", item.count) : "", " asks for ", FormatBytes(asked), " of ", id, " (",
          it->second.name(), "), which has ", FormatBytes(it->second.total_bytes()),
          "; offer smaller or fewer slices"));
    }
  }
  return std::unique_ptr<GpuOffer>(new GpuOffer(std::move(items), std::move(gpus)));
}

std::vector<fitrun::v1::Device> GpuOffer::Snapshot() {
  std::map<std::string, fitrun::v1::Device> by_id;
  for (fitrun::v1::Device& device : gpus_->Snapshot()) by_id[device.id()] = std::move(device);
  std::vector<fitrun::v1::Device> offered;
  for (const GpuOfferItem& item : items_) {
    auto it = by_id.find(absl::StrCat("cuda:", item.index));
    if (it == by_id.end()) continue;  // Create checked it; a GPU NVML lost meanwhile is not offered
    if (item.slice_bytes == 0) {
      offered.push_back(it->second);
      continue;
    }
    for (int k = 0; k < item.count; ++k) {
      fitrun::v1::Device slice = it->second;
      if (item.count > 1) slice.set_id(absl::StrCat(it->second.id(), "#", k));
      slice.set_slice_bytes(item.slice_bytes);
      slice.set_total_bytes(item.slice_bytes);
      slice.set_free_bytes(std::min(item.slice_bytes, it->second.free_bytes()));
      offered.push_back(std::move(slice));
    }
  }
  return offered;
}

}  // namespace fitrun::server
