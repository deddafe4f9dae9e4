// `fitrun top`'s frame: the coordinator's devices (memory against plan and peak, who holds each)
// and its unfinished jobs (how fast they train and how much of a step waits on communication).
// Pure functions of the replies, a clock and the terminal's size, so tests check whole frames.
#ifndef FITRUN_CLIENT_TOP_H_
#define FITRUN_CLIENT_TOP_H_

#include <string>
#include <vector>

#include "client/render.h"
#include "fitrun/v1/coordinator.pb.h"
#include "fitrun/v1/job.pb.h"

namespace fitrun::client {

// One refresh's replies.
struct TopSnapshot {
  v1::ListDevicesResponse devices;
  v1::ListJobsResponse jobs;
};

// The states whose jobs `top` lists, in the order it lists them: the ones using devices first.
std::vector<v1::JobState> TopJobStates();

// Where the frame goes. 0 means no limit (a pipe, a file). Longer lines are cut to `columns`; a frame
// taller than `rows` keeps its first rows - 1 lines and says how many it left out, as the jobs table
// comes last.
struct TopLayout {
  int columns = 0;
  int rows = 0;
};

// Memory cells of a device's bar.
inline constexpr int kTopBarWidth = 12;

// "[###|!.......]": a device's memory in kTopBarWidth cells of its total. While a rank holds it, '#'
// is the rank's peak up to the plan's prediction, '!' the peak beyond it and '|' marks the
// prediction; otherwise '#' is the memory in use. '.' is the rest.
std::string TopMemoryBar(const v1::Device& device, int width = kTopBarWidth);

// The whole frame, every line ending in '\n', no escape codes: a header, the device table, the job
// table (running, restarting, planning, queued; submission order within a state) and a legend.
std::string RenderTop(const TopSnapshot& snapshot, const RenderContext& context, const TopLayout& layout);

// The frame while the coordinator cannot be reached: the header and why, so a live top keeps going
// through a coordinator restart.
std::string RenderTopUnavailable(const std::string& why, const RenderContext& context, const TopLayout& layout);

}  // namespace fitrun::client

#endif  // FITRUN_CLIENT_TOP_H_
