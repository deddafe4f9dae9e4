#include "server/sandbox/job_cgroup.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace fitrun::server {
namespace {

// The v1 controllers an attempt's cgroup uses: memory and pids bound it, freezer stops it whole.
constexpr const char* kMemory = "memory";
constexpr const char* kPids = "pids";
constexpr const char* kFreezer = "freezer";
// What the kernel shows as memory.limit_in_bytes for "no limit" (PAGE_COUNTER_MAX in bytes), or
// more: anything this large is no limit.
constexpr int64_t kNoLimitAbove = int64_t{1} << 62;
constexpr absl::Duration kPoll = absl::Milliseconds(20);

std::string ErrnoText(int error) { return std::strerror(error); }

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::FailedPreconditionError(absl::StrCat("cannot read ", path, ": ", ErrnoText(errno)));
  std::string text;
  char buffer[4096];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return absl::FailedPreconditionError(absl::StrCat("cannot read ", path, ": ", ErrnoText(error)));
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return text;
}

// One write, as the kernel wants a cgroup file written (no O_CREAT: a file the kernel does not offer
// is an error, not a new file).
absl::Status WriteFile(const std::string& path, absl::string_view value) {
  const int fd = open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write '", value, "' to ", path, ": ", ErrnoText(errno)));
  }
  ssize_t n;
  while ((n = write(fd, value.data(), value.size())) < 0 && errno == EINTR) {
  }
  const int error = errno;
  close(fd);
  if (n != static_cast<ssize_t>(value.size())) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write '", value, "' to ", path, ": ", n < 0 ? ErrnoText(error) : "short write"));
  }
  return absl::OkStatus();
}

bool Exists(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

// a + "/" + b with exactly one slash between, and none doubled where a or b is "/" or empty.
std::string Join(absl::string_view a, absl::string_view b) {
  a = absl::StripSuffix(a, "/");
  b = absl::StripPrefix(b, "/");
  if (b.empty()) return a.empty() ? "/" : std::string(a);
  return absl::StrCat(a, "/", b);
}

// The number on the line "<key> <number>" of a flat keyed file (memory.events, memory.oom_control);
// 0 when the kernel does not write that key.
int64_t KeyedValue(absl::string_view text, absl::string_view key) {
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t value = 0;
    if (fields.size() == 2 && fields[0] == key && absl::SimpleAtoi(fields[1], &value)) return value;
  }
  return 0;
}

// A limit file's value: a number of bytes or tasks, or "max" / a huge number for none (0).
absl::StatusOr<int64_t> ReadLimit(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  const absl::string_view value = absl::StripAsciiWhitespace(*text);
  if (value == "max") return 0;
  int64_t number = 0;
  if (!absl::SimpleAtoi(value, &number)) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": expected a number or 'max', got '", value, "'"));
  }
  return number >= kNoLimitAbove ? 0 : number;
}

absl::StatusOr<int64_t> ReadNumber(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  int64_t number = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &number)) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": expected a number, got '", *text, "'"));
  }
  return number;
}

std::string LimitText(int64_t value, const char* none) { return value > 0 ? absl::StrCat(value) : none; }

// mountinfo escapes spaces and the like in paths as \ooo.
std::string Unescape(absl::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 3 < text.size()) {
      int code = 0;
      bool octal = true;
      for (size_t j = 1; j <= 3; ++j) {
        if (text[i + j] < '0' || text[i + j] > '7') {
          octal = false;
          break;
        }
        code = code * 8 + (text[i + j] - '0');
      }
      if (octal) {
        out.push_back(static_cast<char>(code));
        i += 3;
        continue;
      }
    }
    out.push_back(text[i]);
  }
  return out;
}

// A cgroup path made relative to the root of the mount it is seen through.
std::string UnderMountRoot(const std::string& path, const std::string& mount_root) {
  if (mount_root.empty() || mount_root == "/") return path;
  if (path == mount_root) return "/";
  if (absl::StartsWith(path, mount_root + "/")) return path.substr(mount_root.size());
  return path;
}

