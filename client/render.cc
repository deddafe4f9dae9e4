#include "client/render.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/format.h"
#include "client/watch_state.h"
#include "google/protobuf/util/json_util.h"

namespace fitrun::client {
namespace {

// "key:" padded so that the values of one block start in the same column.
std::string KeyValueBlock(const std::vector<std::pair<std::string, std::string>>& rows) {
  size_t width = 0;
  for (const auto& [key, value] : rows) width = std::max(width, key.size() + 1);
  std::string out;
  for (const auto& [key, value] : rows) {
    absl::StrAppend(&out, absl::StrFormat("%-*s %s\n", static_cast<int>(width), key + ":", value));
  }
  return out;
}

std::string FormatTimeAndAge(const google::protobuf::Timestamp& timestamp,
                             const RenderContext& context) {
  const absl::Time time = ToAbslTime(timestamp);
  return absl::StrCat(absl::FormatTime("%Y-%m-%d %H:%M:%S %Z", time, context.zone), " (",
                      FormatShortDuration(context.now - time), " ago)");
}

std::string FormatStep(const v1::Progress& progress) {
  if (progress.total_steps() > 0) {
    return absl::StrCat(progress.step(), "/", progress.total_steps());
  }
  return absl::StrCat(progress.step());
}

// Short runs finish in seconds, where the decimal is the interesting part.
std::string FormatTrainTime(double seconds) {
  if (seconds < 60) return absl::StrFormat("%.1fs", seconds);
  return FormatShortDuration(absl::Seconds(seconds));
}

bool HasProgress(const v1::Job& job) {
  return job.has_last_progress() &&
         (job.last_progress().step() > 0 || job.last_progress().total_steps() > 0);
}

}  // namespace

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message, bool one_line) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = !one_line;
  options.always_print_primitive_fields = true;
  std::string json;
  const auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("cannot print ", message.GetTypeName(),
                                            " as JSON: ", status.ToString()));
  }
  if (json.empty() || json.back() != '\n') json += '\n';
  return json;
}

