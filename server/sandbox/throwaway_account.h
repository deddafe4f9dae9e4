// For tests run as root: a Unix account made for the test (useradd, no home, no login shell) and
// removed with its group when the object goes. An account of the same stem whose process is gone (a
// test killed before its destructor ran) is removed first, so none outlives the next run. Skips are
// the caller's: available() says whether the account exists (false when not root or useradd failed,
// with why()).
#ifndef FITRUN_SERVER_SANDBOX_THROWAWAY_ACCOUNT_H_
#define FITRUN_SERVER_SANDBOX_THROWAWAY_ACCOUNT_H_

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <string>

namespace fitrun::server {

class ThrowawayAccount {
 public:
  // `stem` plus this process's pid, so parallel tests never share an account.
  explicit ThrowawayAccount(const std::string& stem) : name_(stem + std::to_string(getpid())) {
    if (geteuid() != 0) {
      why_ = "needs root, to make a throwaway Unix account";
      return;
    }
    RemoveOrphans(stem);
    const std::string command = "/usr/sbin/useradd --no-create-home --shell /usr/sbin/nologin --user-group " + name_ + " 2>&1";
    if (std::system(command.c_str()) != 0) {
      why_ = "useradd " + name_ + " failed";
      return;
    }
    made_ = true;
  }
  ~ThrowawayAccount() {
    if (made_) std::system(("/usr/sbin/userdel " + name_ + " >/dev/null 2>&1").c_str());
  }
  ThrowawayAccount(const ThrowawayAccount&) = delete;
  ThrowawayAccount& operator=(const ThrowawayAccount&) = delete;

  bool available() const { return made_; }
  const std::string& why() const { return why_; }
  const std::string& name() const { return name_; }

 private:
  // Accounts "<stem><pid>" whose pid no process has any more.
  static void RemoveOrphans(const std::string& stem) {
    std::ifstream passwd("/etc/passwd");
    std::string line;
    while (std::getline(passwd, line)) {
      const std::string name = line.substr(0, line.find(':'));
      if (name.rfind(stem, 0) != 0 || name.size() == stem.size()) continue;
      const std::string pid = name.substr(stem.size());
      if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
      if (kill(std::stoi(pid), 0) == 0 || errno != ESRCH) continue;
      std::system(("/usr/sbin/userdel " + name + " >/dev/null 2>&1").c_str());
    }
  }

  std::string name_;
  std::string why_;
  bool made_ = false;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_SANDBOX_THROWAWAY_ACCOUNT_H_
