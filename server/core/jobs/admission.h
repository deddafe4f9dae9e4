// Which submits and dry-run plans fitrund accepts, before anything is planned or stored: the spec
// (its files confined to the data roots before any is opened, then validated and defaulted, within
// the coordinator's node bound), the request id that makes a submit idempotent per owner, and the
// number of jobs one owner may have open. One Admit serves SubmitJob and PlanJob alike.
//
// Thread-safety: CheckSpec touches no state (it reads the spec's files) and runs outside the job
// manager's lock; the rest is bookkeeping the job manager calls under its lock.
#ifndef FITRUN_SERVER_CORE_JOBS_ADMISSION_H_
#define FITRUN_SERVER_CORE_JOBS_ADMISSION_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
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
    // Jobs one owner may have queued or running at once (RESOURCE_EXHAUSTED beyond); 0: no limit.
    int max_open_jobs_per_owner = 0;
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

  // The job an earlier submit of `owner` with `request_id` created, when there was one (its answer
  // may have been lost); nullopt for an empty request id.
  std::optional<std::string> EarlierJob(const std::string& owner, const std::string& request_id) const;
  // OK when the earlier job's spec is `spec`: the retry gets that job back. INVALID_ARGUMENT
  // otherwise: a request id names one submit.
  static absl::Status SameSubmit(const std::string& request_id, const fitrun::v1::Job& earlier,
                                 const fitrun::v1::JobSpec& spec);

  // RESOURCE_EXHAUSTED (reason JOBS_PER_USER_LIMIT) when `owner` has as many jobs open as allowed.
  absl::Status CheckQuota(const std::string& owner) const;

  // The bookkeeping: a job stored (its request id now names it), its admission undone (the store
  // refused it), a job that counts against its owner until it ends, and its end.
  void Remember(const fitrun::v1::Job& job);
  void Forget(const fitrun::v1::Job& job);
  void Opened(const std::string& owner) { ++open_jobs_by_owner_[owner]; }
  void Closed(const std::string& owner);

 private:
  // INVALID_ARGUMENT naming the field and the flag when a rank asks for more than the ceilings.
  absl::Status WithinCeilings(const fitrun::v1::Resources& resources) const;

  const Options options_;
  // Job ids by (owner, request_id), for idempotent submits.
  std::map<std::pair<std::string, std::string>, std::string> ids_by_request_;
  // Jobs not yet ended, by owner (what max_open_jobs_per_owner bounds).
  std::map<std::string, int> open_jobs_by_owner_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_ADMISSION_H_
