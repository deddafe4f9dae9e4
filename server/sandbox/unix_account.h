// The Unix accounts fitrund runs jobs as, and reading files with an account's rights.
//
// When fitrund is root and knows its users' accounts, every process of a job (ranks, probes,
// scripts) runs as the job owner's account (server/spawn does the switch in the child), and what
// fitrund reads for a job at submit (headers, the tensors file, a script's presence) it reads with
// the owner's rights too (FileAccessAs), so a user cannot make fitrund read what they could not.
#ifndef FITRUN_SERVER_SANDBOX_UNIX_ACCOUNT_H_
#define FITRUN_SERVER_SANDBOX_UNIX_ACCOUNT_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fitrun::server {

struct UnixAccount {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  // Every group the account is in (its primary group included), as login would set them.
  std::vector<gid_t> groups;
  std::string home;
  std::string shell;
};

// The account from the password and group databases: NOT_FOUND naming it when there is none;
// INVALID_ARGUMENT for uid 0 (a job never runs as root through a mapping).
absl::StatusOr<UnixAccount> LookUpUnixAccount(const std::string& name);

// Whether this process may switch to other accounts (its effective uid is 0).
bool CanRunAsOtherAccounts();

// Gives the file or directory to the account (owner and group) with `mode`; INTERNAL naming the
// path otherwise. Only for paths no account can change (in fitrund's own directories): inside a
// directory an account controls, use OwnedDirectory (owned_directory.h).
absl::Status GiveToAccount(const std::string& path, const UnixAccount& account, unsigned mode);

// While alive, the calling thread opens, stats and lists files with `account`'s rights (file-system
// uid and gid and supplementary groups, which Linux keeps per thread), and every capability of the
// thread is dropped from its effective set, not only the file-system ones a file-system uid change
// drops: root's CAP_SYS_PTRACE would otherwise let a path through /proc/<pid>/cwd or /root (magic
// links) into another account's private directories. The destructor restores fitrund's own. Other
// threads are untouched. Only meaningful when CanRunAsOtherAccounts(); otherwise ok() is false and
// nothing changes.
class FileAccessAs {
 public:
  explicit FileAccessAs(const UnixAccount& account);
  ~FileAccessAs();
  FileAccessAs(const FileAccessAs&) = delete;
  FileAccessAs& operator=(const FileAccessAs&) = delete;

  // OK when the thread now has the account's rights; INTERNAL naming the step otherwise.
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
  bool switched_ = false;
  // The thread's capabilities before (capget's two 32-bit words of effective, permitted and
  // inheritable), when they were dropped.
  bool capabilities_dropped_ = false;
  uint32_t saved_capabilities_[6] = {};
  uid_t saved_fsuid_ = 0;
  gid_t saved_fsgid_ = 0;
  std::vector<gid_t> saved_groups_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_SANDBOX_UNIX_ACCOUNT_H_
