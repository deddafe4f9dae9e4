// Comparing a secret a caller presents (a job's token in a rank's hello) with the one on record.
#ifndef FITRUN_SERVER_AUTH_SAME_SECRET_H_
#define FITRUN_SERVER_AUTH_SAME_SECRET_H_

#include <string>

namespace fitrun::server {

// Whether `given` is `secret`, in time that does not depend on where they differ (a caller learns
// nothing of how much it guessed); never for an empty secret.
bool SameSecret(const std::string& given, const std::string& secret);

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_AUTH_SAME_SECRET_H_
