// posix_spawn attributes for the coordinator's children (workers and memory probes).
#ifndef FITRUN_SERVER_LAUNCHER_CHILD_SPAWN_H_
#define FITRUN_SERVER_LAUNCHER_CHILD_SPAWN_H_

#include <signal.h>
#include <spawn.h>

namespace fitrun::server {

// An empty signal mask and default handling of the signals fitrund takes over, whatever the
// coordinator's threads have blocked (fitrund blocks them to take them synchronously); with
// `own_process_group`, the child leads a process group of its own, so stopping it also stops
// anything it started.
class ChildSpawnAttributes {
 public:
  explicit ChildSpawnAttributes(bool own_process_group) {
    posix_spawnattr_init(&attr_);
    sigset_t empty, defaults;
    sigemptyset(&empty);
    sigemptyset(&defaults);
    for (int sig : {SIGTERM, SIGINT, SIGPIPE, SIGHUP, SIGCHLD}) sigaddset(&defaults, sig);
    posix_spawnattr_setsigmask(&attr_, &empty);
    posix_spawnattr_setsigdefault(&attr_, &defaults);
    short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
    if (own_process_group) {
      posix_spawnattr_setpgroup(&attr_, 0);
      flags |= POSIX_SPAWN_SETPGROUP;
    }
    posix_spawnattr_setflags(&attr_, flags);
  }
  ~ChildSpawnAttributes() { posix_spawnattr_destroy(&attr_); }
  ChildSpawnAttributes(const ChildSpawnAttributes&) = delete;
  ChildSpawnAttributes& operator=(const ChildSpawnAttributes&) = delete;

  const posix_spawnattr_t* get() const { return &attr_; }

 private:
  posix_spawnattr_t attr_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_LAUNCHER_CHILD_SPAWN_H_
