// Each built-in workload's analytic memory profile: parameters, activation and input bytes per
// sample and training samples, counted by formula from the spec's model config and read off its data
// files (errors name the spec field). The workload registry (workloads.h) picks the one a spec needs;
// these are upper bounds the memory probe (server/core/calibration) replaces with measurements.
#ifndef FITRUN_SERVER_CORE_SPECS_WORKLOAD_PROFILES_H_
#define FITRUN_SERVER_CORE_SPECS_WORKLOAD_PROFILES_H_

#include "absl/status/statusor.h"
#include "fitrun/v1/job.pb.h"
#include "server/core/memory/model_profile.h"

namespace fitrun::server {

// The built-in image models on Fashion-MNIST's 60,000 training images.
ModelProfile MlpProfile();
ModelProfile CnnProfile();
// `profile` on the images the spec's Fashion-MNIST files hold (SpecFileFacts.image_samples).
absl::StatusOr<ModelProfile> OnFashionMnist(ModelProfile profile, const fitrun::v1::JobSpec& spec);
absl::StatusOr<ModelProfile> GptProfile(const fitrun::v1::JobSpec& spec);
absl::StatusOr<ModelProfile> SasRecProfile(const fitrun::v1::JobSpec& spec);
absl::StatusOr<ModelProfile> TorchScriptProfile(const fitrun::v1::JobSpec& spec);
absl::StatusOr<ModelProfile> GptRecommenderProfile(const fitrun::v1::JobSpec& spec);
absl::StatusOr<ModelProfile> TorchScriptOnTensorsProfile(const fitrun::v1::JobSpec& spec);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_SPECS_WORKLOAD_PROFILES_H_
