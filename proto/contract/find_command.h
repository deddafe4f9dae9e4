// How the program of a rank's command is found: as execvp (and torchrun) find it. fitrund checks a
// script spec's command with it at submit, and the worker that supervises the script rank runs what
// it finds, so the two can never disagree about which program a spec names.
#ifndef FITRUN_PROTO_CONTRACT_FIND_COMMAND_H_
#define FITRUN_PROTO_CONTRACT_FIND_COMMAND_H_

#include <string>

#include "absl/status/statusor.h"

namespace fitrun::contract::launch {

// A name with a slash is taken as given (relative to `working_dir`); any other name is looked up on
// this process's PATH. The program must be an executable regular file. NOT_FOUND says where it
// looked and what to do.
absl::StatusOr<std::string> FindCommand(const std::string& name, const std::string& working_dir);

}  // namespace fitrun::contract::launch

#endif  // FITRUN_PROTO_CONTRACT_FIND_COMMAND_H_
