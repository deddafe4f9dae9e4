#include "server/service/log_stream.h"

#include <string>
#include <vector>

#include "server/core/jobs/job_directory.h"
#include "server/service/grpc_status.h"

namespace fitrun::server {

LogFollowTicker::LogFollowTicker() {
  thread_ = std::thread([this] {
    absl::MutexLock lock(&mu_);
    while (!stopping_) {
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      mu_.AwaitWithTimeout(absl::Condition(&stopping), absl::Milliseconds(250));
      if (stopping_) break;
      std::vector<std::function<void()>> ticks;
      for (const auto& [id, tick] : ticks_) ticks.push_back(tick);
      mu_.Unlock();
      for (const auto& tick : ticks) tick();
      mu_.Lock();
    }
  });
}

LogFollowTicker::~LogFollowTicker() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

int64_t LogFollowTicker::Add(std::function<void()> tick) {
  absl::MutexLock lock(&mu_);
  const int64_t id = next_id_++;
  ticks_[id] = std::move(tick);
  return id;
}

void LogFollowTicker::Remove(int64_t id) {
  absl::MutexLock lock(&mu_);
  ticks_.erase(id);
}

void LogStreamReactor::Start() {
  absl::StatusOr<JobManager::LogFile> log = manager_->RankLog(request_.job_id(), request_.rank(), request_.attempt());
  if (!log.ok()) {
    FinishOnce(ToGrpcStatus(log.status()));
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    log_ = *log;
  }
  if (request_.follow()) {
    ticking_ = true;
    tick_ = ticker_->Add(Waker());
  }
  Pump();
}

LogStreamReactor::Step LogStreamReactor::Next(fitrun::v1::LogChunk* next, grpc::Status* status) {
  // Whether the attempt still runs is read before the file, so bytes written just before it
  // ended are still sent.
  bool running = false;
  if (request_.follow()) {
    absl::StatusOr<JobManager::LogFile> now = manager_->RankLog(request_.job_id(), request_.rank(), log_.attempt);
    running = now.ok() && now->attempt_running;
  }
  // The log is the job's file, which its ranks may replace with anything: it is opened once it
  // exists, as the job's account, and only as a regular file; then read in bounded chunks from the
  // file opened, whatever its name points to later.
  if (!file_.has_value()) {
    absl::StatusOr<UntrustedFile> opened = OpenRankLog(log_.job_dir, log_.run_as, log_.attempt, log_.rank);
    if (opened.ok()) {
      file_.emplace(*std::move(opened));
    } else if (!absl::IsNotFound(opened.status())) {
      *status = ToGrpcStatus(opened.status());
      return Step::kFinish;
    }
  }
  std::string data;
  if (file_.has_value()) {
    absl::StatusOr<std::string> read = file_->ReadAt(offset_, kChunk);
    if (!read.ok()) {
      *status = ToGrpcStatus(read.status());
      return Step::kFinish;
    }
    data = *std::move(read);
  }
  if (!data.empty()) {
    offset_ += static_cast<int64_t>(data.size());
    next->set_attempt(log_.attempt);
    next->set_rank(request_.rank());
    next->set_data(std::move(data));
    return Step::kWrite;
  }
  *status = grpc::Status::OK;
  return running ? Step::kWait : Step::kFinish;
}

}  // namespace fitrun::server
