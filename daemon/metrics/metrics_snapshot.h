// The daemon's state as one scrape sees it, and its Prometheus form: metric names in the style of
// node_exporter and dcgm-exporter (`tierd_` prefix, base units, `_total` counters, `_bytes`,
// `_seconds`), users by uid, never pids or session ids as labels. README, "Metrics", lists them.
//
// Plain values only, so that the rendering is a pure function a test can feed by hand; the
// MetricsCollector fills a snapshot from the live daemon on each scrape.
#ifndef TIER_DAEMON_METRICS_METRICS_SNAPSHOT_H_
#define TIER_DAEMON_METRICS_METRICS_SNAPSHOT_H_

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "daemon/metrics/job_metrics.h"
#include "daemon/metrics/user_totals.h"
#include "daemon/persistent/persistent_store.h"
#include "daemon/tiers/nvme_transfers.h"
#include "engine/copy_engine.h"
#include "prometheus/metric_family.h"
#include "storage/host_pool.h"
#include "storage/spill_store.h"

namespace tier::daemon {

// What one user's sessions hold now, summed.
struct UserGauges {
  uint64_t sessions = 0;
  uint64_t used_bytes = 0;
  uint64_t objects = 0;
  uint64_t buffers = 0;
  uint64_t jobs_in_flight = 0;
};

// The lanes of one user on one GPU in one direction.
struct LaneGroup {
  uint64_t wait_ms = 0;  // longest current wait for a client's ticket
  uint64_t queued = 0;
  uint64_t in_flight = 0;
};
// The uid of every user's series together (metrics_uid_labels off): rendered uid="all".
inline constexpr uint32_t kAllUids = ~uint32_t{0};

// (uid, gpu, "D2H" or "H2D")
using LaneKey = std::tuple<uint32_t, int, std::string>;

struct MetricsSnapshot {
  // Build and process.
  std::string version;
  std::string engine;
  uint32_t api_version = 0;
  uint32_t ring_version = 0;
  double start_time_seconds = 0;  // Unix time
  std::string health;             // "serving", "draining" or "not_serving"

  // Host pool and NVMe tier.
  storage::PoolUsage pool;
  std::vector<storage::PoolPartUsage> pool_parts;  // the pool's parts (one when not split)
  bool pool_pinned = false;
  double pool_pin_seconds = 0;  // creating and pinning the pool at start
  bool has_nvme = false;
  std::vector<storage::SpillFileUsage> spill_files;
  SpillTraffic spill;  // (SpillCounters::Read)

  // Jobs.
  uint64_t jobs_in_flight = 0;
  uint64_t bytes_offloaded = 0;
  uint64_t bytes_reloaded = 0;
  std::array<uint64_t, kJobKinds> jobs_started{};
  std::array<std::array<uint64_t, kStatusCodes>, kJobKinds> jobs_completed{};
  std::array<std::array<LatencySnapshot, kSizeClasses>, kJobKinds> latency{};
  uint64_t latency_unmeasured = 0;

  // Clients.
  engine::EngineCounts engine_counts;
  uint64_t sessions_pending = 0;  // opened, not attached (no uid yet)
  uint64_t client_mapped_bytes = 0;  // host memory of clients' registered buffers (all of them)
  uint64_t client_reserved_bytes = 0;  // GPU address space reserved for their VMM buffers
  std::map<uint32_t, UserGauges> users;
  std::map<uint32_t, UserCounters> user_totals;  // monotonic (UserTotals)
  std::map<LaneKey, LaneGroup> lanes;

  PersistentUsage persistent;  // named, persistent objects and their journal
};

std::vector<prometheus::MetricFamily> ToMetricFamilies(const MetricsSnapshot& snapshot);

}  // namespace tier::daemon

#endif  // TIER_DAEMON_METRICS_METRICS_SNAPSHOT_H_
