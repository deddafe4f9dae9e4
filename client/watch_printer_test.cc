#include "client/watch_printer.h"

#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace fitrun::client {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1700000000);

// Every event carries the same coordinator time, so no step rate (and no ETA) can be computed:
// the printer must pace its output by the local `now` it is given, not by event times.
v1::JobEvent ProgressEvent(int64_t sequence, int64_t step) {
  v1::JobEvent event;
  event.set_sequence(sequence);
  event.mutable_time()->set_seconds(absl::ToUnixSeconds(kStart));
  v1::Progress* progress = event.mutable_progress();
  progress->set_rank(0);
  progress->set_step(step);
  progress->set_total_steps(100);
  progress->set_epoch(1);
  progress->set_loss(0.25);
  progress->set_samples_per_second(50);
  return event;
}

v1::JobEvent LogEvent(int64_t sequence, const std::string& text) {
  v1::JobEvent event;
  event.set_sequence(sequence);
  event.mutable_log()->set_rank(0);
  event.mutable_log()->set_text(text);
  return event;
}

std::string Line(int64_t step) {
  return "step " + std::to_string(step) + "/100 (" + std::to_string(step) +
         ".0%)  epoch 1  loss 0.2500  50.0 samples/s  ETA --";
}

TEST(WatchPrinterLogModeTest, PrintsProgressAtMostEveryTwoSeconds) {
  std::ostringstream out;
  WatchPrinter printer(&out, /*redraw_in_place=*/false);
  printer.OnEvent(ProgressEvent(1, 1), kStart);
  printer.OnEvent(ProgressEvent(2, 2), kStart + absl::Seconds(1));
  printer.OnEvent(ProgressEvent(3, 3), kStart + absl::Milliseconds(1999));
  printer.OnEvent(ProgressEvent(4, 4), kStart + absl::Seconds(2));
  printer.OnEvent(ProgressEvent(5, 5), kStart + absl::Seconds(3));
  EXPECT_EQ(out.str(), Line(1) + "\n" + Line(4) + "\n");
}

TEST(WatchPrinterLogModeTest, FinishPrintsTheProgressTheThrottleHeldBack) {
  std::ostringstream out;
  WatchPrinter printer(&out, /*redraw_in_place=*/false);
  printer.OnEvent(ProgressEvent(1, 1), kStart);
  printer.OnEvent(ProgressEvent(2, 7), kStart + absl::Seconds(1));
  printer.Finish();
  EXPECT_EQ(out.str(), Line(1) + "\n" + Line(7) + "\n");
}

TEST(WatchPrinterLogModeTest, FinishDoesNotRepeatAPrintedLine) {
  std::ostringstream out;
  WatchPrinter printer(&out, /*redraw_in_place=*/false);
  printer.OnEvent(ProgressEvent(1, 1), kStart);
  printer.Finish();
  EXPECT_EQ(out.str(), Line(1) + "\n");
}

TEST(WatchPrinterLogModeTest, EventLinesAreNeverThrottled) {
  std::ostringstream out;
  WatchPrinter printer(&out, /*redraw_in_place=*/false);
  printer.OnEvent(ProgressEvent(1, 1), kStart);
  printer.OnEvent(LogEvent(2, "a"), kStart);
  printer.OnEvent(LogEvent(3, "b"), kStart);
  EXPECT_EQ(out.str(), Line(1) + "\nrank 0: a\nrank 0: b\n");
  EXPECT_EQ(printer.state().last_sequence(), 3);
}

TEST(WatchPrinterLogModeTest, NoEscapeSequences) {
  std::ostringstream out;
  WatchPrinter printer(&out, /*redraw_in_place=*/false);
  printer.OnEvent(ProgressEvent(1, 1), kStart);
  printer.OnEvent(LogEvent(2, "a"), kStart + absl::Seconds(5));
  printer.Finish();
  EXPECT_EQ(out.str().find('\r'), std::string::npos);
  EXPECT_EQ(out.str().find('\033'), std::string::npos);
}

TEST(WatchPrinterTerminalModeTest, RedrawsOneLineInPlace) {
  std::ostringstream out;
  WatchPrinter printer(&out, /*redraw_in_place=*/true);
  printer.OnEvent(ProgressEvent(1, 1), kStart);
  // Too soon after the last redraw: held back.
  printer.OnEvent(ProgressEvent(2, 2), kStart + absl::Milliseconds(50));
  printer.OnEvent(ProgressEvent(3, 3), kStart + absl::Milliseconds(200));
  printer.Finish();
  EXPECT_EQ(out.str(), "\r\033[K" + Line(1) + "\r\033[K" + Line(3) + "\n");
}

TEST(WatchPrinterTerminalModeTest, EventLinesGoAboveTheProgressLine) {
  std::ostringstream out;
  WatchPrinter printer(&out, /*redraw_in_place=*/true);
  printer.OnEvent(ProgressEvent(1, 1), kStart);
  printer.OnEvent(LogEvent(2, "checkpoint soon"), kStart + absl::Milliseconds(10));
  printer.Finish();
  EXPECT_EQ(out.str(), "\r\033[K" + Line(1) + "\r\033[Krank 0: checkpoint soon\n\r\033[K" +
                           Line(1) + "\n");
}

TEST(WatchPrinterTerminalModeTest, ACheckpointFailureIsALineOfItsOwnAboveTheProgress) {
  std::ostringstream out;
  WatchPrinter printer(&out, /*redraw_in_place=*/true);
  printer.OnEvent(ProgressEvent(1, 1), kStart);
  v1::JobEvent failed;
  failed.set_sequence(2);
  failed.mutable_checkpoint_failed()->set_rank(0);
  failed.mutable_checkpoint_failed()->set_step(1);
  failed.mutable_checkpoint_failed()->set_error("disk full");
  printer.OnEvent(failed, kStart + absl::Milliseconds(10));
  printer.Finish();
  EXPECT_EQ(out.str(), "\r\033[K" + Line(1) +
                           "\r\033[Kcheckpoint FAILED: rank 0 could not save step 1: disk full (training goes on; a "
                           "restart would resume from the previous checkpoint)\n\r\033[K" +
                           Line(1) + "\n");
}

TEST(WatchPrinterTerminalModeTest, EventsWithoutProgressPrintPlainLines) {
  std::ostringstream out;
  WatchPrinter printer(&out, /*redraw_in_place=*/true);
  printer.OnEvent(LogEvent(1, "hello"), kStart);
  printer.Finish();
  EXPECT_EQ(out.str(), "rank 0: hello\n");
}

TEST(WatchPrinterTerminalModeTest, FinishLeavesTheLastStepOnScreen) {
  std::ostringstream out;
  WatchPrinter printer(&out, /*redraw_in_place=*/true);
  printer.OnEvent(ProgressEvent(1, 1), kStart);
  printer.OnEvent(ProgressEvent(2, 100), kStart + absl::Milliseconds(1));
  printer.Finish();
  const std::string text = out.str();
  const std::string last = Line(100);
  ASSERT_GE(text.size(), last.size() + 1);
  EXPECT_EQ(text.substr(text.size() - last.size() - 1), last + "\n");
}

}  // namespace
}  // namespace fitrun::client
