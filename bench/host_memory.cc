#include "host_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace tier::bench {
namespace {

constexpr uint64_t kMiB = 1024 * 1024;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

enum class Kernel { kRead, kWrite, kCopy };

std::atomic<uint64_t> sink{0};  // keeps the read kernel's sums alive

uint64_t ReadPass(const char* src, uint64_t bytes) {
  const uint64_t* p = reinterpret_cast<const uint64_t*>(src);
  const uint64_t n = bytes / sizeof(uint64_t);
  uint64_t a = 0, b = 0, c = 0, d = 0, e = 0, f = 0, g = 0, h = 0;
  for (uint64_t i = 0; i + 8 <= n; i += 8) {
    a += p[i];
    b += p[i + 1];
    c += p[i + 2];
    d += p[i + 3];
    e += p[i + 4];
    f += p[i + 5];
    g += p[i + 6];
    h += p[i + 7];
  }
  return a + b + c + d + e + f + g + h;
}

// Runs `kernel` on `threads` threads, thread i on slice i of src and dst, passes over the slice
// until `seconds` are up; the bytes every thread moved over the longest thread's time.
double Run(Kernel kernel, int threads, char* src, char* dst, uint64_t region, double seconds) {
  const uint64_t slice = (region / threads) & ~(2 * kMiB - 1);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<uint64_t> moved(threads, 0);
  std::vector<double> took(threads, 0);
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      char* s = src + i * slice;
      char* d = dst + i * slice;
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      const double t0 = Now();
      uint64_t sum = 0;
      int pass = 0;
      do {
        switch (kernel) {
          case Kernel::kRead:
            sum += ReadPass(s, slice);
            break;
          case Kernel::kWrite:
            std::memset(d, pass & 0xff, slice);
            break;
          case Kernel::kCopy:
            std::memcpy(d, s, slice);
            break;
        }
        moved[i] += slice;
        ++pass;
      } while (Now() - t0 < seconds);
      took[i] = Now() - t0;
      sink.fetch_add(sum, std::memory_order_relaxed);
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  go.store(true, std::memory_order_release);
  for (std::thread& t : pool) t.join();
  uint64_t total = 0;
  for (uint64_t m : moved) total += m;
  return static_cast<double>(total) / *std::max_element(took.begin(), took.end()) / 1e9;
}

}  // namespace

std::vector<HostMemoryRate> MeasureHostMemory(const std::vector<int>& thread_counts,
                                              double seconds) {
  std::vector<HostMemoryRate> rows;
  if (thread_counts.empty()) return rows;
  const int most = *std::max_element(thread_counts.begin(), thread_counts.end());
  // At least 1 GiB a side, and 64 MiB a thread: every slice is beyond the caches.
  const uint64_t region = std::max<uint64_t>(1024 * kMiB, most * 64 * kMiB);
  void* mapped = ::mmap(nullptr, 2 * region, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
  if (mapped == MAP_FAILED) {
    std::perror("mmap (host memory bench)");
    return rows;
  }
  ::madvise(mapped, 2 * region, MADV_HUGEPAGE);
  char* src = static_cast<char*>(mapped);
  char* dst = src + region;
  // Faulted in by as many threads as measure, so first-touch spreads the pages as they will be
  // used (and no kernel pays the faults).
  Run(Kernel::kWrite, most, src, dst, region, 0);
  Run(Kernel::kWrite, most, dst, src, region, 0);
  for (int threads : thread_counts) {
    HostMemoryRate row;
    row.threads = threads;
    row.read_gbps = Run(Kernel::kRead, threads, src, dst, region, seconds);
    row.write_gbps = Run(Kernel::kWrite, threads, src, dst, region, seconds);
    row.copy_gbps = Run(Kernel::kCopy, threads, src, dst, region, seconds);
    rows.push_back(row);
  }
  ::munmap(mapped, 2 * region);
  return rows;
}

}  // namespace tier::bench