std::string RenderJob(const v1::Job& job, const RenderContext& context, const std::vector<LossPoint>& loss_curve) {
  std::vector<std::pair<std::string, std::string>> rows;
  rows.emplace_back("id", job.id());
  if (!job.spec().name().empty()) rows.emplace_back("name", job.spec().name());
  std::string state = StateName(job.state());
  if (job.attempts() > 1) absl::StrAppend(&state, " (attempt ", job.attempts(), ")");
  rows.emplace_back("state", state);
  if (HasTime(job.created_at())) rows.emplace_back("created", FormatTimeAndAge(job.created_at(), context));
  if (HasTime(job.started_at())) rows.emplace_back("started", FormatTimeAndAge(job.started_at(), context));
  if (HasTime(job.finished_at())) {
    rows.emplace_back("finished", FormatTimeAndAge(job.finished_at(), context));
  }
  if (job.has_plan() && job.plan().device_ids_size() > 0) {
    rows.emplace_back("plan", DescribePlan(job.plan()));
  }
  if (!job.allocation_status().empty()) rows.emplace_back("allocation", job.allocation_status());
  if (HasProgress(job)) {
    const v1::Progress& progress = job.last_progress();
    rows.emplace_back("progress", absl::StrCat("step ", FormatStep(progress), ", epoch ",
                                               progress.epoch(), ", loss ",
                                               FormatLoss(progress.loss())));
  }
  if (std::string curve = RenderLossCurve(loss_curve); !curve.empty()) rows.emplace_back("loss curve", curve);
  if (!job.failure_reason().empty()) rows.emplace_back("failure", job.failure_reason());
  if (job.state() == v1::JOB_STATE_SUCCEEDED && job.has_result()) {
    const v1::JobResult& result = job.result();
    std::string text = absl::StrFormat("final loss %s, %d steps, train time %s", FormatLoss(result.final_loss()),
                                       result.steps(), FormatTrainTime(result.train_seconds()));
    std::string figures;
    for (const auto& [name, value] : FormatMetrics(result.metrics())) absl::StrAppend(&figures, name, " ", value, ", ");
    text = figures + text;
    if (result.has_test_accuracy()) text = absl::StrFormat("test accuracy %.4f, ", result.test_accuracy()) + text;
    rows.emplace_back("result", text);
  }
  // Restarts and re-plans against their limits, and what each out-of-memory error measured.
  if (job.restarts() > 0 || job.oom_replans() > 0 || job.oom_history_size() > 0) {
    const v1::FaultTolerance& limits = job.spec().fault_tolerance();
    rows.emplace_back("recovery", absl::StrCat(job.restarts(), " of ", limits.max_restarts(), " restart(s), ",
                                               job.oom_replans(), " of ", limits.max_oom_retries(),
                                               " out-of-memory re-plan(s)"));
  }
  for (const v1::OutOfMemory& oom : job.oom_history()) {
    if (oom.host_limit_bytes() > 0) {
      std::string text = absl::StrCat("rank ", oom.rank(), ", per-device batch ", oom.per_device_batch(),
                                      ": the attempt's host memory");
      if (oom.host_limit_bytes() > 1) absl::StrAppend(&text, " (limit ", FormatBytes(oom.host_limit_bytes()), ")");
      rows.emplace_back("out of memory", text);
      continue;
    }
    std::string text = absl::StrCat("rank ", oom.rank(), " at step ", oom.step(), ", per-device batch ",
                                    oom.per_device_batch());
    if (oom.cap_bytes() > 0) {
      absl::StrAppend(&text, ": asked for ", FormatBytes(oom.requested_bytes()), " with ", FormatBytes(oom.live_bytes()),
                      " in use of ", FormatBytes(oom.cap_bytes()));
    }
    rows.emplace_back("out of memory", text);
  }
  // Every launch, oldest first: where it ran, with what batch, how it ended and how each rank exited.
  for (const v1::AttemptRecord& attempt : job.attempt_history()) {
    std::string text = absl::StrCat(attempt.device_ids_size(), " device(s), per-device batch ",
                                    attempt.per_device_batch(), " x ", attempt.grad_accum_steps(), ": ",
                                    attempt.outcome().empty() ? "running" : attempt.outcome());
    std::vector<std::string> ranks;
    for (const v1::RankOutcome& rank : attempt.ranks()) {
      if (!rank.exited()) {
        ranks.push_back(absl::StrCat(rank.rank(), " running (pid ", rank.pid(), ")"));
      } else if (rank.signal() != 0) {
        ranks.push_back(absl::StrCat(rank.rank(), " signal ", rank.signal()));
      } else {
        ranks.push_back(absl::StrCat(rank.rank(), " exit ", rank.exit_code()));
      }
    }
    if (!ranks.empty()) absl::StrAppend(&text, " [ranks: ", absl::StrJoin(ranks, ", "), "]");
    // The memory estimator's error on this attempt: what its ranks peaked at against the plan.
    if (attempt.measured_peak_bytes() > 0 && attempt.predicted_peak_bytes() > 0) {
      absl::StrAppend(&text, absl::StrFormat("; memory: peaked at %s of %s predicted (%.0f%%)",
                                             FormatBytes(attempt.measured_peak_bytes()),
                                             FormatBytes(attempt.predicted_peak_bytes()),
                                             100.0 * attempt.measured_peak_bytes() / attempt.predicted_peak_bytes()));
    } else if (attempt.measured_peak_bytes() > 0) {
      // A plan from the run: nothing was predicted, the run measured it.
      absl::StrAppend(&text, "; memory: peaked at ", FormatBytes(attempt.measured_peak_bytes()), " (measured by this run)");
    }
    rows.emplace_back(absl::StrCat("attempt ", attempt.attempt()), text);
  }
  return KeyValueBlock(rows);
}

std::string RenderJobTable(const v1::ListJobsResponse& response, const RenderContext& context) {
  if (response.jobs().empty()) return "no jobs\n";
  std::vector<std::vector<std::string>> rows;
  for (const v1::Job& job : response.jobs()) {
    const bool has_plan = job.plan().device_ids_size() > 0;
    const bool has_progress = HasProgress(job);
    rows.push_back({
        job.id(),
        job.spec().name(),
        StateName(job.state()),
        has_plan ? absl::StrCat(job.plan().device_ids_size()) : "-",
        has_progress ? FormatStep(job.last_progress()) : "-",
        has_progress ? FormatLoss(job.last_progress().loss()) : "-",
        HasTime(job.created_at()) ? FormatShortDuration(context.now - ToAbslTime(job.created_at()))
                                  : "-",
    });
  }
  return FormatTable({{"ID"},
                      {"NAME"},
                      {"STATE"},
                      {"DEVICES", true},
                      {"STEP", true},
                      {"LOSS", true},
                      {"AGE", true}},
                     rows);
}

