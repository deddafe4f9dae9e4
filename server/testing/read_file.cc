#include "server/testing/read_file.h"

#include <fstream>
#include <sstream>

namespace fitrun::server {

std::string ReadFileForTest(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace fitrun::server
