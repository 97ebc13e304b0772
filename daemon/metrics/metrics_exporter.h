// The HTTP endpoint Prometheus scrapes: GET /metrics on metrics_listen (HOST:PORT), rendered from a
// Collectable that reads the daemon's state on each request. Off unless metrics_listen is set.
//
// One thread serves every connection (poll, non-blocking sockets), so an idle connection costs a
// slot, never a thread: prometheus-cpp's civetweb exposer gave each connection one of its two
// threads until its request came, and two idle TCP connections blocked every scrape for 20 s and
// more. Here a connection has request_timeout_ms to send its request and write_timeout_ms to take
// the answer; at max_connections, the oldest connection still waiting for its request is closed to
// make room, so a flood of idle connections cannot keep a scrape (which sends its request at once)
// out. Each answer ends its connection.
//
// A port it cannot listen on (taken by another process, an address not up yet) does not stop
// tierd: the exporter says why in the log and in state(), and tries again every retry_ms (2 s).
// Any local user could otherwise keep tierd from starting by binding its port first.
#ifndef TIER_DAEMON_METRICS_METRICS_EXPORTER_H_
#define TIER_DAEMON_METRICS_METRICS_EXPORTER_H_

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "common/unique_fd.h"
#include "prometheus/collectable.h"

namespace tier::daemon {

struct MetricsExporterOptions {
  uint32_t max_connections = 32;
  uint32_t request_timeout_ms = 5000;
  uint32_t write_timeout_ms = 10000;
  uint32_t retry_ms = 2000;
};

class MetricsExporter {
 public:
  // Serves `collectable` at /metrics on `address` (checked by CheckMetricsListen: INVALID_ARGUMENT
  // when it refuses it), now or, when the address cannot be listened on yet, once it can.
  static absl::StatusOr<std::unique_ptr<MetricsExporter>> Start(
      const std::string& address, std::shared_ptr<prometheus::Collectable> collectable,
      MetricsExporterOptions options = {});
  // Stops serving (a scrape being answered is cut off).
  ~MetricsExporter();

  const std::string& address() const { return address_; }
  bool listening() const { return listening_.load(); }
  // "serving http://HOST:PORT/metrics" or why not ("not serving: cannot listen on ...: Address
  // already in use ...; trying again every 2 s"), for status.
  std::string state() const;

 private:
  struct Connection;
  MetricsExporter(std::string address, std::shared_ptr<prometheus::Collectable> collectable,
                  MetricsExporterOptions options);
  void Run();
  bool Serve(Connection& c, uint64_t now);
  void Accept(std::list<Connection>& connections, uint64_t now);
  // Binds and listens; records why not.
  bool TryListen();
  std::string Render() const;

  const std::string address_;
  std::shared_ptr<prometheus::Collectable> collectable_;
  const MetricsExporterOptions options_;
  UniqueFd wake_fd_;
  UniqueFd listen_fd_;  // exporter thread only
  std::atomic<bool> stop_{false};
  std::atomic<bool> listening_{false};
  mutable Mutex mu_;
  std::string problem_ ABSL_GUARDED_BY(mu_);  // why it does not listen; "" when it does
  std::thread thread_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_METRICS_METRICS_EXPORTER_H_
