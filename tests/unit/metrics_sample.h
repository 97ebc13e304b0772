// A MetricsSnapshot with every field set, so that its Prometheus form holds every family tierd can
// export (NVMe tier with two spill files, a failed job, a latency histogram, a uid with sessions,
// a GPU lane). metrics_snapshot_test asserts on its exposition; metrics_exposition_sample prints
// it for the dashboard test (tests/deploy/grafana_dashboard_test.py), which takes from it the
// families a host-engine tierd cannot show (GPU lanes).
#ifndef TIER_TESTS_UNIT_METRICS_SAMPLE_H_
#define TIER_TESTS_UNIT_METRICS_SAMPLE_H_

#include "daemon/metrics/metrics_snapshot.h"

namespace tier::daemon {

inline MetricsSnapshot SampleSnapshot() {
  MetricsSnapshot s;
  s.version = "0.1.0";
  s.engine = "cuda";
  s.api_version = 1;
  s.ring_version = 2;
  s.start_time_seconds = 1.7e9;
  s.health = "serving";
  s.pool = storage::PoolUsage{1 << 30, 256 << 20, 768 << 20, 512 << 20, 12};
  // Two parts (two NUMA nodes), half the pool each; node 1's GPUs overflowed into node 0's once.
  for (int node = 0; node < 2; ++node) {
    storage::PoolPartUsage part;
    part.numa_node = node;
    part.offset = uint64_t(node) << 29;
    part.capacity_bytes = 512 << 20;
    part.used_bytes = node == 0 ? 192 << 20 : 64 << 20;
    part.free_bytes = part.capacity_bytes - part.used_bytes;
    part.largest_free = part.free_bytes;
    part.allocations = node == 0 ? 9 : 3;
    part.local_allocations = node == 0 ? 40 : 30;
    part.remote_allocations = node == 0 ? 1 : 0;
    part.any_allocations = 2;
    s.pool_parts.push_back(part);
  }
  s.pool_pinned = true;
  s.pool_pin_seconds = 0.038;
  s.has_nvme = true;
  storage::SpillFileUsage file;
  file.directory = "/nvme0/tierd";
  file.capacity_bytes = 4ull << 30;
  file.used_bytes = 1 << 30;
  file.records = 3;
  file.bytes_written = 5 << 20;
  file.direct_io = true;
  file.read_errors = 2;
  file.checksum_failures = 1;
  s.spill_files = {file, file};
  s.spill_files[1].directory = "/nvme1/tierd";
  s.spill.bytes_spilled = 10 << 20;
  s.spill.prefetch_hits = 4;
  s.jobs_in_flight = 3;
  s.bytes_offloaded = 123456;
  s.jobs_started[static_cast<int>(JobKind::kOffload)] = 10;
  s.jobs_completed[static_cast<int>(JobKind::kOffload)][0] = 9;
  s.jobs_completed[static_cast<int>(JobKind::kOffload)][8] = 1;
  LatencySnapshot& h = s.latency[static_cast<int>(JobKind::kOffload)][1];
  h.buckets[3] = 2;   // <= 10 us
  h.buckets[5] = 1;   // <= 50 us
  h.buckets[kLatencyBuckets - 1] = 1;  // > 30 s
  h.count = 4;
  h.sum_ns = 31'000'070'000;
  s.engine_counts = engine::EngineCounts{5, 2, 0};
  s.client_reserved_bytes = uint64_t{316} << 30;  // two segments on an H200
  s.sessions_pending = 1;
  s.users[1000] = UserGauges{2, 64 << 20, 7, 3, 1};
  s.user_totals[1000] = UserCounters{20, 1, 1 << 20, 2 << 20};
  s.lanes[LaneKey{1000, 0, "D2H"}] = LaneGroup{12'500, 4, 1};
  return s;
}

}  // namespace tier::daemon

#endif  // TIER_TESTS_UNIT_METRICS_SAMPLE_H_
