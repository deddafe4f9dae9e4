// Human and JSON renderings of the coordinator's replies: one function per thing the CLI prints, so
// the commands stay a sequence of "call, render, print" and each rendering is tested on its own.
#ifndef FITRUN_CLIENT_RENDER_H_
#define FITRUN_CLIENT_RENDER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/loss_curve.h"
#include "fitrun/v1/coordinator.pb.h"
#include "fitrun/v1/job.pb.h"
#include "google/protobuf/message.h"

namespace fitrun::client {

// What renderings need to know about the reader's world: ages are relative to `now`, and times are
// shown in the reader's zone.
struct RenderContext {
  absl::Time now;
  absl::TimeZone zone;
};

// The proto's canonical JSON mapping, indented (or on one line: a JSON-lines record), every field
// present (a 0 loss is printed, not dropped) so scripts can rely on keys existing. Ends with a newline.
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message, bool one_line = false);

// `fitrun get`: one "key: value" line per fact the job has; with `loss_curve` (rank 0's loss over
// the steps, see LossCurve), a sparkline of it below the progress.
std::string RenderJob(const v1::Job& job, const RenderContext& context,
                      const std::vector<LossPoint>& loss_curve = {});

// `fitrun list`: id, name, state, devices, step/total, loss, age.
std::string RenderJobTable(const v1::ListJobsResponse& response, const RenderContext& context);

// `fitrun plan`: the choices, the predicted peak with its breakdown in MiB, and the reasons.
std::string RenderPlan(const v1::PlanJobResponse& response);

// `fitrun devices`: id, kind, name, total, free, a used/total bar, and the job holding it.
std::string RenderDeviceTable(const v1::ListDevicesResponse& response);

// What `fitrun watch` prints once the job has ended: the result for SUCCEEDED, else the state and
// why.
std::string RenderOutcome(const v1::Job& job);

}  // namespace fitrun::client

#endif  // FITRUN_CLIENT_RENDER_H_
