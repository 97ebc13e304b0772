#include "daemon/metrics/metrics_snapshot.h"

#include <deque>
#include <limits>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tier::daemon {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

// Families in the order they are added; each a name, help and type, then its samples. A deque, so
// that a family stays where it is while later ones are added.
class Families {
 public:
  MetricFamily& Add(std::string name, std::string help, MetricType type) {
    out_.push_back(MetricFamily{std::move(name), std::move(help), type, {}});
    return out_.back();
  }
  void Gauge(std::string name, std::string help, double value, Labels labels = {}) {
    Sample(Add(std::move(name), std::move(help), MetricType::Gauge), value, std::move(labels));
  }
  void Counter(std::string name, std::string help, uint64_t value, Labels labels = {}) {
    Sample(Add(std::move(name), std::move(help), MetricType::Counter), static_cast<double>(value),
           std::move(labels));
  }
  // One more sample in `family` (its type says whether it is a gauge or a counter).
  static void Sample(MetricFamily& family, double value, Labels labels = {}) {
    ClientMetric metric;
    metric.label = std::move(labels);
    if (family.type == MetricType::Counter) {
      metric.counter.value = value;
    } else {
      metric.gauge.value = value;
    }
    family.metric.push_back(std::move(metric));
  }
  // The families with samples (one without any, a uid label with no users say, is left out).
  std::vector<MetricFamily> Take() {
    std::vector<MetricFamily> out;
    for (MetricFamily& family : out_) {
      if (!family.metric.empty()) out.push_back(std::move(family));
    }
    return out;
  }

 private:
  std::deque<MetricFamily> out_;
};

std::string Uid(uint32_t uid) { return uid == kAllUids ? "all" : absl::StrCat(uid); }

void AddBuildAndHealth(const MetricsSnapshot& s, Families& f) {
  f.Gauge("tierd_build_info", "tierd's version, copy engine and protocol versions (always 1)", 1,
          {{"version", s.version},
           {"engine", s.engine},
           {"api_version", absl::StrCat(s.api_version)},
           {"ring_version", absl::StrCat(s.ring_version)}});
  f.Gauge("tierd_start_time_seconds", "Start time of tierd since the Unix epoch in seconds",
          s.start_time_seconds);
  MetricFamily& health = f.Add("tierd_health_state",
                               "tierd's health (tierctl health): 1 for the current state",
                               MetricType::Gauge);
  for (std::string_view state : {"serving", "draining", "not_serving"}) {
    Families::Sample(health, s.health == state ? 1 : 0, {{"state", std::string(state)}});
  }
}

// The host pool's parts (one per NUMA node with GPUs): how full each is, and whom it served.
void AddPoolParts(const MetricsSnapshot& s, Families& f) {
  MetricFamily& capacity = f.Add("tierd_pool_part_capacity_bytes",
                                 "Bytes a part of the host pool holds", MetricType::Gauge);
  MetricFamily& used =
      f.Add("tierd_pool_part_used_bytes", "Bytes in use in a part of the host pool",
            MetricType::Gauge);
  MetricFamily& allocations = f.Add(
      "tierd_pool_part_allocations_total",
      "Extents a part of the host pool handed out, by locality: local (a GPU on its NUMA node), "
      "remote (a GPU whose own part was full), any (no GPU)",
      MetricType::Counter);
  for (size_t i = 0; i < s.pool_parts.size(); ++i) {
    const storage::PoolPartUsage& part = s.pool_parts[i];
    const std::string node = part.numa_node < 0 ? "none" : absl::StrCat(part.numa_node);
    Labels labels = {{"part", absl::StrCat(i)}, {"numa_node", node}};
    Families::Sample(capacity, static_cast<double>(part.capacity_bytes), labels);
    Families::Sample(used, static_cast<double>(part.used_bytes), labels);
    for (auto [locality, count] : {std::pair<const char*, uint64_t>{"local", part.local_allocations},
                                   {"remote", part.remote_allocations},
                                   {"any", part.any_allocations}}) {
      Labels with = labels;
      with.push_back({"locality", locality});
      Families::Sample(allocations, static_cast<double>(count), std::move(with));
    }
  }
}

