// fitrund's HTTP side, on its metrics port: /metrics for Prometheus, the web page at / and the small
// JSON API the page reads. Unauthenticated like /metrics: bind it to loopback (docs/security.md).
//
//   GET /metrics                    Prometheus text format: every collectable given
//   GET /                           the page (server/web/page.html, built in; no external assets)
//   GET /api/jobs                   {"jobs": [Job, ...]}, newest first, at most kMaxListedJobs
//   GET /api/devices                {"devices": [Device, ...]}
//   GET /api/jobs/<id>              {"job": Job, "ranks": [{rank, device_id, planned_bytes, peak_bytes,
//                                    cap_bytes}, ...]}: the running attempt's ranks, else the last one's
//   GET /api/jobs/<id>/events?from=N   server-sent events: `id: <sequence>`, `event: job_event`,
//                                    `data: <JobEvent>` for every event from N (or Last-Event-ID + 1)
//                                    on, then `event: end` once the job has ended
// Messages are protobuf's JSON mapping with the .proto field names (int64 values as strings).
// Event streams follow a job the way WatchJob does: a WatchCursor woken through the WatchFanout.
#ifndef FITRUN_SERVER_WEB_WEB_SERVER_H_
#define FITRUN_SERVER_WEB_WEB_SERVER_H_

#include <prometheus/collectable.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/jobs/job_manager.h"
#include "server/watch/watch_fanout.h"

class CivetServer;

namespace fitrun::server {

class WebServer {
 public:
  struct Options {
    // HOST:PORT; port 0 picks a free one.
    std::string listen = "127.0.0.1:9464";
    // Event streams open at once (each holds one of the server's threads); more get 503.
    int max_event_streams = 32;
    // An idle event stream sends a comment this often, so a closed page is noticed.
    absl::Duration keepalive = absl::Seconds(15);
  };
  static constexpr int kMaxListedJobs = 200;

  // Serves until destroyed. `manager` and the collectables must outlive the server.
  static absl::StatusOr<std::unique_ptr<WebServer>> Start(
      Options options, JobManager* manager, std::vector<std::shared_ptr<prometheus::Collectable>> collectables);
  ~WebServer();
  WebServer(const WebServer&) = delete;
  WebServer& operator=(const WebServer&) = delete;

  // HOST:PORT as bound (the port chosen when the options said 0).
  const std::string& address() const { return address_; }

  class Handler;  // the CivetHandler; in the .cc

 private:
  WebServer() = default;
  std::string address_;
  std::unique_ptr<Handler> handler_;
  std::unique_ptr<CivetServer> civet_;
};

}  // namespace fitrun::server

#endif  // FITRUN_SERVER_WEB_WEB_SERVER_H_
