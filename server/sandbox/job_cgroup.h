// The cgroups an attempt's processes live in, so that fitrund bounds their host memory and their
// number, sees when the kernel's OOM killer stopped one, and stops every one of them at the end,
// including what a script started and hid from its process group (a double-forked, setsid daemon).
//
// One cgroup per attempt, named from the coordinator's identity, the job and the attempt
// (<fitrund's own cgroup>/<parent>/<coordinator tag>/<job id>-a<attempt>), so a restarted fitrund
// opens the same one again. On a unified hierarchy (cgroup v2 with the memory and pids controllers)
// it is one directory; on cgroup v1 one per controller used (memory, pids, and freezer for stopping
// it whole). Which one a machine has is read from /proc/self/mountinfo.
//
// Thread-safety: JobCgroups and JobCgroup are immutable after creation; their methods read and
// write the cgroup file system only and may be called from any thread. KillAll and Remove wait
// (boundedly): call them off any lock that others wait on.
#ifndef FITRUN_SERVER_SANDBOX_JOB_CGROUP_H_
#define FITRUN_SERVER_SANDBOX_JOB_CGROUP_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace fitrun::server {

enum class CgroupVersion { kV1, kV2 };

// The cgroup hierarchies mounted here and where this process sits in each.
struct CgroupMounts {
  // cgroup2: where it is mounted ("" when it is not) and this process's cgroup in it, relative to
  // the mount ("/" at its root).
  std::string unified_mount;
  std::string unified_own = "/";
  // cgroup v1, per controller ("memory", "pids", "freezer", ...): its mount, and this process's
  // cgroup in it relative to the mount.
  std::map<std::string, std::string> v1_mounts;
  std::map<std::string, std::string> v1_own;
};
// From the text of /proc/self/mountinfo and /proc/self/cgroup. A cgroup path under a mount whose
// root is not the hierarchy's (a container's bind mount) is taken relative to that root.
CgroupMounts ParseCgroupMounts(absl::string_view mountinfo, absl::string_view self_cgroup);

// What one attempt's cgroup allows, for all its processes together. 0: no limit.
struct CgroupLimits {
  // Host memory (v1 memory.limit_in_bytes, and memory.memsw.limit_in_bytes at the same value where
  // the kernel accounts swap, so swapping does not stretch it; v2 memory.max, with memory.swap.max 0).
  int64_t memory_bytes = 0;
  // Tasks: processes and their threads alike (pids.max counts both).
  int64_t max_tasks = 0;
};

// What the memory controller saw: the kernel's OOM kills in the cgroup (v1 memory.oom_control's
// oom_kill, v2 memory.events' oom_kill), the highest usage (v1 memory.max_usage_in_bytes, v2
// memory.peak; 0 where the kernel does not keep it) and the limit (0: none).
struct HostMemoryStats {
  int64_t oom_kills = 0;
  int64_t peak_bytes = 0;
  int64_t limit_bytes = 0;
};

// One attempt's (or one memory probe's) cgroup.
class JobCgroup {
 public:
  JobCgroup(std::string name, CgroupVersion version, std::vector<std::string> directories,
            std::vector<std::string> controllers);

  const std::string& name() const { return name_; }
  CgroupVersion version() const { return version_; }
  // Its directory in each hierarchy (one on v2; memory first on v1).
  const std::vector<std::string>& directories() const { return directories_; }
  // The cgroup.procs files a child writes 0 to before it execs (SpawnOptions::cgroup_procs_files).
  std::vector<std::string> ProcsFiles() const;
  // Moves the running process `pid` (every thread of it) into this cgroup: a warm rank taking a job.
  absl::Status MoveIn(int pid) const;
  // Every process in it, in any of its directories.
  absl::StatusOr<std::vector<int>> Pids() const;
  // Whether the process `pid` is in it (its /proc/<pid>/cgroup names this cgroup's first directory,
  // relative to its hierarchy's mount): a process re-adopted after a restart must be.
  bool Contains(int pid) const;
  // The limits as the kernel holds them (rounded to its pages).
  absl::StatusOr<CgroupLimits> ReadLimits() const;
  absl::StatusOr<HostMemoryStats> HostMemory() const;
  // HostMemory().oom_kills.
  absl::StatusOr<int64_t> HostMemoryOomKills() const;
  // Kills every process in it and waits until none is left (at most `timeout`): v2's cgroup.kill
  // where the kernel has it; otherwise freeze (v1 freezer, v2 cgroup.freeze) so nothing forks
  // meanwhile, SIGKILL every pid in cgroup.procs, thaw, and repeat until cgroup.procs is empty. Each
  // pid read is signalled through a pidfd, and only once it is seen in this cgroup after the pidfd
  // pinned it: a pid that was recycled between the read and the kill is never signalled.
  absl::Status KillAll(absl::Duration timeout = absl::Seconds(10));
  // Removes its directories once no process is left in them (waiting at most `timeout` for exiting
  // ones); a directory already gone is fine. FAILED_PRECONDITION naming the directory otherwise.
  absl::Status Remove(absl::Duration timeout = absl::Seconds(5));

