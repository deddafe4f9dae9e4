#include "proto/contract/nvml_library.h"

#include <dlfcn.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace fitrun::contract {

absl::StatusOr<std::unique_ptr<NvmlLibrary>> NvmlLibrary::Load(const std::string& path) {
  // Made first so that its destructor undoes whatever succeeded if a later step fails.
  std::unique_ptr<NvmlLibrary> nvml(new NvmlLibrary(path));
  dlerror();
  nvml->handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (nvml->handle_ == nullptr) {
    const char* reason = dlerror();
    return absl::NotFoundError(absl::StrCat("cannot load NVML from '", path, "' (no NVIDIA driver on this machine?): ",
                                            reason != nullptr ? reason : "dlopen failed"));
  }
  for (absl::Status status : {nvml->Resolve("nvmlErrorString", &nvml->error_string_),
                              nvml->Resolve("nvmlInit_v2", &nvml->init_),
                              nvml->Resolve("nvmlShutdown", &nvml->shutdown_)}) {
    if (!status.ok()) return status;
  }
  return nvml;
}

NvmlLibrary::~NvmlLibrary() {
  if (initialized_) shutdown_();
  if (handle_ != nullptr) dlclose(handle_);
}

absl::Status NvmlLibrary::Find(const char* name, void** symbol) const {
  *symbol = dlsym(handle_, name);
  if (*symbol != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(path_, " has no ", name, "; the NVIDIA driver is older than the NVML calls fitrun uses"));
}

absl::Status NvmlLibrary::Init() {
  if (NvmlReturn code = init_(); code != kNvmlSuccess) return Error("nvmlInit_v2", code);
  initialized_ = true;
  return absl::OkStatus();
}

absl::Status NvmlLibrary::Error(absl::string_view call, NvmlReturn code) const {
  const char* reason = error_string_ != nullptr ? error_string_(code) : nullptr;
  return absl::InternalError(absl::StrCat(call, " failed: ", reason != nullptr ? reason : "unknown NVML error",
                                          " (NVML error ", code, ")"));
}

}  // namespace fitrun::contract
