// Why a plan is what it is, in words (Plan.reasons), and what would fit when nothing does: the
// planner's account of its choices (planner.h), kept apart from the search that makes them
// (plan_search.h). Pure functions of their inputs.
#ifndef FITRUN_SERVER_CORE_MEMORY_PLAN_REASONS_H_
#define FITRUN_SERVER_CORE_MEMORY_PLAN_REASONS_H_

#include <string>
#include <vector>

#include "fitrun/v1/job.pb.h"
#include "server/core/memory/plan_search.h"

namespace fitrun::server {

// One layout's choice, with what it was chosen from, for its reasons.
struct ChosenPlan {
  const fitrun::v1::JobSpec& spec;
  const ModelProfile& model;
  const Layout& layout;
  const RankEstimate& estimate;
  const BatchChoice& choice;
  const fitrun::v1::MemoryBreakdown& predicted;
  const PlanLimits& limits;
  // On a cluster (the devices name nodes); how many devices the plan could choose from; why larger
  // layouts were not chosen.
  bool cluster = false;
  int offered_devices = 0;
  const std::vector<std::string>& rejected;
};

// Every reason of the plan, in the order `fitrun plan` prints them: devices, batch, sharding,
// activation checkpointing, strategy, accumulation, the memory estimate's source, the GPU's costs
// beyond the tensors, the learning rate.
void AddPlanReasons(const ChosenPlan& chosen, fitrun::v1::Plan* plan);

// What would fit when nothing does: the smallest batch's need, fewer devices, bf16 ("; what would
// fit: ...", appended to the planner's error). `sorted`: the devices, roomiest first.
std::string WhatWouldFit(const fitrun::v1::JobSpec& spec, const ModelProfile& model,
                         const std::vector<const DeviceCapacity*>& sorted, const EstimatorOptions& estimator,
                         double headroom, int min_devices);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_MEMORY_PLAN_REASONS_H_
