#include "server/core/specs/data_roots.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/specs/job_specs.h"
#include "server/core/errors.h"

namespace fitrun::server {
namespace {

// The path with every symbolic link of its existing part followed and `.`/`..` removed.
std::string Resolved(const std::string& path) {
  std::error_code error;
  const std::filesystem::path resolved = std::filesystem::weakly_canonical(path, error);
  return (error ? std::filesystem::path(path).lexically_normal() : resolved).string();
}

bool Under(const std::string& path, const std::string& root) {
  if (path == root) return true;
  const std::string prefix = root.back() == '/' ? root : root + "/";
  return path.compare(0, prefix.size(), prefix) == 0;
}

bool UnderKernelTree(const std::string& path) {
  for (const char* tree : {"/proc", "/sys", "/dev"}) {
    if (Under(path, tree)) return true;
  }
  return false;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> SpecPaths(const fitrun::v1::JobSpec& spec) {
  std::vector<std::pair<std::string, std::string>> paths;
  if (spec.has_model() && spec.model().kind_case() == fitrun::v1::ModelSpec::kTorchscript) {
    paths.emplace_back("spec.model.torchscript", spec.model().torchscript());
  }
  if (spec.has_data()) {
    paths.emplace_back("spec.data.path", spec.data().path());
    paths.emplace_back("spec.data.test_path", spec.data().test_path());
  }
  if (spec.has_script()) {
    const fitrun::v1::ScriptSpec& script = spec.script();
    paths.emplace_back("spec.script.working_dir", script.working_dir());
    if (std::optional<int> file = ScriptFileIndex(script); file.has_value()) {
      paths.emplace_back(absl::StrCat("spec.script.command[", *file, "]"),
                         (std::filesystem::path(script.working_dir()) / script.command(*file)).string());
    }
  }
  return paths;
}

absl::Status RefuseKernelPaths(const fitrun::v1::JobSpec& spec) {
  for (const auto& [field, path] : SpecPaths(spec)) {
    if (path.empty()) continue;
    const std::string written = std::filesystem::path(path).lexically_normal().string();
    const std::string resolved = Resolved(path);
    if (UnderKernelTree(written) || UnderKernelTree(resolved)) {
      return FieldError(field, absl::StrCat("'", path, "'", resolved != path ? absl::StrCat(" (", resolved, ")") : "",
                                            " is a kernel or device file; fitrund reads a spec's data from regular "
                                            "files only"));
    }
  }
  return absl::OkStatus();
}

DataRoots::DataRoots(const std::vector<std::string>& roots) {
  for (const std::string& root : roots) {
    if (!root.empty()) roots_.push_back(Resolved(std::filesystem::absolute(root).string()));
  }
}

absl::Status DataRoots::Check(const fitrun::v1::JobSpec& spec) const {
  const std::vector<std::pair<std::string, std::string>> paths = SpecPaths(spec);
  for (const auto& [field, path] : paths) {
    if (path.empty()) continue;
    const std::string resolved = Resolved(path);
    bool allowed = false;
    for (const std::string& root : roots_) allowed = allowed || Under(resolved, root);
    if (allowed) continue;
    return FieldError(field, absl::StrCat("'", path, "'", resolved != path ? absl::StrCat(" (", resolved, ")") : "",
                                          " is outside the folders fitrund may read (", absl::StrJoin(roots_, ", "),
                                          "); move it under one of them, or start fitrund with --data_roots "
                                          "naming its folder too"));
  }
  return absl::OkStatus();
}

}  // namespace fitrun::server
