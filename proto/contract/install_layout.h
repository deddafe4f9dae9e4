// Where fitrun's programs find one another's files: one layout, the same in Bazel's output tree
// (bazel-bin/), in a runfiles tree, and in the Debian package (/usr/lib/fitrun/, tools/package.sh).
// Under a layout root:
//
//   worker/fitrun-worker                   the rank program fitrund starts (--worker_binary's default)
//   worker/fitrun-supervisor               what script ranks run under, beside the worker
//   worker/memory/libfitrun_memory.so      the capped allocator a script rank preloads
//   client/python/fitrun/                  the Python module a script rank imports (PYTHONPATH)
//   server/web/libfitrun-civetweb-ssl.so   what TLS on the metrics port loads
//
// fitrund finds the root from the folder it is in: ".." (bazel-bin/server/fitrund) or "../lib/fitrun"
// (/usr/bin/fitrund). The worker and the supervisor find it from theirs: ".." (worker/ is in the
// root), or their runfiles tree.
#ifndef FITRUN_PROTO_CONTRACT_INSTALL_LAYOUT_H_
#define FITRUN_PROTO_CONTRACT_INSTALL_LAYOUT_H_

#include <string>
#include <vector>

namespace fitrun::contract::layout {

// Relative to a layout root.
inline constexpr char kWorker[] = "worker/fitrun-worker";
inline constexpr char kSupervisor[] = "worker/fitrun-supervisor";
inline constexpr char kMemoryLibrary[] = "worker/memory/libfitrun_memory.so";
inline constexpr char kPythonPath[] = "client/python";
inline constexpr char kPythonModule[] = "client/python/fitrun/__init__.py";
inline constexpr char kCivetwebSslShim[] = "server/web/libfitrun-civetweb-ssl.so";

// Relative to the folder fitrund is in, in the order they are tried: Bazel's output tree, the package.
inline const std::vector<std::string>& FitrundRoots() {
  static const std::vector<std::string> roots = {"..", "../lib/fitrun"};
  return roots;
}

// The layout roots for a program at `program_path` (fitrund's, or the worker's and supervisor's:
// `from_worker`), in the order they are tried.
std::vector<std::string> RootsOf(const std::string& program_path, bool from_worker);

// The first `root/relative` that exists, or "" when none does.
std::string FindUnder(const std::vector<std::string>& roots, const std::string& relative);

}  // namespace fitrun::contract::layout

#endif  // FITRUN_PROTO_CONTRACT_INSTALL_LAYOUT_H_
