// The names a job spec's YAML gives its enums ("sgd", "fp32", "powersgd", "cross_entropy"): one table
// per enum, read by the parser and quoted by the checks' messages.
#ifndef FITRUN_SERVER_CORE_SPECS_SPEC_NAMES_H_
#define FITRUN_SERVER_CORE_SPECS_SPEC_NAMES_H_

#include <string>
#include <utility>
#include <vector>

#include "fitrun/v1/job.pb.h"

namespace fitrun::server {

const std::vector<std::pair<std::string, fitrun::v1::LossKind>>& LossNames();
const std::vector<std::pair<std::string, fitrun::v1::OptimizerKind>>& OptimizerNames();
const std::vector<std::pair<std::string, fitrun::v1::CommHook>>& CommHookNames();
const std::vector<std::pair<std::string, fitrun::v1::Precision>>& PrecisionNames();
// "none" for a value without a name.
std::string CommHookNameOf(fitrun::v1::CommHook hook);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_SPECS_SPEC_NAMES_H_