bool ValidName(absl::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == absl::string_view::npos;
}

// The controllers a v2 cgroup's file lists ("cpu memory pids", or "+memory +pids" as written).
std::set<std::string> ControllerSet(absl::string_view text) {
  std::set<std::string> set;
  for (absl::string_view word : absl::StrSplit(text, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    set.emplace(absl::StripPrefix(word, "+"));
  }
  return set;
}

// Makes `relative`'s levels under `start` (which exists), each a cgroup; on v2 each level (and
// `start`) lets its children have memory and pids.
absl::Status MakeLevels(const std::string& start, absl::string_view relative, bool unified) {
  auto enable = [](const std::string& dir) -> absl::Status {
    const std::string control = Join(dir, "cgroup.subtree_control");
    absl::StatusOr<std::string> enabled = ReadFile(control);
    if (!enabled.ok()) return enabled.status();
    const std::set<std::string> on = ControllerSet(*enabled);
    if (on.count(kMemory) && on.count(kPids)) return absl::OkStatus();
    absl::StatusOr<std::string> offered = ReadFile(Join(dir, "cgroup.controllers"));
    if (!offered.ok()) return offered.status();
    const std::set<std::string> available = ControllerSet(*offered);
    if (!available.count(kMemory) || !available.count(kPids)) {
      return absl::FailedPreconditionError(absl::StrCat(
          Join(dir, "cgroup.controllers"), " does not offer memory and pids (it offers: ", absl::StrJoin(available, " "),
          "); the cgroups above it must enable them for it (systemd: Delegate=yes)"));
    }
    absl::Status written = WriteFile(control, "+memory +pids");
    if (!written.ok() && absl::StrContains(written.message(), ErrnoText(EBUSY))) {
      return absl::FailedPreconditionError(absl::StrCat(
          written.message(), ": the cgroup has processes of its own, so it cannot give its children controllers; "
                             "start fitrund in a cgroup of its own, or give --cgroup_parent an absolute path to a "
                             "cgroup delegated to fitrund"));
    }
    return written;
  };
  if (unified) {
    if (absl::Status status = enable(start); !status.ok()) return status;
  }
  std::string dir = start;
  for (absl::string_view level : absl::StrSplit(relative, '/', absl::SkipEmpty())) {
    dir = Join(dir, level);
    if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(absl::StrCat("cannot make the cgroup ", dir, ": ", ErrnoText(errno)));
    }
    if (unified) {
      if (absl::Status status = enable(dir); !status.ok()) return status;
    }
  }
  if (access(Join(dir, "cgroup.procs").c_str(), W_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot write ", Join(dir, "cgroup.procs"), ": ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Where the hierarchies are

CgroupMounts ParseCgroupMounts(absl::string_view mountinfo, absl::string_view self_cgroup) {
  static const std::set<std::string> kV1Controllers = {"cpu",    "cpuacct",  "cpuset",     "memory",  "devices",
                                                       "freezer", "net_cls", "net_prio",   "blkio",   "perf_event",
                                                       "hugetlb", "pids",    "rdma",       "misc"};
  CgroupMounts mounts;
  std::string unified_root;
  std::map<std::string, std::string> v1_roots;
  for (absl::string_view line : absl::StrSplit(mountinfo, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    // id parent major:minor root mount-point options [optional...] - fstype source super-options
    auto dash = std::find(fields.begin(), fields.end(), "-");
    if (fields.size() < 7 || dash == fields.end() || fields.end() - dash < 4) continue;
    const std::string root = Unescape(fields[3]);
    const std::string mount_point = Unescape(fields[4]);
    const absl::string_view type = *(dash + 1);
    if (type == "cgroup2") {
      if (mounts.unified_mount.empty()) {
        mounts.unified_mount = mount_point;
        unified_root = root;
      }
    } else if (type == "cgroup") {
      for (absl::string_view option : absl::StrSplit(*(dash + 3), ',')) {
        const std::string controller(option);
        if (kV1Controllers.count(controller) && !mounts.v1_mounts.count(controller)) {
          mounts.v1_mounts[controller] = mount_point;
          v1_roots[controller] = root;
        }
      }
    }
  }
  for (absl::string_view line : absl::StrSplit(self_cgroup, '\n', absl::SkipEmpty())) {
    // hierarchy-id:controller,...:path
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    const std::string path(fields[2]);
    if (fields[0] == "0" && fields[1].empty()) {
      mounts.unified_own = UnderMountRoot(path, unified_root);
      continue;
    }
    for (absl::string_view controller : absl::StrSplit(fields[1], ',', absl::SkipEmpty())) {
      const std::string name(controller);
      mounts.v1_own[name] = UnderMountRoot(path, v1_roots.count(name) ? v1_roots[name] : "/");
    }
  }
  return mounts;
}

std::string AttemptCgroupName(const std::string& job_id, int attempt) { return absl::StrCat(job_id, "-a", attempt); }

// ---------------------------------------------------------------------------------------------------
// One cgroup

JobCgroup::JobCgroup(std::string name, CgroupVersion version, std::vector<std::string> directories,
                     std::vector<std::string> controllers)
    : name_(std::move(name)),
      version_(version),
      directories_(std::move(directories)),
      controllers_(std::move(controllers)) {}

std::string JobCgroup::Dir(absl::string_view controller) const {
  if (version_ == CgroupVersion::kV2) return directories_.empty() ? "" : directories_.front();
  for (size_t i = 0; i < controllers_.size(); ++i) {
    if (controllers_[i] == controller) return directories_[i];
  }
  return "";
}

std::vector<std::string> JobCgroup::ProcsFiles() const {
  std::vector<std::string> files;
  for (const std::string& dir : directories_) files.push_back(Join(dir, "cgroup.procs"));
  return files;
}

absl::Status JobCgroup::MoveIn(int pid) const {
  for (const std::string& file : ProcsFiles()) {
    if (absl::Status moved = WriteFile(file, absl::StrCat(pid)); !moved.ok()) return moved;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> JobCgroup::Pids() const {
  std::set<int> pids;
  for (const std::string& file : ProcsFiles()) {
    absl::StatusOr<std::string> text = ReadFile(file);
    if (!text.ok()) {
      // A directory removed meanwhile holds nothing.
      if (!IsDirectory(file.substr(0, file.rfind('/')))) continue;
      return text.status();
    }
    for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipWhitespace())) {
      int pid = 0;
      if (absl::SimpleAtoi(line, &pid) && pid > 0) pids.insert(pid);
    }
  }
  return std::vector<int>(pids.begin(), pids.end());
}

absl::StatusOr<CgroupLimits> JobCgroup::ReadLimits() const {
  CgroupLimits limits;
  const bool v2 = version_ == CgroupVersion::kV2;
  if (const std::string memory = Dir(kMemory); !memory.empty()) {
    absl::StatusOr<int64_t> bytes = ReadLimit(Join(memory, v2 ? "memory.max" : "memory.limit_in_bytes"));
    if (!bytes.ok()) return bytes.status();
    limits.memory_bytes = *bytes;
  }
  if (const std::string pids = Dir(kPids); !pids.empty()) {
    absl::StatusOr<int64_t> tasks = ReadLimit(Join(pids, "pids.max"));
    if (!tasks.ok()) return tasks.status();
    limits.max_tasks = *tasks;
  }
  return limits;
}

absl::StatusOr<HostMemoryStats> JobCgroup::HostMemory() const {
  const std::string dir = Dir(kMemory);
  if (dir.empty()) return absl::FailedPreconditionError(absl::StrCat("cgroup ", name_, " has no memory controller"));
  HostMemoryStats stats;
  if (version_ == CgroupVersion::kV2) {
    absl::StatusOr<std::string> events = ReadFile(Join(dir, "memory.events"));
    if (!events.ok()) return events.status();
    stats.oom_kills = KeyedValue(*events, "oom_kill");
    if (const std::string peak = Join(dir, "memory.peak"); Exists(peak)) {
      absl::StatusOr<int64_t> bytes = ReadNumber(peak);
      if (!bytes.ok()) return bytes.status();
      stats.peak_bytes = *bytes;
    }
    absl::StatusOr<int64_t> limit = ReadLimit(Join(dir, "memory.max"));
    if (!limit.ok()) return limit.status();
    stats.limit_bytes = *limit;
    return stats;
  }
  absl::StatusOr<std::string> control = ReadFile(Join(dir, "memory.oom_control"));
  if (!control.ok()) return control.status();
  stats.oom_kills = KeyedValue(*control, "oom_kill");
  absl::StatusOr<int64_t> peak = ReadNumber(Join(dir, "memory.max_usage_in_bytes"));
  if (!peak.ok()) return peak.status();
  stats.peak_bytes = *peak;
  absl::StatusOr<int64_t> limit = ReadLimit(Join(dir, "memory.limit_in_bytes"));
  if (!limit.ok()) return limit.status();
  stats.limit_bytes = *limit;
  return stats;
}

absl::StatusOr<int64_t> JobCgroup::HostMemoryOomKills() const {
  absl::StatusOr<HostMemoryStats> stats = HostMemory();
  if (!stats.ok()) return stats.status();
  return stats->oom_kills;
}

absl::Status JobCgroup::KillAll(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  auto empty = [this]() -> absl::StatusOr<bool> {
    absl::StatusOr<std::vector<int>> pids = Pids();
    if (!pids.ok()) return pids.status();
    return pids->empty();
  };
  // Waits until nothing is left or `until` passes; returns whether nothing is left.
  auto drained = [&empty](absl::Time until) -> absl::StatusOr<bool> {
    while (true) {
      absl::StatusOr<bool> none = empty();
      if (!none.ok() || *none || absl::Now() >= until) return none;
      absl::SleepFor(kPoll);
    }
  };
  auto still_there = [this, timeout]() {
    absl::StatusOr<std::vector<int>> pids = Pids();
    return absl::DeadlineExceededError(absl::StrCat(
        "cgroup ", name_, " (", absl::StrJoin(ProcsFiles(), ", "), ") still has processes ",
        pids.ok() ? absl::StrJoin(*pids, " ") : std::string(pids.status().message()), " after ",
        absl::FormatDuration(timeout), " of killing"));
  };

  const std::string v2 = version_ == CgroupVersion::kV2 ? Dir("") : "";
  if (!v2.empty() && Exists(Join(v2, "cgroup.kill"))) {
    absl::StatusOr<bool> none = empty();
    if (!none.ok()) return none.status();
    if (*none) return absl::OkStatus();
    if (absl::Status killed = WriteFile(Join(v2, "cgroup.kill"), "1"); !killed.ok()) return killed;
    absl::StatusOr<bool> gone = drained(deadline);
    if (!gone.ok()) return gone.status();
    return *gone ? absl::OkStatus() : still_there();
  }

  // Frozen, nothing forks between reading cgroup.procs and the kills; SIGKILL takes a frozen task
  // as soon as it thaws.
  std::string freeze_file, frozen_file;
  std::string freeze_value, thaw_value;
  if (!v2.empty()) {
    freeze_file = Join(v2, "cgroup.freeze");
    frozen_file = Join(v2, "cgroup.events");
    freeze_value = "1";
    thaw_value = "0";
  } else if (const std::string freezer = Dir(kFreezer); !freezer.empty()) {
    freeze_file = frozen_file = Join(freezer, "freezer.state");
    freeze_value = "FROZEN";
    thaw_value = "THAWED";
  }
  if (!freeze_file.empty() && !Exists(freeze_file)) freeze_file.clear();
  while (true) {
    absl::StatusOr<bool> none = empty();
    if (!none.ok()) return none.status();
    if (*none) return absl::OkStatus();
    if (absl::Now() >= deadline) return still_there();
    bool frozen = false;
    if (!freeze_file.empty()) {
      if (absl::Status status = WriteFile(freeze_file, freeze_value); !status.ok()) return status;
      frozen = true;
      // Freezing takes a moment per task (v1 says FREEZING meanwhile); a task that cannot freeze
      // (in uninterruptible sleep) is killed anyway.
      const absl::Time until = std::min(deadline, absl::Now() + absl::Seconds(1));
      while (absl::Now() < until) {
        absl::StatusOr<std::string> state = ReadFile(frozen_file);
        if (!state.ok()) break;
        if (v2.empty() ? absl::StripAsciiWhitespace(*state) == "FROZEN" : KeyedValue(*state, "frozen") == 1) break;
        absl::SleepFor(kPoll);
      }
    }
    absl::StatusOr<std::vector<int>> pids = Pids();
    if (pids.ok()) {
      for (int pid : *pids) KillIfInside(pid);
    }
    if (frozen) {
      if (absl::Status status = WriteFile(freeze_file, thaw_value); !status.ok()) return status;
    }
    if (!pids.ok()) return pids.status();
    absl::StatusOr<bool> gone = drained(std::min(deadline, absl::Now() + absl::Milliseconds(500)));
    if (!gone.ok()) return gone.status();
    if (*gone) return absl::OkStatus();
  }
}

namespace {

// The cgroup `dir` as /proc/<pid>/cgroup names it: relative to its hierarchy's mount, which is the
// highest directory above it on the same file system.
std::string RelativeToMount(const std::string& dir) {
  struct stat own {};
  if (stat(dir.c_str(), &own) != 0) return "";
  std::string top = dir;
  while (true) {
    const size_t slash = top.find_last_of('/');
    if (slash == std::string::npos || slash == 0) break;
    const std::string parent = top.substr(0, slash);
    struct stat above {};
    if (stat(parent.c_str(), &above) != 0 || above.st_dev != own.st_dev) break;
    top = parent;
  }
  const std::string relative = dir.substr(top.size());
  return relative.empty() ? "/" : relative;
}

}  // namespace

bool JobCgroup::Contains(int pid) const {
  if (directories_.empty()) return false;
  const std::string want = RelativeToMount(directories_.front());
  const std::string& controller = controllers_.front();  // v1: memory; v2: ""
  absl::StatusOr<std::string> cgroups = ReadFile(absl::StrCat("/proc/", pid, "/cgroup"));
  if (!cgroups.ok() || want.empty()) return false;
  for (absl::string_view line : absl::StrSplit(*cgroups, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    const bool hierarchy = controller.empty() ? fields[0] == "0" && fields[1].empty()
                                              : absl::StrContains(absl::StrCat(",", fields[1], ","),
                                                                  absl::StrCat(",", controller, ","));
    if (hierarchy) return fields[2] == want;
  }
  return false;
}

void JobCgroup::KillIfInside(int pid) const {
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return;  // gone already
  // The pidfd pins a process; if it is in this cgroup, it is one of ours, whatever pid it has.
  if (Contains(pid)) syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
  close(pidfd);
}

absl::Status JobCgroup::Remove(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (const std::string& dir : directories_) {
    while (rmdir(dir.c_str()) != 0) {
      const int error = errno;
      if (error == ENOENT) break;
      if (error == EINTR) continue;
      if (error != EBUSY || absl::Now() >= deadline) {
        return absl::FailedPreconditionError(absl::StrCat("cannot remove the cgroup ", dir, ": ", ErrnoText(error)));
      }
      absl::SleepFor(kPoll);
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------------
// The coordinator's cgroups

absl::StatusOr<std::unique_ptr<JobCgroups>> JobCgroups::Create(Options options) {
  if (options.parent.empty() || absl::StrContains(options.parent, "..")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cgroup_parent: '", options.parent, "' is not a cgroup path (e.g. fitrun, or /fitrun)"));
  }
  if (!ValidName(options.coordinator_tag)) {
    return absl::InvalidArgumentError(absl::StrCat("job cgroups: bad coordinator tag '", options.coordinator_tag, "'"));
  }
  absl::StatusOr<std::string> mountinfo = ReadFile(options.mountinfo_path);
  if (!mountinfo.ok()) return mountinfo.status();
  absl::StatusOr<std::string> self = ReadFile(options.self_cgroup_path);
  if (!self.ok()) return self.status();
  const CgroupMounts mounts = ParseCgroupMounts(*mountinfo, *self);
  const bool absolute = absl::StartsWith(options.parent, "/");
  const std::string below = Join(options.parent, options.coordinator_tag);

  // A unified hierarchy whose root offers memory and pids (on a hybrid machine it offers neither).
  std::string unified_offers;
  if (!mounts.unified_mount.empty()) {
    const std::string root = options.root_prefix + mounts.unified_mount;
    absl::StatusOr<std::string> offered = ReadFile(Join(root, "cgroup.controllers"));
    const std::set<std::string> available = offered.ok() ? ControllerSet(*offered) : std::set<std::string>{};
    unified_offers = absl::StrJoin(available, " ");
    if (available.count(kMemory) && available.count(kPids)) {
      const std::string start = absolute ? root : Join(root, mounts.unified_own);
      if (absl::Status made = MakeLevels(start, below, /*unified=*/true); !made.ok()) {
        return absl::FailedPreconditionError(absl::StrCat("cgroup v2 at ", mounts.unified_mount, ": ", made.message()));
      }
      const std::string parent_dir = Join(start, options.parent);
      return std::unique_ptr<JobCgroups>(
          new JobCgroups(CgroupVersion::kV2, {Join(start, below)}, {""}, {parent_dir}));
    }
  }

  if (!mounts.v1_mounts.count(kMemory) || !mounts.v1_mounts.count(kPids)) {
    std::vector<std::string> v1;
    for (const auto& [controller, mount] : mounts.v1_mounts) v1.push_back(controller);
    return absl::FailedPreconditionError(absl::StrCat(
        "no cgroup hierarchy with the memory and pids controllers: ",
        mounts.unified_mount.empty() ? std::string("no cgroup2 mount")
                                     : absl::StrCat("cgroup2 at ", mounts.unified_mount, " offers '", unified_offers, "'"),
        v1.empty() ? std::string(", no cgroup v1 controllers mounted")
                   : absl::StrCat(", cgroup v1 mounts ", absl::StrJoin(v1, " "))));
  }
  std::vector<std::string> controllers = {kMemory, kPids};
  if (mounts.v1_mounts.count(kFreezer)) controllers.push_back(kFreezer);
  std::vector<std::string> bases, parents;
  for (const std::string& controller : controllers) {
    const std::string root = options.root_prefix + mounts.v1_mounts.at(controller);
    const std::string own = mounts.v1_own.count(controller) ? mounts.v1_own.at(controller) : "/";
    const std::string start = absolute ? root : Join(root, own);
    if (absl::Status made = MakeLevels(start, below, /*unified=*/false); !made.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("cgroup v1 ", controller, ": ", made.message()));
    }
    bases.push_back(Join(start, below));
    parents.push_back(Join(start, options.parent));
  }
  return std::unique_ptr<JobCgroups>(
      new JobCgroups(CgroupVersion::kV1, std::move(bases), std::move(controllers), std::move(parents)));
}

std::string JobCgroups::Describe() const {
  if (version_ == CgroupVersion::kV2) {
    return absl::StrCat("cgroup v2 (memory, pids): each attempt's cgroup under ", base_dirs_.front());
  }
  return absl::StrCat("cgroup v1 (", absl::StrJoin(controllers_, ", "), "): each attempt's cgroups under ",
                      absl::StrJoin(base_dirs_, ", "));
}

absl::StatusOr<std::unique_ptr<JobCgroup>> JobCgroups::Make(const std::string& name, const CgroupLimits& limits) const {
  if (!ValidName(name)) return absl::InvalidArgumentError(absl::StrCat("bad cgroup name '", name, "'"));
  std::vector<std::string> dirs;
  std::vector<std::string> made;
  bool existed = false;
  for (size_t i = 0; i < base_dirs_.size(); ++i) {
    const std::string& base = base_dirs_[i];
    const std::string dir = Join(base, name);
    // The coordinator's own directory may be gone: removed as empty by a fitrund starting at the
    // moment this one's was (RemoveGoneCoordinators), or by hand. Made again.
    if (!IsDirectory(base) && i < parent_dirs_.size()) {
      (void)MakeLevels(parent_dirs_[i], base.substr(base.find_last_of('/') + 1), version_ == CgroupVersion::kV2);
    }
    if (mkdir(dir.c_str(), 0755) == 0) {
      made.push_back(dir);
    } else if (errno == EEXIST) {
      existed = true;
    } else {
      const int error = errno;
      for (auto it = made.rbegin(); it != made.rend(); ++it) rmdir(it->c_str());
      return absl::FailedPreconditionError(absl::StrCat("cannot make the cgroup ", dir, ": ", ErrnoText(error)));
    }
    dirs.push_back(dir);
  }
  auto cgroup = std::make_unique<JobCgroup>(name, version_, dirs, controllers_);
  auto fail = [&cgroup](absl::Status status) {
    (void)cgroup->KillAll(absl::Seconds(2));
    (void)cgroup->Remove(absl::Seconds(1));
    return status;
  };
  // Left by a coordinator that died between making it and recording the launch: whatever runs in
  // it belongs to no recorded attempt.
  if (existed) {
    if (absl::Status status = cgroup->KillAll(); !status.ok()) return fail(status);
  }
  const std::string& memory = dirs.front();  // v1: memory is the first controller
  if (version_ == CgroupVersion::kV2) {
    if (absl::Status s = WriteFile(Join(memory, "memory.max"), LimitText(limits.memory_bytes, "max")); !s.ok()) {
      return fail(s);
    }
    // The limit is the memory the attempt may use, not the memory plus whatever swap it could fill.
    if (const std::string swap = Join(memory, "memory.swap.max"); Exists(swap)) {
      if (absl::Status s = WriteFile(swap, limits.memory_bytes > 0 ? "0" : "max"); !s.ok()) return fail(s);
    }
    if (absl::Status s = WriteFile(Join(memory, "pids.max"), LimitText(limits.max_tasks, "max")); !s.ok()) {
      return fail(s);
    }
    return cgroup;
  }
  // memory.memsw.limit_in_bytes (memory + swap) may never be below memory.limit_in_bytes: lift it,
  // set the memory limit, then bring it to the same value.
  const std::string memsw = Join(memory, "memory.memsw.limit_in_bytes");
  const bool swap_accounted = Exists(memsw);
  if (swap_accounted) {
    if (absl::Status s = WriteFile(memsw, "-1"); !s.ok()) return fail(s);
  }
  if (absl::Status s = WriteFile(Join(memory, "memory.limit_in_bytes"), LimitText(limits.memory_bytes, "-1"));
      !s.ok()) {
    return fail(s);
  }
  if (swap_accounted && limits.memory_bytes > 0) {
    if (absl::Status s = WriteFile(memsw, absl::StrCat(limits.memory_bytes)); !s.ok()) return fail(s);
  }
  for (size_t i = 0; i < controllers_.size(); ++i) {
    if (controllers_[i] != kPids) continue;
    if (absl::Status s = WriteFile(Join(dirs[i], "pids.max"), LimitText(limits.max_tasks, "max")); !s.ok()) {
      return fail(s);
    }
  }
  return cgroup;
}

absl::StatusOr<std::unique_ptr<JobCgroup>> JobCgroups::Open(const std::string& name) const {
  if (!ValidName(name)) return absl::InvalidArgumentError(absl::StrCat("bad cgroup name '", name, "'"));
  std::vector<std::string> dirs, controllers;
  for (size_t i = 0; i < base_dirs_.size(); ++i) {
    const std::string dir = Join(base_dirs_[i], name);
    if (!IsDirectory(dir)) continue;
    dirs.push_back(dir);
    controllers.push_back(controllers_[i]);
  }
  if (dirs.empty()) {
    return absl::NotFoundError(absl::StrCat("no cgroup ", name, " under ", absl::StrJoin(base_dirs_, ", ")));
  }
  return std::make_unique<JobCgroup>(name, version_, std::move(dirs), std::move(controllers));
}

std::vector<std::string> JobCgroups::List() const {
  std::set<std::string> names;
  for (const std::string& base : base_dirs_) {
    DIR* dir = opendir(base.c_str());
    if (dir == nullptr) continue;
    while (const dirent* entry = readdir(dir)) {
      const std::string name = entry->d_name;
      if (ValidName(name) && IsDirectory(Join(base, name))) names.insert(name);
    }
    closedir(dir);
  }
  return std::vector<std::string>(names.begin(), names.end());
}

absl::Status JobCgroups::RemoveDirectories() const {
  // Every hierarchy's, whatever one of them says: a directory left in one is still left.
  absl::Status status;
  for (const std::string& base : base_dirs_) {
    if (rmdir(base.c_str()) != 0 && errno != ENOENT && status.ok()) {
      status = absl::FailedPreconditionError(absl::StrCat("cannot remove the cgroup ", base, ": ", ErrnoText(errno)));
    }
  }
  if (!status.ok()) return status;
  // Another coordinator's directory keeps the parent (rmdir then fails, which is fine).
  for (const std::string& parent : parent_dirs_) rmdir(parent.c_str());
  return absl::OkStatus();
}

namespace {

// Removes `dir` and every cgroup below it that is empty, deepest first; appends what it removed.
// Returns whether `dir` itself went.
bool RemoveEmptyTree(const std::string& dir, std::vector<std::string>* removed) {
  bool all_gone = true;
  if (DIR* listing = opendir(dir.c_str()); listing != nullptr) {
    std::vector<std::string> children;
    while (const dirent* entry = readdir(listing)) {
      const std::string name = entry->d_name;
      if (name != "." && name != ".." && IsDirectory(Join(dir, name))) children.push_back(Join(dir, name));
    }
    closedir(listing);
    for (const std::string& child : children) all_gone &= RemoveEmptyTree(child, removed);
  }
  if (!all_gone || rmdir(dir.c_str()) != 0) return false;
  removed->push_back(dir);
  return true;
}

}  // namespace

std::vector<std::string> JobCgroups::RemoveGoneCoordinators(
    const std::function<bool(const std::string& tag)>& alive) const {
  std::vector<std::string> removed;
  const std::string own = base_dirs_.front().substr(base_dirs_.front().find_last_of('/') + 1);
  for (const std::string& parent : parent_dirs_) {
    DIR* listing = opendir(parent.c_str());
    if (listing == nullptr) continue;
    std::vector<std::string> tags;
    while (const dirent* entry = readdir(listing)) {
      const std::string name = entry->d_name;
      if (absl::StartsWith(name, "fitrund-") && ValidName(name) && name != own && IsDirectory(Join(parent, name))) {
        tags.push_back(name);
      }
    }
    closedir(listing);
    for (const std::string& tag : tags) {
      if (!alive(tag)) RemoveEmptyTree(Join(parent, tag), &removed);
    }
  }
  return removed;
}

CgroupSupport ProbeCgroupSupport(JobCgroups::Options options) {
  CgroupSupport support;
  absl::StatusOr<std::unique_ptr<JobCgroups>> cgroups = JobCgroups::Create(std::move(options));
  if (!cgroups.ok()) {
    support.text = std::string(cgroups.status().message());
    if (geteuid() != 0) absl::StrAppend(&support.text, " (fitrund is not root)");
    return support;
  }
  support.cgroups = *std::move(cgroups);
  support.text = support.cgroups->Describe();
  return support;
}

}  // namespace fitrun::server