void AddTiers(const MetricsSnapshot& s, Families& f) {
  f.Gauge("tierd_pool_pinned", "1 when the host pool is pinned (mlock or GPU registration)",
          s.pool_pinned ? 1 : 0);
  f.Gauge("tierd_pool_pin_seconds", "Time tierd took to create and pin the host pool at start",
          s.pool_pin_seconds);
  struct TierRow {
    std::string name;
    uint64_t capacity, used, objects;
  };
  std::vector<TierRow> tiers = {
      {"host", s.pool.capacity_bytes, s.pool.used_bytes, s.pool.allocations}};
  if (s.has_nvme) {
    TierRow nvme{"nvme", 0, 0, 0};
    for (const storage::SpillFileUsage& file : s.spill_files) {
      nvme.capacity += file.capacity_bytes;
      nvme.used += file.used_bytes;
      nvme.objects += file.records;
    }
    tiers.push_back(nvme);
  }
  MetricFamily& capacity =
      f.Add("tierd_tier_capacity_bytes", "Bytes a tier can hold", MetricType::Gauge);
  MetricFamily& used = f.Add("tierd_tier_used_bytes", "Bytes in use in a tier", MetricType::Gauge);
  MetricFamily& free = f.Add("tierd_tier_free_bytes", "Bytes free in a tier", MetricType::Gauge);
  MetricFamily& objects =
      f.Add("tierd_tier_objects", "Objects (host extents, NVMe records) a tier holds",
            MetricType::Gauge);
  for (const TierRow& tier : tiers) {
    Labels labels = {{"tier", tier.name}};
    Families::Sample(capacity, static_cast<double>(tier.capacity), labels);
    Families::Sample(used, static_cast<double>(tier.used), labels);
    Families::Sample(free, static_cast<double>(tier.capacity - tier.used), labels);
    Families::Sample(objects, static_cast<double>(tier.objects), labels);
  }
  AddPoolParts(s, f);
}

