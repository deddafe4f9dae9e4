#include "proto/contract/install_layout.h"

#include <sys/stat.h>

namespace fitrun::contract::layout {
namespace {

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

std::vector<std::string> RootsOf(const std::string& program_path, bool from_worker) {
  const std::string dir = Dirname(program_path);
  if (from_worker) {
    // bazel-bin/worker/fitrun-worker with its runfiles, or worker/ in a root (Bazel's, a runfiles
    // tree's, the package's).
    return {program_path + ".runfiles/fitrun", dir + "/.."};
  }
  std::vector<std::string> roots;
  for (const std::string& relative : FitrundRoots()) roots.push_back(dir + "/" + relative);
  return roots;
}

std::string FindUnder(const std::vector<std::string>& roots, const std::string& relative) {
  for (const std::string& root : roots) {
    const std::string candidate = root + "/" + relative;
    struct stat st {};
    if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return candidate;
  }
  return "";
}

}  // namespace fitrun::contract::layout
