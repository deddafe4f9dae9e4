// Which specs fitrund accepts, before anything is planned or stored: the spec (its files confined to
// the data roots before any is opened, then validated and defaulted, within the coordinator's node
// bound and the operator's ceilings), and the form of a request id. It serves SubmitJob and PlanJob
// alike. Who has which jobs open is open_jobs.h's.
//
// Thread-safety: immutable; CheckSpec reads the spec's files and runs outside the job manager's lock.
#ifndef FITRUN_SERVER_CORE_JOBS_ADMISSION_H_
#define FITRUN_SERVER_CORE_JOBS_ADMISSION_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fitrun/v1/job.pb.h"
#include "server/core/specs/data_roots.h"

namespace fitrun::server {

class Admission {
 public:
  struct Options {
    // Where specs' files may lie; unset: anywhere (the core's tests).
    std::optional<DataRoots> data_roots;
    // The most nodes a plan may span (0: any), and why, for a spec that asks for more.
    int max_nodes = 1;
    std::string max_nodes_reason;
    // The operator's ceilings on what a spec may ask for one rank (spec.resources.host_memory and
    // max_processes); 0: none.
    int64_t max_rank_host_memory_bytes = 0;
    int64_t max_rank_processes = 0;
    // The lowest uid a job's Unix account may have: below are system accounts (daemons, services),
    // whose rights no user's job may take, whatever a token file or certificate maps to them.
    uid_t min_account_uid = 1000;
  };
  explicit Admission(Options options) : options_(std::move(options)) {}

  // The spec as it would be stored: INVALID_ARGUMENT naming the field when a file lies outside the
  // data roots (or under /proc, /sys or /dev), the spec is invalid, asks for more than the
  // operator's ceilings (naming the flag), or needs more nodes than the coordinator spans. With a
  // `run_as` account (fitrund root, the owner's account) the spec's files are resolved and read with
  // that account's rights, so nobody has fitrund read for them what they could not read themselves;
  // FAILED_PRECONDITION when the account does not exist here.
  absl::StatusOr<fitrun::v1::JobSpec> CheckSpec(fitrun::v1::JobSpec spec, const std::string& run_as = "") const;

  // INVALID_ARGUMENT for a request id of more than 128 characters.
  static absl::Status CheckRequestId(const std::string& request_id);

  // OK when the earlier job's spec is `spec`: the retry gets that job back. INVALID_ARGUMENT
  // otherwise: a request id names one submit.
  static absl::Status SameSubmit(const std::string& request_id, const fitrun::v1::Job& earlier,
                                 const fitrun::v1::JobSpec& spec);

 private:
  // INVALID_ARGUMENT naming the field and the flag when a rank asks for more than the ceilings.
  absl::Status WithinCeilings(const fitrun::v1::Resources& resources) const;

  const Options options_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_ADMISSION_H_
