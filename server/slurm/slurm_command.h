// Runs Slurm's client commands (scontrol, sbatch, squeue, scancel) for fitrund's Slurm mode: no
// shell, stdin /dev/null, stdout captured, killed when they take too long. The callers take a
// SlurmRunner so that unit tests hand them a fake that returns recorded output.
#ifndef FITRUN_SERVER_SLURM_SLURM_COMMAND_H_
#define FITRUN_SERVER_SLURM_SLURM_COMMAND_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace fitrun::server::slurm {

// Runs one Slurm command (argv[0] a name such as "scontrol") and returns its stdout.
using SlurmRunner = std::function<absl::StatusOr<std::string>(const std::vector<std::string>& argv)>;

// Long enough for a client to report that slurmctld is unreachable rather than be cut short: with
// slurmctld down, Slurm 22.05's scontrol and squeue give up after about 9 s, sbatch after 18 s.
inline constexpr absl::Duration kDefaultSlurmCommandTimeout = absl::Seconds(20);

// Runs argv (argv[0] looked up on PATH, then in /usr/bin; a name with a slash is taken as given)
// with this process's environment, stdin /dev/null and the signal handling of a fresh process
// (server/spawn), in a process group of its own. Returns its stdout when it exits 0.
// Errors: NOT_FOUND when the program is not installed (naming slurm-wlm's client tools);
// UNAVAILABLE when it exits non-zero or is killed, with the command line and its stderr (its
// stdout when stderr is empty: "Node n9 not found"); DEADLINE_EXCEEDED when it runs past `timeout`,
// after it and its process group are killed with SIGKILL. The child is always reaped before this
// returns. Thread-safe: the pipes are close-on-exec, so concurrent calls (and other spawns in the
// process) never inherit each other's.
absl::StatusOr<std::string> RunSlurmCommand(const std::vector<std::string>& argv, absl::Duration timeout);

// A SlurmRunner that calls RunSlurmCommand with `timeout`.
SlurmRunner RealSlurmRunner(absl::Duration timeout = kDefaultSlurmCommandTimeout);

}  // namespace fitrun::server::slurm

#endif  // FITRUN_SERVER_SLURM_SLURM_COMMAND_H_
