// NVML, NVIDIA's management library, as fitrund's device inventory and a rank's GPU memory gauge load
// it: at run time (nothing links against the driver), with the slice of its ABI they call declared
// by each of them, since no nvml.h ships on the build machines (layouts and signatures follow
// NVIDIA's nvml.h).
#ifndef FITRUN_PROTO_CONTRACT_NVML_LIBRARY_H_
#define FITRUN_PROTO_CONTRACT_NVML_LIBRARY_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fitrun::contract {

// NVML's nvmlReturn_t and the codes the callers test.
using NvmlReturn = int;
inline constexpr NvmlReturn kNvmlSuccess = 0;
inline constexpr NvmlReturn kNvmlErrorInsufficientSize = 7;
// nvmlDevice_t.
using NvmlDevice = struct nvmlDevice_st*;

// A loaded libnvidia-ml: the caller resolves the entry points it calls, then initializes NVML once;
// the destructor shuts NVML down (if initialized) and unloads the library.
class NvmlLibrary {
 public:
  // Loads `path` and resolves nvmlErrorString, nvmlInit_v2 and nvmlShutdown. NotFound naming the
  // path and the loader's reason when it cannot be loaded; FailedPrecondition when one is missing.
  static absl::StatusOr<std::unique_ptr<NvmlLibrary>> Load(const std::string& path);
  ~NvmlLibrary();

  NvmlLibrary(const NvmlLibrary&) = delete;
  NvmlLibrary& operator=(const NvmlLibrary&) = delete;

  // Resolves `name` into `fn`; FailedPrecondition when the driver is older than that entry point.
  template <typename Fn>
  absl::Status Resolve(const char* name, Fn* fn) const {
    void* symbol = nullptr;
    absl::Status status = Find(name, &symbol);
    *fn = reinterpret_cast<Fn>(symbol);
    return status;
  }
  // nvmlInit_v2, once every entry point is resolved.
  absl::Status Init();
  // "CALL failed: REASON (NVML error CODE)", REASON being nvmlErrorString's.
  absl::Status Error(absl::string_view call, NvmlReturn code) const;
  const std::string& path() const { return path_; }

 private:
  explicit NvmlLibrary(std::string path) : path_(std::move(path)) {}
  absl::Status Find(const char* name, void** symbol) const;

  const std::string path_;
  void* handle_ = nullptr;
  bool initialized_ = false;
  NvmlReturn (*init_)() = nullptr;
  NvmlReturn (*shutdown_)() = nullptr;
  const char* (*error_string_)(NvmlReturn) = nullptr;
};

}  // namespace fitrun::contract

#endif  // FITRUN_PROTO_CONTRACT_NVML_LIBRARY_H_
