#include "server/sandbox/unix_account.h"

#include <grp.h>
#include <pwd.h>
#include <linux/capability.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace fitrun::server {
namespace {

// The raw system calls: glibc's setgroups() changes every thread of the process (POSIX says the
// ids are per process), and only this thread's must change.
int ThreadSetGroups(const std::vector<gid_t>& groups) {
  return static_cast<int>(syscall(SYS_setgroups, groups.size(), groups.data()));
}

// This thread's capabilities (capget and capset on thread id 0 act on the calling thread only), as
// {effective, permitted, inheritable} of each of the two 32-bit words.
bool ThreadCapabilities(uint32_t words[6]) {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &header, data) != 0) return false;
  for (int i = 0; i < 2; ++i) {
    words[3 * i] = data[i].effective;
    words[3 * i + 1] = data[i].permitted;
    words[3 * i + 2] = data[i].inheritable;
  }
  return true;
}

bool SetThreadCapabilities(const uint32_t words[6]) {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  for (int i = 0; i < 2; ++i) {
    data[i].effective = words[3 * i];
    data[i].permitted = words[3 * i + 1];
    data[i].inheritable = words[3 * i + 2];
  }
  return syscall(SYS_capset, &header, data) == 0;
}

}  // namespace

absl::StatusOr<UnixAccount> LookUpUnixAccount(const std::string& name) {
  long size = sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buffer(size > 0 ? static_cast<size_t>(size) : 16384);
  passwd entry{};
  passwd* found = nullptr;
  int rc;
  while ((rc = getpwnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found)) == ERANGE) {
    buffer.resize(buffer.size() * 2);
  }
  if (rc != 0) return absl::InternalError(absl::StrCat("looking up Unix account '", name, "': ", std::strerror(rc)));
  if (found == nullptr) return absl::NotFoundError(absl::StrCat("there is no Unix account '", name, "' on this machine"));
  UnixAccount account;
  account.name = name;
  account.uid = entry.pw_uid;
  account.gid = entry.pw_gid;
  account.home = entry.pw_dir != nullptr ? entry.pw_dir : "/";
  account.shell = entry.pw_shell != nullptr ? entry.pw_shell : "";
  if (account.uid == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Unix account '", name, "' is root (uid 0): jobs never run as root; map the user to their own account"));
  }
  int count = 32;
  std::vector<gid_t> groups(static_cast<size_t>(count));
  while (getgrouplist(name.c_str(), account.gid, groups.data(), &count) < 0) {
    groups.resize(static_cast<size_t>(count) + 1);
    count = static_cast<int>(groups.size());
  }
  groups.resize(static_cast<size_t>(count));
  account.groups = std::move(groups);
  return account;
}

bool CanRunAsOtherAccounts() { return geteuid() == 0; }

absl::Status GiveToAccount(const std::string& path, const UnixAccount& account, unsigned mode) {
  if (chown(path.c_str(), account.uid, account.gid) != 0 || chmod(path.c_str(), static_cast<mode_t>(mode)) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot give ", path, " to Unix account ", account.name, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

FileAccessAs::FileAccessAs(const UnixAccount& account) {
  if (!CanRunAsOtherAccounts()) {
    status_ = absl::FailedPreconditionError("fitrund is not root: it cannot take another account's rights");
    return;
  }
  saved_fsuid_ = static_cast<uid_t>(setfsuid(static_cast<uid_t>(-1)));
  saved_fsgid_ = static_cast<gid_t>(setfsgid(static_cast<gid_t>(-1)));
  const int count = getgroups(0, nullptr);
  saved_groups_.resize(static_cast<size_t>(std::max(count, 0)));
  if (count > 0) getgroups(count, saved_groups_.data());
  if (ThreadSetGroups(account.groups) != 0) {
    status_ = absl::InternalError(absl::StrCat("setgroups for ", account.name, ": ", std::strerror(errno)));
    return;
  }
  switched_ = true;
  setfsgid(account.gid);
  setfsuid(account.uid);
  // setfsuid reports nothing useful on failure; read the id back.
  if (static_cast<uid_t>(setfsuid(static_cast<uid_t>(-1))) != account.uid) {
    status_ = absl::InternalError(absl::StrCat("setfsuid(", account.uid, ") for ", account.name, " did not take"));
    return;
  }
  // Last: the switches above need CAP_SETUID and CAP_SETGID. The permitted set stays, so the
  // destructor can raise them again.
  uint32_t none[6];
  if (!ThreadCapabilities(saved_capabilities_)) {
    status_ = absl::InternalError(absl::StrCat("capget for ", account.name, ": ", std::strerror(errno)));
    return;
  }
  std::copy(saved_capabilities_, saved_capabilities_ + 6, none);
  none[0] = none[3] = 0;  // effective
  if (!SetThreadCapabilities(none)) {
    status_ = absl::InternalError(absl::StrCat("dropping capabilities for ", account.name, ": ", std::strerror(errno)));
    return;
  }
  capabilities_dropped_ = true;
}

FileAccessAs::~FileAccessAs() {
  if (!switched_) return;
  if (capabilities_dropped_) SetThreadCapabilities(saved_capabilities_);
  // Switching the file-system uid back to 0 returns this thread's file-system capabilities; the
  // groups need CAP_SETGID, which the switch never took.
  setfsuid(saved_fsuid_);
  setfsgid(saved_fsgid_);
  ThreadSetGroups(saved_groups_);
}

}  // namespace fitrun::server
