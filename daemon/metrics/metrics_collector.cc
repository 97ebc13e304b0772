#include "daemon/metrics/metrics_collector.h"

#include <algorithm>

#include "common/version.h"
#include "tier/ring.h"

namespace tier::daemon {

MetricsSnapshot MetricsCollector::Snapshot() const {
  const uint64_t now_ms = MonotonicMs();
  MetricsSnapshot s;
  s.version = build_.version;
  s.engine = build_.engine;
  s.api_version = kApiVersion;
  s.ring_version = ring::kVersion;
  s.start_time_seconds = build_.start_time_seconds;
  if (sources_.registry.draining()) {
    s.health = "draining";
  } else {
    s.health = sources_.health.Check(now_ms).ok() ? "serving" : "not_serving";
  }

  s.pool = sources_.pool.Usage();
  s.pool_parts = sources_.pool.PartUsage();
  s.pool_pinned = sources_.pool.locked() || sources_.pool.registered();
  s.pool_pin_seconds = build_.pool_pin_seconds;
  if (NvmeTransfers* nvme = sources_.nvme) {
    s.has_nvme = true;
    s.spill_files = nvme->store().Usage();
    s.spill = nvme->counters().Read();
  }

  if (const PersistentStore* persistent = sources_.persistent) {
    s.persistent = persistent->usage();
  }

  const DaemonMetrics& m = sources_.metrics;
  s.jobs_in_flight = m.jobs_in_flight.value();
  s.bytes_offloaded = m.totals.bytes_offloaded.Sum();
  s.bytes_reloaded = m.totals.bytes_reloaded.Sum();
  for (int k = 0; k < kJobKinds; ++k) {
    const auto kind = static_cast<JobKind>(k);
    s.jobs_started[k] = m.jobs.started(kind);
    for (int code = 0; code < kStatusCodes; ++code) {
      s.jobs_completed[k][code] = m.jobs.completed(kind, code);
    }
    for (int size = 0; size < kSizeClasses; ++size) s.latency[k][size] = m.jobs.latency(kind, size);
  }
  s.latency_unmeasured = m.jobs.unmeasured();

  s.engine_counts = sources_.engine.Counts();
  AddSessions(s);
  return s;
}

// Per user (or all users together, without uid labels): sessions, what they hold, their lanes,
// and the counters that never go down.
void MetricsCollector::AddSessions(MetricsSnapshot& s) const {
  const UsageLedger::Usage clients = sources_.registry.ClientTotals();
  s.client_mapped_bytes = clients.mapped_bytes;
  s.client_reserved_bytes = clients.reserved_bytes;
  std::vector<SessionCounts> counts;
  for (const SessionSnapshot& session : sources_.registry.Snapshots()) {
    if (!session.attached) {
      ++s.sessions_pending;
      continue;
    }
    const uint32_t uid = build_.uid_labels ? session.peer.uid : kAllUids;
    UserGauges& user = s.users[uid];
    ++user.sessions;
    user.used_bytes += session.used_bytes;
    user.objects += session.objects;
    user.buffers += session.buffers;
    user.jobs_in_flight += session.jobs_in_flight;
    counts.push_back({session.id, uid,
                      UserCounters{session.jobs_completed, session.jobs_failed,
                                   session.bytes_offloaded, session.bytes_reloaded}});
    for (const engine::LaneStatus& lane : session.lanes) {
      LaneGroup& group = s.lanes[LaneKey{
          uid, lane.device, lane.direction == engine::Direction::kToPool ? "D2H" : "H2D"}];
      if (lane.waiting_ticket != 0) group.wait_ms = std::max(group.wait_ms, lane.waiting_ms);
      group.queued += lane.queued;
      group.in_flight += lane.in_flight;
    }
  }
  s.user_totals = user_totals_.Update(counts);
}

std::vector<prometheus::MetricFamily> MetricsCollector::Collect() const {
  return ToMetricFamilies(Snapshot());
}

}  // namespace tier::daemon