 private:
  std::string Dir(absl::string_view controller) const;  // "" when not in that hierarchy
  // SIGKILL to `pid` through a pidfd, if the process the pidfd pins is in this cgroup.
  void KillIfInside(int pid) const;

  const std::string name_;
  const CgroupVersion version_;
  const std::vector<std::string> directories_;
  const std::vector<std::string> controllers_;  // v1: each directory's controller; v2: {""}
};

// The cgroups one coordinator makes: its directory <parent>/<coordinator tag> in each hierarchy it
// uses, and the attempts' cgroups under it.
class JobCgroups {
 public:
  struct Options {
    // Relative: under fitrund's own cgroup (as /proc/self/cgroup says), so jobs count against
    // whatever confines fitrund; absolute: from the hierarchy's root. (--cgroup_parent)
    std::string parent = "fitrun";
    // The coordinator's identity (CoordinatorTag): its cgroups are found again after a restart, and
    // another coordinator's are never touched.
    std::string coordinator_tag;
    // Where the hierarchies are read from (tests point these at a fake tree's files).
    std::string mountinfo_path = "/proc/self/mountinfo";
    std::string self_cgroup_path = "/proc/self/cgroup";
    // A mount found in mountinfo is looked up under this prefix (tests: their fake tree).
    std::string root_prefix;
  };
  // Finds the hierarchy (v2 when its root offers memory and pids, else v1 with memory and pids
  // mounted) and makes the coordinator's directory in it (on v2 enabling memory and pids for the
  // levels below). FAILED_PRECONDITION naming what is missing or not writable, and why.
  static absl::StatusOr<std::unique_ptr<JobCgroups>> Create(Options options);

  CgroupVersion version() const { return version_; }
  // One line for fitrund's log: the version, the controllers and the coordinator's directories.
  std::string Describe() const;
  // The coordinator's directory in each hierarchy.
  const std::vector<std::string>& directories() const { return base_dirs_; }

  // Makes the cgroup `name` with `limits` (an existing one of that name, left by a coordinator that
  // died before it could record its launch, is emptied and reused). On an error nothing is left.
  absl::StatusOr<std::unique_ptr<JobCgroup>> Make(const std::string& name, const CgroupLimits& limits) const;
  // The existing cgroup `name` (after a restart); NOT_FOUND when it is in no hierarchy.
  absl::StatusOr<std::unique_ptr<JobCgroup>> Open(const std::string& name) const;
  // The names of the cgroups under the coordinator's directory.
  std::vector<std::string> List() const;
  // Removes the coordinator's directory, and the parent's when no other coordinator uses it; for a
  // coordinator that stopped everything it started. FAILED_PRECONDITION while cgroups remain.
  absl::Status RemoveDirectories() const;
  // Removes the empty cgroups other coordinators left under the same parent (a fitrund killed, or
  // one that could not empty them) when `alive` says their coordinator (by tag) is gone; a cgroup
  // with a process in it stays (a dead coordinator's ranks, for it to re-adopt when it restarts),
  // and so does every cgroup above it. Returns the directories removed.
  std::vector<std::string> RemoveGoneCoordinators(const std::function<bool(const std::string& tag)>& alive) const;

 private:
  JobCgroups(CgroupVersion version, std::vector<std::string> base_dirs, std::vector<std::string> controllers,
             std::vector<std::string> parent_dirs)
      : version_(version), base_dirs_(std::move(base_dirs)), controllers_(std::move(controllers)),
        parent_dirs_(std::move(parent_dirs)) {}

  const CgroupVersion version_;
  const std::vector<std::string> base_dirs_;
  const std::vector<std::string> controllers_;
  const std::vector<std::string> parent_dirs_;
};

// Whether this machine can confine jobs in cgroups, for --job_cgroups: `cgroups` when it can (the
// controllers are mounted and fitrund may write them), and a line for the log either way.
struct CgroupSupport {
  std::unique_ptr<JobCgroups> cgroups;
  std::string text;
};
CgroupSupport ProbeCgroupSupport(JobCgroups::Options options);

// The cgroup name of a job's attempt: "<job id>-a<attempt>".
std::string AttemptCgroupName(const std::string& job_id, int attempt);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_SANDBOX_JOB_CGROUP_H_
