// The HTTP endpoint Prometheus scrapes: GET /metrics on metrics_listen (HOST:PORT), served by
// prometheus-cpp's pull exposer (civetweb, its own two threads) from a Collectable that reads the
// daemon's state on each request. Off unless metrics_listen is set.
#ifndef TIER_DAEMON_METRICS_EXPORTER_H_
#define TIER_DAEMON_METRICS_EXPORTER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"

namespace prometheus {
class Exposer;
}

namespace tier::daemon {

class MetricsExporter {
 public:
  // Listens on `address` (checked by CheckMetricsListen) and serves `collectable` at /metrics.
  // INVALID_ARGUMENT for an address it refuses, UNAVAILABLE when it cannot listen (in use, no
  // such interface).
  static absl::StatusOr<std::unique_ptr<MetricsExporter>> Start(
      const std::string& address, std::shared_ptr<prometheus::Collectable> collectable);
  // Stops serving; a scrape in progress finishes first.
  ~MetricsExporter();

  const std::string& address() const { return address_; }

 private:
  MetricsExporter(std::string address, std::shared_ptr<prometheus::Collectable> collectable,
                  std::unique_ptr<prometheus::Exposer> exposer);

  const std::string address_;
  std::shared_ptr<prometheus::Collectable> collectable_;  // the exposer holds a weak_ptr
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_METRICS_EXPORTER_H_
