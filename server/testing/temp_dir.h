// fitrund's tests name the directory of a test's own (proto/contract/testing/temp_dir.h, shared with
// the worker's tests) as one of their own helpers, beside WaitUntil.
#ifndef FITRUN_SERVER_TESTING_TEMP_DIR_H_
#define FITRUN_SERVER_TESTING_TEMP_DIR_H_

#include "proto/contract/testing/temp_dir.h"

namespace fitrun::server {

using TempDir = contract::TempDir;

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_TESTING_TEMP_DIR_H_
