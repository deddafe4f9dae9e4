// A script rank's environment as the tests read it: by name, not as the KEY=VALUE list execve takes.
#ifndef FITRUN_WORKER_TESTING_SCRIPT_ENV_H_
#define FITRUN_WORKER_TESTING_SCRIPT_ENV_H_

#include <map>
#include <string>

#include "worker/script/script_process.h"

namespace fitrun::worker::testing {

// `command.env` by name (a name given twice keeps its later value).
std::map<std::string, std::string> EnvOf(const ScriptCommand& command);

}  // namespace fitrun::worker::testing

#endif  // FITRUN_WORKER_TESTING_SCRIPT_ENV_H_
