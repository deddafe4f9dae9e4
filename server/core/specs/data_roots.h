// Where fitrund may read what a spec names: the data, test, TorchScript and script paths must lie
// under one of the data roots (--data_roots), after every symbolic link and `..` is resolved. A
// spec is untrusted, and fitrund would otherwise read any file its user can (/etc/shadow) and train
// on it, or hand its bytes back through errors and logs. Checked before anything is opened.
#ifndef FITRUN_SERVER_CORE_SPECS_DATA_ROOTS_H_
#define FITRUN_SERVER_CORE_SPECS_DATA_ROOTS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fitrun/v1/job.pb.h"

namespace fitrun::server {

// Every path a spec names, with its field: the TorchScript file, the data and test paths, the
// script's working directory and file.
std::vector<std::pair<std::string, std::string>> SpecPaths(const fitrun::v1::JobSpec& spec);

// INVALID_ARGUMENT naming the field when a path the spec names lies under /proc, /sys or /dev, as
// written or once resolved, whatever the data roots: kernel and device files are never a spec's
// data (and /proc's magic links lead wherever a process points them).
absl::Status RefuseKernelPaths(const fitrun::v1::JobSpec& spec);

class DataRoots {
 public:
  // Each root is resolved once (a root that does not exist yet is kept as written, normalized).
  explicit DataRoots(const std::vector<std::string>& roots);

  const std::vector<std::string>& roots() const { return roots_; }
  // INVALID_ARGUMENT naming the first field whose path resolves outside every root, and the roots.
  absl::Status Check(const fitrun::v1::JobSpec& spec) const;

 private:
  std::vector<std::string> roots_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_SPECS_DATA_ROOTS_H_