void AddSpill(const MetricsSnapshot& s, Families& f) {
  if (s.has_nvme) {
    struct FileMetric {
      const char* name;
      const char* help;
      MetricType type;
      uint64_t storage::SpillFileUsage::*field;
    };
    static constexpr FileMetric kFileMetrics[] = {
        {"tierd_spill_file_capacity_bytes", "Size of a spill file (one per spill_dir)",
         MetricType::Gauge, &storage::SpillFileUsage::capacity_bytes},
        {"tierd_spill_file_used_bytes", "Bytes in use in a spill file", MetricType::Gauge,
         &storage::SpillFileUsage::used_bytes},
        {"tierd_spill_file_records", "Spilled objects a spill file holds", MetricType::Gauge,
         &storage::SpillFileUsage::records},
        {"tierd_spill_file_written_bytes_total", "Bytes written to a spill file",
         MetricType::Counter, &storage::SpillFileUsage::bytes_written},
        {"tierd_spill_file_read_bytes_total", "Bytes read from a spill file", MetricType::Counter,
         &storage::SpillFileUsage::bytes_read},
        {"tierd_spill_file_write_errors_total", "Failed writes to a spill file (I/O errors)",
         MetricType::Counter, &storage::SpillFileUsage::write_errors},
        {"tierd_spill_file_read_errors_total", "Failed reads from a spill file (I/O errors)",
         MetricType::Counter, &storage::SpillFileUsage::read_errors},
        {"tierd_spill_file_checksum_failures_total",
         "Chunks read back from a spill file that failed their CRC-32C", MetricType::Counter,
         &storage::SpillFileUsage::checksum_failures},
    };
    for (const FileMetric& m : kFileMetrics) {
      MetricFamily& family = f.Add(m.name, m.help, m.type);
      for (const storage::SpillFileUsage& file : s.spill_files) {
        Families::Sample(family, static_cast<double>(file.*m.field),
                         {{"directory", file.directory}});
      }
    }
    MetricFamily& direct = f.Add("tierd_spill_file_direct_io",
                                 "1 when a spill file is written with O_DIRECT, 0 when buffered",
                                 MetricType::Gauge);
    for (const storage::SpillFileUsage& file : s.spill_files) {
      Families::Sample(direct, file.direct_io ? 1 : 0, {{"directory", file.directory}});
    }
  }
  // The traffic and error counters exist without an NVMe tier too (at 0), so that rates and
  // alerts read the same on every node.
  uint64_t write_errors = 0, read_errors = 0, checksum_failures = 0;
  for (const storage::SpillFileUsage& file : s.spill_files) {
    write_errors += file.write_errors;
    read_errors += file.read_errors;
    checksum_failures += file.checksum_failures;
  }
  f.Counter("tierd_spilled_bytes_total", "Bytes written from the host pool to NVMe",
            s.spill.bytes_spilled);
  f.Counter("tierd_fetched_bytes_total",
            "Bytes read back from NVMe into the host pool (prefetches included)",
            s.spill.bytes_fetched);
  f.Counter("tierd_prefetched_bytes_total", "Bytes read back from NVMe ahead of their reload",
            s.spill.bytes_prefetched);
  f.Counter("tierd_spills_total", "Objects written to NVMe", s.spill.spills);
  f.Counter("tierd_fetches_total", "Objects read back from NVMe (prefetches included)",
            s.spill.fetches);
  f.Counter("tierd_prefetches_total", "Objects read back from NVMe ahead of their reload",
            s.spill.prefetches);
  f.Counter("tierd_prefetch_hits_total", "Reloads that found a prefetched object in host memory",
            s.spill.prefetch_hits);
  f.Counter("tierd_prefetch_misses_total", "Reloads that had to wait for NVMe",
            s.spill.prefetch_misses);
  MetricFamily& io_errors =
      f.Add("tierd_spill_io_errors_total", "Spill I/O operations that failed (EIO, ENOSPC, short)",
            MetricType::Counter);
  Families::Sample(io_errors, static_cast<double>(write_errors), {{"op", "write"}});
  Families::Sample(io_errors, static_cast<double>(read_errors), {{"op", "read"}});
  f.Counter("tierd_spill_checksum_failures_total",
            "Spilled chunks that came back damaged (never handed out: the job fails)",
            checksum_failures);
}

