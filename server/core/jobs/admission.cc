#include "server/core/jobs/admission.h"

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/message_differencer.h"
#include "server/core/errors.h"
#include "server/core/units.h"
#include "server/sandbox/unix_account.h"
#include "server/core/specs/job_specs.h"

namespace fitrun::server {

absl::StatusOr<fitrun::v1::JobSpec> Admission::CheckSpec(fitrun::v1::JobSpec spec, const std::string& run_as) const {
  std::optional<FileAccessAs> as_owner;
  if (!run_as.empty()) {
    absl::StatusOr<UnixAccount> account = LookUpUnixAccount(run_as);
    if (!account.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("this user's jobs run as Unix account '", run_as, "': ", account.status().message(),
                       "; an operator fixes the account or the user's line in --auth_tokens"));
    }
    if (account->uid < options_.min_account_uid || account->gid == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "this user's jobs would run as Unix account '", run_as, "' (uid ", account->uid, ", gid ", account->gid,
          "), a system account: jobs run only as accounts with uid ", options_.min_account_uid,
          " or above (fitrund --min_account_uid) and a group other than root's; an operator maps the user to "
          "their own account"));
    }
    // Only when fitrund may switch (it is root); otherwise it reads with its own rights, as ranks run.
    if (CanRunAsOtherAccounts()) {
      as_owner.emplace(*account);
      if (!as_owner->status().ok()) return as_owner->status();
    }
  }
  // Before anything the spec names is opened (validation reads headers and sizes).
  if (absl::Status allowed = RefuseKernelPaths(spec); !allowed.ok()) return allowed;
  if (options_.data_roots.has_value()) {
    if (absl::Status allowed = options_.data_roots->Check(spec); !allowed.ok()) return allowed;
  }
  absl::StatusOr<fitrun::v1::JobSpec> normalized = NormalizeJobSpec(std::move(spec));
  if (!normalized.ok()) return normalized.status();
  if (absl::Status within = WithinCeilings(normalized->resources()); !within.ok()) return within;
  if (options_.max_nodes > 0 && normalized->resources().min_nodes() > options_.max_nodes) {
    return absl::InvalidArgumentError(absl::StrCat("spec.resources.min_nodes: ", normalized->resources().min_nodes(),
                                                   " nodes, but ", options_.max_nodes_reason));
  }
  return normalized;
}

absl::Status Admission::WithinCeilings(const fitrun::v1::Resources& resources) const {
  if (options_.max_rank_host_memory_bytes > 0 && !resources.host_memory().empty()) {
    absl::StatusOr<int64_t> bytes = ParseByteSize(resources.host_memory());  // validated already
    if (bytes.ok() && *bytes > options_.max_rank_host_memory_bytes) {
      return FieldError("spec.resources.host_memory",
                        absl::StrCat(resources.host_memory(), " per rank is more than this fitrund lets a rank have (",
                                     FormatBytes(options_.max_rank_host_memory_bytes),
                                     ", its --max_rank_host_memory); ask for at most that"));
    }
  }
  if (options_.max_rank_processes > 0 && resources.max_processes() > options_.max_rank_processes) {
    return FieldError("spec.resources.max_processes",
                      absl::StrCat(resources.max_processes(), " per rank is more than this fitrund lets a rank have (",
                                   options_.max_rank_processes, ", its --max_rank_processes); ask for at most that"));
  }
  return absl::OkStatus();
}

absl::Status Admission::CheckRequestId(const std::string& request_id) {
  if (request_id.size() > 128) {
    return absl::InvalidArgumentError(absl::StrCat("request_id: at most 128 characters (got ", request_id.size(), ")"));
  }
  return absl::OkStatus();
}

absl::Status Admission::SameSubmit(const std::string& request_id, const fitrun::v1::Job& earlier,
                                   const fitrun::v1::JobSpec& spec) {
  if (google::protobuf::util::MessageDifferencer::Equals(earlier.spec(), spec)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("request_id: '", request_id, "' already created job ", earlier.id(),
                                                 " with a different spec; use a new request_id"));
}

}  // namespace fitrun::server
