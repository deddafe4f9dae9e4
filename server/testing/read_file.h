// A file's whole text, as a test reads back what the code under test wrote (a rank's log, a pid
// file): a file not there yet reads as empty, so a test can poll on it.
#ifndef FITRUN_SERVER_TESTING_READ_FILE_H_
#define FITRUN_SERVER_TESTING_READ_FILE_H_

#include <string>

namespace fitrun::server {

// Everything in the file at `path`; empty when it is empty, missing or unreadable.
std::string ReadFileForTest(const std::string& path);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_TESTING_READ_FILE_H_
