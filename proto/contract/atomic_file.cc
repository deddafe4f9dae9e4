#include "proto/contract/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace fitrun::contract {
namespace {

absl::Status WriteAll(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(std::strerror(errno));
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path, absl::Span<const absl::string_view> pieces, mode_t mode) {
  std::string name = path + ".tmp-XXXXXX";
  std::vector<char> temporary(name.begin(), name.end());
  temporary.push_back('\0');
  const int fd = ::mkostemp(temporary.data(), O_CLOEXEC);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot write ", name, ": ", std::strerror(errno)));
  name = temporary.data();
  absl::Status status;
  // mkostemp creates the file 0600; fchmod gives exactly `mode` (the umask does not apply to it).
  if (::fchmod(fd, mode) != 0) status = absl::UnavailableError(std::strerror(errno));
  for (absl::string_view piece : pieces) {
    if (status.ok()) status = WriteAll(fd, piece);
  }
  if (status.ok() && ::fsync(fd) != 0) status = absl::UnavailableError(std::strerror(errno));
  if (::close(fd) != 0 && status.ok()) status = absl::UnavailableError(std::strerror(errno));
  if (status.ok() && std::rename(name.c_str(), path.c_str()) != 0) {
    status = absl::UnavailableError(std::strerror(errno));
  }
  if (!status.ok()) {
    std::remove(name.c_str());
    return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", status.message()));
  }
  return absl::OkStatus();
}

}  // namespace fitrun::contract