std::string RenderPlan(const v1::PlanJobResponse& response) {
  const v1::Plan& plan = response.plan();
  const int64_t computed_global_batch =
      static_cast<int64_t>(plan.device_ids_size()) * plan.per_device_batch() *
      plan.grad_accum_steps();
  const int64_t global_batch = response.spec().global_batch_size() > 0
                                   ? response.spec().global_batch_size()
                                   : computed_global_batch;

  std::string steps = absl::StrCat(plan.total_steps());
  if (plan.steps_per_epoch() > 0) absl::StrAppend(&steps, " (", plan.steps_per_epoch(), " per epoch)");

  std::vector<std::pair<std::string, std::string>> rows = {
      {"devices", absl::StrCat(plan.device_ids_size(), " (", absl::StrJoin(plan.device_ids(), ", "), ")")},
  };
  if (plan.nodes_size() > 0) {
    rows.emplace_back("nodes", absl::StrCat(plan.nodes_size(), " x ", plan.devices_per_node(), " devices (",
                                            absl::StrJoin(plan.nodes(), ", "), ")"));
  }
  rows.insert(rows.end(), {
                              {"per-device batch", absl::StrCat(plan.per_device_batch())},
                              {"grad accumulation", absl::StrCat(plan.grad_accum_steps())},
                          });
  if (plan.zero_stage() == 1) {
    rows.emplace_back("optimizer states",
                      absl::StrCat("sharded over the ", plan.device_ids_size(), " ranks (zero stage 1)"));
  }
  if (plan.activation_checkpointing()) rows.emplace_back("activations", "recomputed in backward (checkpointing)");
  rows.insert(rows.end(), {
                              {"global batch", absl::StrCat(global_batch)},
                              {"learning rate", absl::StrFormat("%g", plan.learning_rate())},
                              {"steps", steps},
                              {"predicted peak", absl::StrCat(FormatMiB(plan.predicted().total_bytes()), " per device")},
                          });
  std::string out = KeyValueBlock(rows);

  const v1::MemoryBreakdown& predicted = plan.predicted();
  const std::vector<std::pair<std::string, int64_t>> breakdown = {
      {"weights", predicted.weights_bytes()},
      {"gradients", predicted.gradients_bytes()},
      {"optimizer state", predicted.optimizer_state_bytes()},
      {"ddp buckets", predicted.ddp_buckets_bytes()},
      {"activations", predicted.activations_bytes()},
      {"workspace", predicted.workspace_bytes()},
      {"framework overhead", predicted.framework_overhead_bytes()},
      {"safety margin", predicted.safety_margin_bytes()},
  };
  size_t name_width = 0;
  size_t value_width = 0;
  for (const auto& [name, bytes] : breakdown) {
    name_width = std::max(name_width, name.size());
    value_width = std::max(value_width, FormatMiB(bytes).size());
  }
  for (const auto& [name, bytes] : breakdown) {
    absl::StrAppend(&out, absl::StrFormat("  %-*s  %*s\n", static_cast<int>(name_width), name,
                                          static_cast<int>(value_width), FormatMiB(bytes)));
  }

  if (!plan.reasons().empty()) {
    absl::StrAppend(&out, "reasons:\n");
    for (const std::string& reason : plan.reasons()) absl::StrAppend(&out, "  ", reason, "\n");
  }
  return out;
}

std::string RenderDeviceTable(const v1::ListDevicesResponse& response) {
  if (response.devices().empty()) return "no devices\n";
  std::vector<std::vector<std::string>> rows;
  for (const v1::Device& device : response.devices()) {
    // Not every source reports used memory directly; total - free is what the job could not have.
    const int64_t used = device.used_bytes() > 0
                             ? device.used_bytes()
                             : std::max<int64_t>(device.total_bytes() - device.free_bytes(), 0);
    std::string job = "-";
    if (!device.job_id().empty()) job = absl::StrCat(device.job_id(), " (rank ", device.rank(), ")");
    rows.push_back({
        device.id(),
        DeviceKindName(device.kind()),
        device.name(),
        FormatBytes(device.total_bytes()),
        FormatBytes(device.free_bytes()),
        MemoryBar(used, device.total_bytes()),
        job,
    });
  }
  return FormatTable({{"ID"},
                      {"KIND"},
                      {"NAME"},
                      {"TOTAL", true},
                      {"FREE", true},
                      {"USED"},
                      {"JOB"}},
                     rows);
}

std::string RenderOutcome(const v1::Job& job) {
  if (job.state() == v1::JOB_STATE_SUCCEEDED) {
    const v1::JobResult& result = job.result();
    std::vector<std::pair<std::string, std::string>> rows;
    if (result.has_test_accuracy()) rows.emplace_back("test accuracy", absl::StrFormat("%.4f", result.test_accuracy()));
    for (auto& metric : FormatMetrics(result.metrics())) rows.push_back(std::move(metric));
    // A script that reports no progress leaves steps and loss unknown, not zero.
    if (result.steps() > 0) {
      rows.emplace_back("final loss", FormatLoss(result.final_loss()));
      rows.emplace_back("steps", absl::StrCat(result.steps()));
    }
    rows.emplace_back(job.spec().has_script() ? "run time" : "train time", FormatTrainTime(result.train_seconds()));
    return absl::StrCat("job ", job.id(), " SUCCEEDED\n", KeyValueBlock(rows));
  }
  std::string line = absl::StrCat("job ", job.id(), " ", StateName(job.state()));
  if (job.attempts() > 1) absl::StrAppend(&line, " after ", job.attempts(), " attempts");
  if (!job.failure_reason().empty()) absl::StrAppend(&line, ": ", job.failure_reason());
  return absl::StrCat(line, "\n");
}

}  // namespace fitrun::client
