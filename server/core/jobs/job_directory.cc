#include "server/core/jobs/job_directory.h"

#include <filesystem>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace fitrun::server {

std::string JobDirectoryPath(const std::string& jobs_dir, const std::string& job_id) {
  return (std::filesystem::path(jobs_dir) / job_id).string();
}

std::string AttemptDirectoryName(int attempt) { return absl::StrCat("attempt-", attempt); }

std::string RankLogName(int attempt, int rank) {
  return absl::StrCat(AttemptDirectoryName(attempt), "/rank-", rank, ".log");
}

absl::StatusOr<OwnedDirectory> OpenJobDirectory(const std::string& job_dir, const std::string& run_as) {
  std::optional<UnixAccount> owner;
  if (!run_as.empty()) {
    absl::StatusOr<UnixAccount> account = LookUpUnixAccount(run_as);
    if (!account.ok()) return account.status();
    owner = *account;
  }
  return OwnedDirectory::Open(job_dir, owner, /*create=*/false);
}

absl::StatusOr<UntrustedFile> OpenRankLog(const std::string& job_dir, const std::string& run_as, int attempt,
                                          int rank) {
  absl::StatusOr<OwnedDirectory> dir = OpenJobDirectory(job_dir, run_as);
  if (!dir.ok()) return dir.status();
  return dir->OpenForReading(RankLogName(attempt, rank));
}

std::string RankLogTail(const std::string& job_dir, const std::string& run_as, int attempt, int rank,
                        size_t max_lines, size_t max_bytes) {
  absl::StatusOr<UntrustedFile> log = OpenRankLog(job_dir, run_as, attempt, rank);
  if (absl::IsNotFound(log.status())) return "";
  absl::StatusOr<UntrustedFile::Tail> tail = log.ok() ? log->ReadTail(max_bytes)
                                                       : absl::StatusOr<UntrustedFile::Tail>(log.status());
  if (!tail.ok()) return absl::StrCat("(its log cannot be shown: ", tail.status().message(), ")");
  std::vector<std::string> lines = absl::StrSplit(tail->bytes, '\n', absl::SkipEmpty());
  if (tail->offset > 0 && !lines.empty()) lines.erase(lines.begin());  // the first line is cut
  if (lines.size() > max_lines) lines.erase(lines.begin(), lines.end() - static_cast<long>(max_lines));
  return absl::StrJoin(lines, "\n");
}

}  // namespace fitrun::server
