// The Prometheus collector of tierd (pull model): on each scrape it reads the daemon's own state --
// the pool and spill store usage, the sessions, the job counters, the copy engine's counts and
// lanes -- into a MetricsSnapshot and renders it. Nothing is pushed to it and nothing runs between
// scrapes, so the job path does not know it exists.
#ifndef TIER_DAEMON_METRICS_METRICS_COLLECTOR_H_
#define TIER_DAEMON_METRICS_METRICS_COLLECTOR_H_

#include <string>
#include <vector>

#include "daemon/control/health_monitor.h"
#include "daemon/metrics/metrics.h"
#include "daemon/metrics/metrics_snapshot.h"
#include "daemon/metrics/user_totals.h"
#include "daemon/persistent/persistent_store.h"
#include "daemon/sessions/session_registry.h"
#include "daemon/tiers/nvme_transfers.h"
#include "engine/copy_engine.h"
#include "prometheus/collectable.h"
#include "storage/host_pool.h"

namespace tier::daemon {

// What the collector reads; all outlive it.
struct MetricsSources {
  const DaemonMetrics& metrics;
  const storage::HostPool& pool;
  NvmeTransfers* nvme;  // the NVMe tier's transfers; null without one
  const SessionRegistry& registry;
  const engine::CopyEngine& engine;
  const HealthMonitor& health;
  const PersistentStore* persistent = nullptr;  // named objects; null: none
};

// Fixed for the daemon's life.
struct BuildInfo {
  std::string version;
  std::string engine;
  double start_time_seconds = 0;  // Unix time
  double pool_pin_seconds = 0;
  bool uid_labels = false;  // metrics_uid_labels: each uid its own series; else uid="all"
};

class MetricsCollector : public prometheus::Collectable {
 public:
  MetricsCollector(MetricsSources sources, BuildInfo build)
      : sources_(sources), build_(std::move(build)) {}

  // The state now. Thread-safe (the exporter may serve two scrapes at once).
  MetricsSnapshot Snapshot() const;
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  void AddSessions(MetricsSnapshot& s) const;  // part of Snapshot
  const MetricsSources sources_;
  const BuildInfo build_;
  mutable UserTotals user_totals_;  // remembers ended sessions' counts between scrapes
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_METRICS_METRICS_COLLECTOR_H_
