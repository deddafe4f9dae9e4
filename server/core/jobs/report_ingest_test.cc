// Report ingest on its own: each kind of report becomes its event with the rank set, updates the
// rank (peak, step, progress, final report, failure), moves the job's progress and the metrics on rank
// 0's reports, ends a recovery with one "training resumed" line, and says which reports need the job
// manager's decision.
#include "server/core/jobs/report_ingest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "server/core/testing/recording_metrics.h"

namespace fitrun::server {
namespace {

using ::testing::HasSubstr;

class ReportIngestTest : public ::testing::Test {
 protected:
  ReportIngestTest() : ingest_(&metrics_, [this] { return now_; }) {
    entry_.record.job.set_id("j-000001");
    entry_.record.job.set_state(fitrun::v1::JOB_STATE_RUNNING);
    entry_.active.emplace();
    entry_.active->attempt = 2;
    entry_.active->ranks.resize(2);
  }

  ReportIngest::Ingested Progress(int rank, int64_t step, int64_t peak) {
    fitrun::v1::WorkerReport report;
    report.mutable_progress()->set_step(step);
    report.mutable_progress()->set_peak_bytes(peak);
    return ingest_.Ingest(entry_, rank, report);
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  RecordingMetrics metrics_;
  ReportIngest ingest_;
  JobEntry entry_;
};

TEST_F(ReportIngestTest, ProgressKeepsTheRanksHighestPeakAndLatestStep) {
  ReportIngest::Ingested first = Progress(1, 5, 300);
  ASSERT_EQ(first.events.size(), 1u);
  EXPECT_EQ(first.events[0].progress().rank(), 1);
  EXPECT_EQ(first.next, ReportIngest::Next::kNothing);
  Progress(1, 6, 200);
  const RankState& rank = entry_.active->ranks[1];
  EXPECT_EQ(rank.peak_bytes, 300);
  EXPECT_EQ(rank.last_step, 6);
  EXPECT_EQ(rank.last_progress.step(), 6);
  EXPECT_EQ(rank.last_heard, now_);
  EXPECT_EQ(entry_.record.job.last_progress().step(), 0) << "only rank 0 moves the job's progress";
}

TEST_F(ReportIngestTest, RankZerosProgressMovesTheJobAndCountsTheStepsDone) {
  Progress(0, 10, 1);
  Progress(0, 25, 1);
  EXPECT_EQ(entry_.record.job.last_progress().step(), 25);
  EXPECT_EQ(metrics_.steps(), 25);
}

TEST_F(ReportIngestTest, TheFirstStepAfterARecoveryEndsItWithOneLine) {
  entry_.recovering_since = now_;
  now_ += absl::Milliseconds(1500);
  ReportIngest::Ingested resumed = Progress(0, 7, 1);
  ASSERT_EQ(resumed.events.size(), 2u);
  EXPECT_EQ(resumed.events[0].log().text(), "training resumed at step 7 of attempt 2, 1.5 s after the failure");
  EXPECT_EQ(resumed.events[0].log().rank(), -1);
  EXPECT_TRUE(resumed.events[1].has_progress()) << "the line goes out before the progress it announces";
  EXPECT_FALSE(entry_.recovering_since.has_value());
  EXPECT_EQ(metrics_.recoveries().size(), 1u);
  EXPECT_EQ(Progress(0, 8, 1).events.size(), 1u);
}

TEST_F(ReportIngestTest, AnOutOfMemoryReportMarksTheRankAndAsksForARePlan) {
  fitrun::v1::WorkerReport report;
  report.mutable_oom()->set_step(4);
  report.mutable_oom()->set_per_device_batch(64);
  ReportIngest::Ingested ingested = ingest_.Ingest(entry_, 1, report);
  EXPECT_EQ(ingested.next, ReportIngest::Next::kOutOfMemory);
  ASSERT_EQ(ingested.events.size(), 1u);
  EXPECT_EQ(ingested.events[0].oom().rank(), 1);
  EXPECT_EQ(ingested.events[0].oom().per_device_batch(), 64);
  EXPECT_TRUE(entry_.active->ranks[1].exiting_on_its_own) << "it exits with its own code: no SIGTERM";
  EXPECT_TRUE(entry_.active->out_of_memory);
}

TEST_F(ReportIngestTest, AFinishedReportIsKeptAndItsPeakStandsInForMissingProgress) {
  fitrun::v1::WorkerReport report;
  report.mutable_finished()->set_steps(10);
  report.mutable_finished()->set_peak_bytes(4096);
  ReportIngest::Ingested ingested = ingest_.Ingest(entry_, 0, report);
  EXPECT_EQ(ingested.next, ReportIngest::Next::kFinished);
  EXPECT_EQ(ingested.events[0].rank_finished().rank(), 0);
  ASSERT_TRUE(entry_.active->ranks[0].finished.has_value());
  EXPECT_EQ(entry_.active->ranks[0].peak_bytes, 4096);
}

TEST_F(ReportIngestTest, FailuresLogsAndCheckpointsBecomeTheirEvents) {
  fitrun::v1::WorkerReport failed;
  failed.mutable_failed()->set_reason("spec.model.torchscript: cannot load");
  ReportIngest::Ingested f = ingest_.Ingest(entry_, 1, failed);
  EXPECT_EQ(f.events[0].log().text(), "failed: spec.model.torchscript: cannot load");
  EXPECT_EQ(entry_.active->ranks[1].failure_report, "spec.model.torchscript: cannot load");

  fitrun::v1::WorkerReport saved;
  saved.mutable_checkpoint_saved()->set_step(5);
  saved.mutable_checkpoint_saved()->set_seconds(0.25);
  EXPECT_EQ(ingest_.Ingest(entry_, 0, saved).events[0].checkpoint_saved().rank(), 0);
  EXPECT_EQ(metrics_.checkpoint_times().size(), 1u);

  fitrun::v1::WorkerReport save_failed;
  save_failed.mutable_checkpoint_failed()->set_error("disk full");
  EXPECT_EQ(ingest_.Ingest(entry_, 0, save_failed).events[0].checkpoint_failed().rank(), 0);
  EXPECT_EQ(metrics_.checkpoint_failures(), 1);

  fitrun::v1::WorkerReport log;
  log.mutable_log()->set_text("hello");
  EXPECT_EQ(ingest_.Ingest(entry_, 1, log).events[0].log().rank(), 1);
}

TEST_F(ReportIngestTest, ARanksTextIsCutAndAnOversizedReportIsNotKept) {
  // A log line past the limit, cut inside a two-byte character: the cut backs off to its start.
  fitrun::v1::WorkerReport log;
  log.mutable_log()->set_text(std::string(ReportIngest::kMaxTextBytes - 1, 'a') + "\xc3\xa9" + std::string(1 << 20, 'b'));
  const std::string text = ingest_.Ingest(entry_, 1, log).events[0].log().text();
  EXPECT_EQ(text, std::string(ReportIngest::kMaxTextBytes - 1, 'a') + " [1048578 more bytes cut]");

  fitrun::v1::WorkerReport failed;
  failed.mutable_failed()->set_reason(std::string(1 << 20, 'r'));
  ReportIngest::Ingested f = ingest_.Ingest(entry_, 0, failed);
  EXPECT_EQ(entry_.active->ranks[0].failure_report.size(), ReportIngest::kMaxTextBytes + 25);
  EXPECT_LT(f.events[0].ByteSizeLong(), ReportIngest::kMaxTextBytes + 100);

  // A progress report with a megabyte of metric names: one line instead, the rank left as it was.
  fitrun::v1::WorkerReport progress;
  progress.mutable_progress()->set_step(7);
  progress.mutable_progress()->set_peak_bytes(int64_t{1} << 40);
  (*progress.mutable_progress()->mutable_metrics())[std::string(1 << 20, 'm')] = 1.0;
  ReportIngest::Ingested p = ingest_.Ingest(entry_, 1, progress);
  ASSERT_EQ(p.events.size(), 1u);
  EXPECT_THAT(p.events[0].log().text(),
              HasSubstr("rank 1 sent a progress report of 1048"));
  EXPECT_THAT(p.events[0].log().text(), HasSubstr("more than the 65536 a report may carry; it was not kept"));
  EXPECT_EQ(entry_.active->ranks[1].peak_bytes, 0);
  EXPECT_EQ(entry_.active->ranks[1].last_step, 0);
}

TEST_F(ReportIngestTest, ARankSendingFasterThanItsBudgetHasReportsDroppedAndCounted) {
  fitrun::v1::WorkerReport log;
  log.mutable_log()->set_text(std::string(ReportIngest::kMaxTextBytes, 'l'));
  const double bytes = static_cast<double>(log.ByteSizeLong());
  // The burst goes through, every report its event.
  const int burst = static_cast<int>(ReportIngest::kReportBurstBytes / bytes);
  for (int i = 0; i < burst; ++i) ASSERT_EQ(ingest_.Ingest(entry_, 1, log).events.size(), 1u) << i;
  // Then one line says reports are dropped, and the next ones are dropped without a word.
  ReportIngest::Ingested told = ingest_.Ingest(entry_, 1, log);
  ASSERT_EQ(told.events.size(), 1u);
  EXPECT_EQ(told.events[0].log().text(), "rank 1 sends reports faster than 1024 KiB/s: 1 were not kept");
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(ingest_.Ingest(entry_, 1, log).events.empty());
  // The other rank is not held back.
  EXPECT_EQ(ingest_.Ingest(entry_, 0, log).events.size(), 1u);
  // Ten seconds after the line, ten seconds' worth goes through again, and the next drop is told
  // with every drop since (the five above and itself).
  now_ += ReportIngest::kDropsToldEvery;
  int through = 0;
  std::string told_later;
  while (told_later.empty()) {
    ReportIngest::Ingested one = ingest_.Ingest(entry_, 1, log);
    ASSERT_EQ(one.events.size(), 1u);
    if (absl::StrContains(one.events[0].log().text(), "were not kept")) {
      told_later = one.events[0].log().text();
    } else {
      ASSERT_LT(++through, 100000);
    }
  }
  EXPECT_NEAR(through, absl::ToDoubleSeconds(ReportIngest::kDropsToldEvery) * ReportIngest::kReportBytesPerSecond / bytes,
              2);
  EXPECT_EQ(told_later, "rank 1 sends reports faster than 1024 KiB/s: 6 were not kept");
  // Its final report goes through with the budget spent, after a line with what was dropped since.
  ingest_.Ingest(entry_, 1, log);
  fitrun::v1::WorkerReport finished;
  finished.mutable_finished()->set_steps(3);
  ReportIngest::Ingested end = ingest_.Ingest(entry_, 1, finished);
  EXPECT_EQ(end.next, ReportIngest::Next::kFinished);
  ASSERT_EQ(end.events.size(), 2u);
  EXPECT_EQ(end.events[0].log().text(), "rank 1 sends reports faster than 1024 KiB/s: 1 were not kept");
  EXPECT_TRUE(end.events[1].has_rank_finished());
}

TEST_F(ReportIngestTest, EveryKindOfReportTakesFromTheBudget) {
  // Heartbeats and repeated ends are counted too: a flood of either spends the budget.
  fitrun::v1::WorkerReport heartbeat;
  heartbeat.mutable_heartbeat()->set_step(123456789);
  const int heartbeats = static_cast<int>(ReportIngest::kReportBurstBytes / static_cast<double>(heartbeat.ByteSizeLong()));
  for (int i = 0; i < heartbeats; ++i) ingest_.Ingest(entry_, 1, heartbeat);
  fitrun::v1::WorkerReport log;
  log.mutable_log()->set_text("after the flood");
  ReportIngest::Ingested dropped = ingest_.Ingest(entry_, 1, log);
  ASSERT_EQ(dropped.events.size(), 1u);
  EXPECT_THAT(dropped.events[0].log().text(), HasSubstr("faster than 1024 KiB/s"));
}

TEST_F(ReportIngestTest, ARanksAttemptEndsOnceAndRepeatedEndsAreDroppedAndCounted) {
  fitrun::v1::WorkerReport oom;
  oom.mutable_oom()->set_step(4);
  fitrun::v1::WorkerReport failed;
  failed.mutable_failed()->set_reason(std::string(ReportIngest::kMaxTextBytes, 'f'));
  fitrun::v1::WorkerReport finished;
  finished.mutable_finished()->set_steps(3);
  // An out-of-memory report and the failure after it: the one end a rank that ran out of memory has.
  EXPECT_EQ(ingest_.Ingest(entry_, 1, oom).next, ReportIngest::Next::kOutOfMemory);
  EXPECT_EQ(ingest_.Ingest(entry_, 1, failed).events.size(), 1u);
  // Anything final after that is dropped, never its event: a thousand failures store nothing.
  size_t events = 0;
  for (int i = 0; i < 1000; ++i) {
    for (const fitrun::v1::WorkerReport* report : {&oom, &failed, &finished}) {
      ReportIngest::Ingested again = ingest_.Ingest(entry_, 1, *report);
      EXPECT_EQ(again.next, ReportIngest::Next::kNothing);
      for (const fitrun::v1::JobEvent& event : again.events) {
        EXPECT_THAT(event.log().text(), HasSubstr("were not kept")) << event.ShortDebugString();
      }
      events += again.events.size();
    }
  }
  EXPECT_LE(events, 1u) << "one line says so, at most every ten seconds";
  EXPECT_FALSE(entry_.active->ranks[1].finished.has_value());
  now_ += ReportIngest::kDropsToldEvery;
  ReportIngest::Ingested told = ingest_.Ingest(entry_, 1, finished);
  ASSERT_EQ(told.events.size(), 1u);
  EXPECT_THAT(told.events[0].log().text(), HasSubstr("more final, failure or out-of-memory reports than its "
                                                     "attempt's one end; they were not kept"));
  // A finished rank cannot fail afterwards, nor finish twice.
  EXPECT_EQ(ingest_.Ingest(entry_, 0, finished).next, ReportIngest::Next::kFinished);
  EXPECT_EQ(ingest_.Ingest(entry_, 0, finished).next, ReportIngest::Next::kNothing);
  EXPECT_TRUE(ingest_.Ingest(entry_, 0, failed).events.empty());
  EXPECT_TRUE(entry_.active->ranks[0].failure_report.empty());
}

TEST_F(ReportIngestTest, PastTheJobsEventCapRankChatterIsNotKeptWithALineAndItsEndSaysHowMuch) {
  ReportIngest capped(&metrics_, [this] { return now_; }, ReportIngest::Options{100});
  entry_.record.job.set_last_sequence(99);
  fitrun::v1::WorkerReport log;
  log.mutable_log()->set_text("line");
  EXPECT_EQ(capped.Ingest(entry_, 0, log).events[0].log().text(), "line");
  entry_.record.job.set_last_sequence(100);
  ReportIngest::Ingested first = capped.Ingest(entry_, 0, log);
  ASSERT_EQ(first.events.size(), 1u);
  EXPECT_THAT(first.events[0].log().text(), HasSubstr("--max_events_per_job"));
  entry_.record.job.set_last_sequence(101);
  fitrun::v1::WorkerReport progress;
  progress.mutable_progress()->set_step(9);
  EXPECT_TRUE(capped.Ingest(entry_, 1, progress).events.empty());
  EXPECT_TRUE(capped.Ingest(entry_, 0, log).events.empty());
  EXPECT_EQ(entry_.active->ranks[1].last_step, 9) << "its progress still counts, only its event is not kept";
  // What matters to the job still is.
  fitrun::v1::WorkerReport oom;
  oom.mutable_oom()->set_step(4);
  EXPECT_EQ(capped.Ingest(entry_, 1, oom).next, ReportIngest::Next::kOutOfMemory);
  fitrun::v1::WorkerReport finished;
  finished.mutable_finished()->set_steps(3);
  ReportIngest::Ingested end = capped.Ingest(entry_, 0, finished);
  EXPECT_EQ(end.next, ReportIngest::Next::kFinished);
  ASSERT_EQ(end.events.size(), 2u);
  EXPECT_EQ(end.events[0].log().text(),
            "3 progress, log and checkpoint reports of the job's ranks were not kept so far, past its 100 events");
}

TEST_F(ReportIngestTest, AHeartbeatCarriesNoEventButMarksTheRankHeard) {
  now_ += absl::Seconds(30);
  fitrun::v1::WorkerReport heartbeat;
  heartbeat.mutable_heartbeat();
  ReportIngest::Ingested ingested = ingest_.Ingest(entry_, 1, heartbeat);
  EXPECT_TRUE(ingested.events.empty());
  EXPECT_EQ(ingested.next, ReportIngest::Next::kNothing);
  EXPECT_EQ(entry_.active->ranks[1].last_heard, now_);
}

}  // namespace
}  // namespace fitrun::server