void AddJobs(const MetricsSnapshot& s, Families& f) {
  f.Gauge("tierd_jobs_in_flight", "Jobs accepted and not yet completed",
          static_cast<double>(s.jobs_in_flight));
  f.Counter("tierd_offloaded_bytes_total", "Bytes copied into tierd by successful offloads",
            s.bytes_offloaded);
  f.Counter("tierd_reloaded_bytes_total", "Bytes copied out of tierd by successful reloads",
            s.bytes_reloaded);
  MetricFamily& submitted =
      f.Add("tierd_jobs_submitted_total",
            "Jobs taken from the sessions' rings and started, by kind (jobs refused while "
            "draining count only in tierd_jobs_completed_total)",
            MetricType::Counter);
  MetricFamily& completed =
      f.Add("tierd_jobs_completed_total",
            "Jobs ended, by kind and status code (OK, or the canonical error code)",
            MetricType::Counter);
  MetricFamily& latency =
      f.Add("tierd_job_latency_seconds",
            "Time from a job's submission (taken from its ring) to its completion, by kind and "
            "size class",
            MetricType::Histogram);
  for (int k = 0; k < kJobKinds; ++k) {
    const auto kind = static_cast<JobKind>(k);
    const std::string kind_name(JobKindName(kind));
    // Every kind but "invalid" appears from the start (at 0), so rate() has a series at once.
    if (kind != JobKind::kInvalid || s.jobs_started[k] > 0) {
      Families::Sample(submitted, static_cast<double>(s.jobs_started[k]), {{"kind", kind_name}});
    }
    for (int code = 0; code < kStatusCodes; ++code) {
      if (s.jobs_completed[k][code] == 0 && (code != 0 || kind == JobKind::kInvalid)) continue;
      Families::Sample(completed, static_cast<double>(s.jobs_completed[k][code]),
                       {{"kind", kind_name}, {"code", StatusCodeName(code)}});
    }
    for (int size = 0; size < kSizeClasses; ++size) {
      const LatencySnapshot& h = s.latency[k][size];
      if (h.count == 0) continue;
      ClientMetric metric;
      metric.label = {{"kind", kind_name}, {"size_class", std::string(SizeClassName(size))}};
      metric.histogram.sample_count = h.count;
      metric.histogram.sample_sum = static_cast<double>(h.sum_ns) / 1e9;
      uint64_t cumulative = 0;
      for (int b = 0; b < kLatencyBuckets; ++b) {
        cumulative += h.buckets[b];
        const double bound = b + 1 < kLatencyBuckets
                                 ? static_cast<double>(kLatencyBoundsNs[b]) / 1e9
                                 : std::numeric_limits<double>::infinity();
        metric.histogram.bucket.push_back({cumulative, bound});
      }
      latency.metric.push_back(std::move(metric));
    }
  }
  f.Counter("tierd_job_latency_unmeasured_total",
            "Jobs ended without a latency sample (refused while draining, or their submit time "
            "was overwritten by more than 65536 jobs of a session in flight)",
            s.latency_unmeasured);
}

void AddClients(const MetricsSnapshot& s, Families& f) {
  f.Gauge("tierd_client_buffers", "Client buffers tierd has mapped (registered, or still in use)",
          static_cast<double>(s.engine_counts.buffers));
  f.Gauge("tierd_client_mapped_bytes",
          "Host memory of the clients' registered buffers, counted once per registration "
          "(max_mapped_bytes)",
          static_cast<double>(s.client_mapped_bytes));
  f.Gauge("tierd_client_reserved_bytes",
          "GPU address space reserved for the clients' VMM buffers (expandable segments; "
          "max_reserved_bytes_per_session, max_reserved_bytes_per_uid)",
          static_cast<double>(s.client_reserved_bytes));
  f.Gauge("tierd_gpu_lanes", "GPU lanes (one stream per session, GPU and direction)",
          static_cast<double>(s.engine_counts.lanes));
  f.Gauge("tierd_pending_releases", "Client mappings and streams queued for release",
          static_cast<double>(s.engine_counts.pending_releases));
  f.Gauge("tierd_sessions_pending", "Sessions opened and not attached yet (no uid known)",
          static_cast<double>(s.sessions_pending));

  struct UserGauge {
    const char* name;
    const char* help;
    uint64_t UserGauges::*field;
  };
  static constexpr UserGauge kGauges[] = {
      {"tierd_sessions", "Attached sessions, by the uid of their process", &UserGauges::sessions},
      {"tierd_user_used_bytes", "Bytes (all tiers) the sessions of a uid hold",
       &UserGauges::used_bytes},
      {"tierd_user_objects", "Objects the sessions of a uid hold", &UserGauges::objects},
      {"tierd_user_buffers", "Buffers the sessions of a uid have registered",
       &UserGauges::buffers},
      {"tierd_user_jobs_in_flight", "Jobs of the sessions of a uid in flight",
       &UserGauges::jobs_in_flight},
  };
  for (const UserGauge& g : kGauges) {
    MetricFamily& family = f.Add(g.name, g.help, MetricType::Gauge);
    for (const auto& [uid, user] : s.users) {
      Families::Sample(family, static_cast<double>(user.*g.field), {{"uid", Uid(uid)}});
    }
  }
  struct UserCounter {
    const char* name;
    const char* help;
    uint64_t UserCounters::*field;
  };
  static constexpr UserCounter kCounters[] = {
      {"tierd_user_jobs_completed_total", "Jobs of a uid's sessions that succeeded",
       &UserCounters::jobs_completed},
      {"tierd_user_jobs_failed_total", "Jobs of a uid's sessions that failed",
       &UserCounters::jobs_failed},
      {"tierd_user_offloaded_bytes_total", "Bytes a uid's sessions offloaded",
       &UserCounters::bytes_offloaded},
      {"tierd_user_reloaded_bytes_total", "Bytes a uid's sessions reloaded",
       &UserCounters::bytes_reloaded},
  };
  for (const UserCounter& c : kCounters) {
    MetricFamily& family = f.Add(c.name, c.help, MetricType::Counter);
    for (const auto& [uid, totals] : s.user_totals) {
      Families::Sample(family, static_cast<double>(totals.*c.field), {{"uid", Uid(uid)}});
    }
  }

  MetricFamily& wait = f.Add(
      "tierd_lane_wait_seconds",
      "Longest time a GPU lane of a uid has now been waiting for a client's ticket (its stream "
      "has not reached the job's point)",
      MetricType::Gauge);
  MetricFamily& queued = f.Add("tierd_lane_queued_jobs",
                               "Jobs queued on GPU lanes of a uid, not yet issued",
                               MetricType::Gauge);
  MetricFamily& in_flight = f.Add("tierd_lane_copies_in_flight",
                                  "Copies issued on GPU lanes of a uid and not yet complete",
                                  MetricType::Gauge);
  for (const auto& [key, lane] : s.lanes) {
    const auto& [uid, gpu, direction] = key;
    Labels labels = {{"uid", Uid(uid)}, {"gpu", absl::StrCat(gpu)}, {"direction", direction}};
    Families::Sample(wait, static_cast<double>(lane.wait_ms) / 1000.0, labels);
    Families::Sample(queued, static_cast<double>(lane.queued), labels);
    Families::Sample(in_flight, static_cast<double>(lane.in_flight), labels);
  }
}

