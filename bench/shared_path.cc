// What one GPU's flood of jobs costs another GPU's lone job in the daemon's per-job bookkeeping
// alone (no copy, no ring; issue 26, item 3): the job counts (JobMetrics, JobGauge, totals), the
// engine's pool-write ordering (PoolWrites) and the host pool part's allocate and free, each job
// the calls a real offload makes. Flood threads (GPU 0's poller and worker) run them without a
// pause; a victim thread (GPU 1's) runs one job every --gap-us and times it. Two layouts, in one
// run:
//   shared   the victim's session on the flood's metric shard and its extents from the part's
//            allocator under the part's lock (a thread of no GPU, no cache), as every job's were
//            before; the pool writes are sharded by address in both layouts
//   per-GPU  as tierd runs now: its own shard and its GPU's extent cache
// Each prints the victim's median and p90 per job, alone and under the flood. Needs cores for
// the flood threads and the victim (on a 2-core machine the figures mostly show the scheduler).
//
//   tier_shared_path_bench [--seconds=1] [--flood-threads=2] [--gap-us=20]
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/thread_gpu.h"
#include "daemon/metrics/metrics.h"
#include "engine/pool_writes.h"
#include "storage/pool_part.h"

namespace {

using Clock = std::chrono::steady_clock;
using tier::daemon::DaemonMetrics;
using tier::engine::PoolWrites;
using tier::storage::Locality;
using tier::storage::PoolPart;

constexpr uint64_t kKiB = 1024, kMiB = 1024 * kKiB;
constexpr uint64_t kPoolBytes = 1024 * kMiB;

struct Shared {
  DaemonMetrics metrics;
  PoolWrites writes;
  PoolPart part{0, kPoolBytes, 4096, -1};
  char* pool = nullptr;  // addresses only (reserved, never touched)
};

// One offload's bookkeeping, then its free: what JobExecutor, JobIntake, LaneRunner and the
// pool do for it.
void Job(Shared& s, uint64_t session, uint64_t job_id, uint64_t len) {
  tier::ring::SubmissionEntry e{};
  e.opcode = static_cast<uint32_t>(tier::ring::Opcode::kOffload);
  e.job_id = job_id;
  e.len = len;
  s.metrics.jobs_in_flight.Add(session);
  s.metrics.jobs.Started(session, e);
  std::optional<tier::storage::Extent> extent = s.part.Allocate(len, Locality::kLocal);
  if (!extent) return;
  char* at = s.pool + extent->offset;
  const uint64_t id = s.writes.Add(at, len);
  PoolWrites::Before before = s.writes.Newest(at, len);
  uint64_t word = 0;
  s.writes.Issued(id, at, 0, &word, 1);
  std::vector<PoolWrites::Write> out;
  s.writes.Overlapping(at, len, before, &out);
  s.writes.End(id, at);
  s.metrics.jobs.Completed(session, e, 0);
  s.metrics.totals.jobs_completed.Add(session);
  s.metrics.totals.bytes_offloaded.Add(session, len);
  s.metrics.last_progress_ms.Store(session, 1);
  s.metrics.jobs_in_flight.Sub(session);
  s.part.Free(*extent);
}

struct Figures {
  double median_ns = 0, p90_ns = 0;
};

Figures Victim(Shared& s, int gpu, uint64_t session, double seconds, int gap_us) {
  tier::SetThreadGpu(gpu);
  std::vector<double> ns;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  for (uint64_t job = 1; Clock::now() < end; ++job) {
    const auto t0 = Clock::now();
    Job(s, session, job, 4 * kKiB);
    ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
    const auto next = Clock::now() + std::chrono::microseconds(gap_us);
    while (Clock::now() < next) {
    }
  }
  std::sort(ns.begin(), ns.end());
  return {ns[ns.size() / 2], ns[ns.size() * 9 / 10]};
}

Figures Run(bool per_gpu, bool flood, int flood_threads, double seconds, int gap_us, char* pool) {
  Shared s;
  s.pool = pool;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  if (flood) {
    for (int t = 0; t < flood_threads; ++t) {
      threads.emplace_back([&, t] {
        tier::SetThreadGpu(0);
        for (uint64_t job = 1 + t * (uint64_t{1} << 40); !stop.load(); ++job) {
          Job(s, /*session=*/1, job, 256 * kKiB);
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // Shared: session 17 is on session 1's shard, and a thread of no GPU allocates next to the
  // flood's extents (best fit in the same free range); per-GPU: its own shard and cache.
  Figures f = per_gpu ? Victim(s, 1, 2, seconds, gap_us) : Victim(s, -1, 17, seconds, gap_us);
  stop = true;
  for (std::thread& t : threads) t.join();
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 1;
  int flood_threads = 2, gap_us = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--seconds=", 0) == 0) seconds = std::atof(a.c_str() + 10);
    else if (a.rfind("--flood-threads=", 0) == 0)
      flood_threads = std::max(1, std::atoi(a.c_str() + 16));
    else if (a.rfind("--gap-us=", 0) == 0) gap_us = std::max(0, std::atoi(a.c_str() + 9));
    else {
      std::fprintf(stderr, "usage: %s [--seconds=S] [--flood-threads=N] [--gap-us=N]\n", argv[0]);
      return 2;
    }
  }
  void* pool = ::mmap(nullptr, kPoolBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                      -1, 0);
  if (pool == MAP_FAILED) return 1;
  std::printf("victim: a 4 KiB offload's bookkeeping every %d us; flood: %d threads of 256 KiB "
              "jobs (%u CPUs)\n", gap_us, flood_threads, std::thread::hardware_concurrency());
  std::printf("%-8s | %12s %12s | %12s %12s | %8s\n", "layout", "alone med ns", "alone p90",
              "flood med ns", "flood p90", "med x");
  for (bool per_gpu : {false, true}) {
    Figures alone = Run(per_gpu, false, flood_threads, seconds, gap_us, static_cast<char*>(pool));
    Figures loaded = Run(per_gpu, true, flood_threads, seconds, gap_us, static_cast<char*>(pool));
    std::printf("%-8s | %12.0f %12.0f | %12.0f %12.0f | %8.2f\n", per_gpu ? "per-GPU" : "shared",
                alone.median_ns, alone.p90_ns, loaded.median_ns, loaded.p90_ns,
                loaded.median_ns / alone.median_ns);
  }
  ::munmap(pool, kPoolBytes);
  return 0;
}
