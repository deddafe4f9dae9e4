#include "worker/testing/script_env.h"

namespace fitrun::worker::testing {

std::map<std::string, std::string> EnvOf(const ScriptCommand& command) {
  std::map<std::string, std::string> env;
  for (const std::string& entry : command.env) {
    const size_t eq = entry.find('=');
    env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return env;
}

}  // namespace fitrun::worker::testing
