#include "server/core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace fitrun::server {

absl::Status WriteFileAtomically(const std::string& path, const std::string& content, mode_t mode) {
  const std::string temporary = path + ".tmp";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot write ", temporary, ": ", std::strerror(errno)));
  // The umask may have narrowed a mode that asked for more; fchmod gives exactly `mode`.
  const bool written = ::fchmod(fd, mode) == 0 &&
                       ::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size()) &&
                       ::fsync(fd) == 0;
  const int error = errno;
  ::close(fd);
  if (!written || std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int rename_error = written ? errno : error;
    std::remove(temporary.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(rename_error)));
  }
  return absl::OkStatus();
}

}  // namespace fitrun::server
