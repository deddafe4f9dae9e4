// Jobs as the job lifecycle's parts see them, for their tests: only the fields a test is about, no
// manager behind them.
#ifndef FITRUN_SERVER_CORE_JOBS_TEST_JOBS_H_
#define FITRUN_SERVER_CORE_JOBS_TEST_JOBS_H_

#include <string>

#include "fitrun/v1/job.pb.h"

namespace fitrun::server {

// Job `id` of `owner`, created by a submit with `request_id` (empty: none); no spec.
inline fitrun::v1::Job JobOf(const std::string& id, const std::string& owner, const std::string& request_id) {
  fitrun::v1::Job job;
  job.set_id(id);
  job.set_owner(owner);
  job.set_request_id(request_id);
  return job;
}

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_CORE_JOBS_TEST_JOBS_H_
