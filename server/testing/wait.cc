#include "server/testing/wait.h"

#include <fcntl.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace fitrun::server {

bool WaitUntil(const std::function<bool()>& condition, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

bool ProcessGone(pid_t pid) {
  // read(2), not a stream: the file can vanish between the open and the read.
  const int fd = open(absl::StrCat("/proc/", pid, "/stat").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  char buffer[512];
  const ssize_t n = read(fd, buffer, sizeof(buffer));
  close(fd);
  if (n <= 0) return true;
  // "pid (comm) S ...": the state follows the last ')', which a command name may itself contain.
  const std::string text(buffer, static_cast<size_t>(n));
  const size_t paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'Z';
}

}  // namespace fitrun::server
