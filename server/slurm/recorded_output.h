// For the tests: output recorded from a real Slurm 22.05.8 (testdata/README.md says how).
#ifndef FITRUN_SERVER_SLURM_RECORDED_OUTPUT_H_
#define FITRUN_SERVER_SLURM_RECORDED_OUTPUT_H_

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace fitrun::server::slurm {

// The text of testdata/<name>, from the test's runfiles.
inline std::string Sample(const std::string& name) {
  const std::string path =
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"), "/server/slurm/testdata/", name);
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace fitrun::server::slurm

#endif  // FITRUN_SERVER_SLURM_RECORDED_OUTPUT_H_