void AddPersistent(const MetricsSnapshot& s, Families& f) {
  const PersistentUsage& p = s.persistent;
  f.Gauge("tierd_persistent_objects", "Persistent (named) objects of every user, names reserved "
          "included", static_cast<double>(p.objects));
  f.Gauge("tierd_persistent_bytes", "Bytes persistent objects hold in the tiers",
          static_cast<double>(p.bytes));
  f.Gauge("tierd_persistent_max_bytes", "persistent_max_bytes as applied",
          static_cast<double>(p.limits.max_bytes));
  f.Gauge("tierd_persistent_journal_bytes",
          "Bytes of the persistent objects' journal on NVMe (beside the spill file)",
          static_cast<double>(p.journal.file_bytes));
  f.Gauge("tierd_persistent_journal_live_bytes",
          "Of the journal's bytes, those of live objects (the rest awaits compaction)",
          static_cast<double>(p.journal.live_bytes));
  f.Gauge("tierd_persistent_journal_max_bytes", "persistent_journal_max_bytes as applied",
          static_cast<double>(p.journal.max_bytes));
  f.Gauge("tierd_persistent_journal_queued",
          "Objects and deletes waiting for the journal's writer", static_cast<double>(p.writes_queued));
  f.Counter("tierd_persistent_journal_compactions_total",
            "Rewrites of the journal's live records into a new file", p.journal.compactions);
  f.Counter("tierd_persistent_journal_errors_total",
            "Failed journal appends, syncs and compactions", p.journal.errors);
}

}  // namespace

std::vector<MetricFamily> ToMetricFamilies(const MetricsSnapshot& snapshot) {
  Families families;
  AddBuildAndHealth(snapshot, families);
  AddTiers(snapshot, families);
  AddSpill(snapshot, families);
  AddJobs(snapshot, families);
  AddClients(snapshot, families);
  AddPersistent(snapshot, families);
  return families.Take();
}

}  // namespace tier::daemon
