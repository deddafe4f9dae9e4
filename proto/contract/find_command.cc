#include "proto/contract/find_command.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace fitrun::contract::launch {
namespace {

// AT_EACCESS: checked with the thread's effective (file-system) ids, so that a thread reading as a
// job's account (server/sandbox FileAccessAs) asks whether that account may run it; access()
// would ask whether root may.
bool IsExecutableFile(const std::string& path) {
  std::error_code error;
  return std::filesystem::is_regular_file(path, error) && faccessat(AT_FDCWD, path.c_str(), X_OK, AT_EACCESS) == 0;
}

}  // namespace

absl::StatusOr<std::string> FindCommand(const std::string& name, const std::string& working_dir) {
  if (name.empty()) return absl::InvalidArgumentError("empty; name a program such as /usr/bin/python3");
  if (name.find('/') != std::string::npos) {
    const std::string path = name[0] == '/' || working_dir.empty() ? name : absl::StrCat(working_dir, "/", name);
    if (IsExecutableFile(path)) return path;
    return absl::NotFoundError(absl::StrCat("'", path, "' is not an executable file"));
  }
  const char* path_env = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path_env != nullptr ? path_env : "/usr/bin:/bin", ':')) {
    const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    if (IsExecutableFile(candidate)) return candidate;
  }
  return absl::NotFoundError(absl::StrCat("'", name, "' is not on PATH (", path_env != nullptr ? path_env : "",
                                          "); give its absolute path"));
}

}  // namespace fitrun::contract::launch
