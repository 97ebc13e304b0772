// Host pool start-up: how long making the pinned pool takes (fault every page in, then mlock),
// the old way (small pages, one thread) against huge pages and parallel faulting, in one run.
//
//   tier_pool_bench [--gib=N] [--repeat=R] [--json=FILE]
//
// The GPU registration that follows on a CUDA node (cudaHostRegister) is measured by tierd's own
// log line ("host pool: ... registered with the GPU in ..."), on the device.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "storage/host_pool.h"

namespace {

struct Variant {
  const char* name;
  bool huge_pages;
  uint32_t threads;  // 0: one per CPU (at most 16)
};

struct Row {
  std::string name;
  double ms_per_gib = 0;  // median over the repeats, whole Create (populate + mlock)
  double populate_ms_per_gib = 0;
  double lock_ms_per_gib = 0;
  uint32_t threads = 0;
  double huge_fraction = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t gib = 2;
  int repeat = 3;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--gib=", 6) == 0) gib = std::strtoull(argv[i] + 6, nullptr, 10);
    else if (std::strncmp(argv[i], "--repeat=", 9) == 0) repeat = std::atoi(argv[i] + 9);
    else if (std::strncmp(argv[i], "--json=", 7) == 0) json = argv[i] + 7;
    else {
      std::fprintf(stderr, "usage: %s [--gib=N] [--repeat=R] [--json=FILE]\n", argv[0]);
      return 2;
    }
  }
  if (gib == 0 || repeat < 1) {
    std::fprintf(stderr, "--gib and --repeat must be >= 1\n");
    return 2;
  }
  const Variant variants[] = {
      {"small pages, 1 thread (before)", false, 1},
      {"small pages, parallel", false, 0},
      {"huge pages, 1 thread", true, 1},
      {"huge pages, parallel (default)", true, 0},
  };
  std::vector<Row> rows;
  for (const Variant& v : variants) {
    std::vector<double> total, populate, lock;
    Row row;
    row.name = v.name;
    for (int r = 0; r < repeat; ++r) {
      tier::storage::HostPoolOptions options;
      options.bytes = gib << 30;
      options.lock = tier::storage::LockMode::kBestEffort;
      options.huge_pages = v.huge_pages;
      options.populate_threads = v.threads;
      auto start = std::chrono::steady_clock::now();
      auto pool = tier::storage::HostPool::Create(options);
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                            start).count();
      if (!pool.ok()) {
        std::fprintf(stderr, "%s: %s\n", v.name, pool.status().ToString().c_str());
        return 1;
      }
      const tier::storage::PoolSetup& s = (*pool)->setup();
      total.push_back(ms / gib);
      populate.push_back(s.populate_ns / 1e6 / gib);
      lock.push_back(s.lock_ns / 1e6 / gib);
      row.threads = s.threads;
      row.huge_fraction = double(s.huge_bytes) / double(options.bytes);
    }
    row.ms_per_gib = Median(total);
    row.populate_ms_per_gib = Median(populate);
    row.lock_ms_per_gib = Median(lock);
    rows.push_back(row);
  }
  const double before = rows.front().ms_per_gib;
  std::printf("host pool of %llu GiB, median of %d (ms per GiB)\n", (unsigned long long)gib,
              repeat);
  std::printf("%-32s %10s %10s %8s %8s %6s %9s\n", "variant", "total", "populate", "mlock",
              "threads", "huge", "speed-up");
  for (const Row& r : rows) {
    std::printf("%-32s %10.1f %10.1f %8.1f %8u %5.0f%% %8.2fx\n", r.name.c_str(), r.ms_per_gib,
                r.populate_ms_per_gib, r.lock_ms_per_gib, r.threads, 100 * r.huge_fraction,
                before / r.ms_per_gib);
  }
  if (!json.empty()) {
    std::ofstream out(json);
    out << "{\"gib\":" << gib << ",\"repeat\":" << repeat << ",\"rows\":[";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      out << (i ? "," : "") << "{\"variant\":\"" << r.name << "\",\"ms_per_gib\":" << r.ms_per_gib
          << ",\"populate_ms_per_gib\":" << r.populate_ms_per_gib
          << ",\"lock_ms_per_gib\":" << r.lock_ms_per_gib << ",\"threads\":" << r.threads
          << ",\"huge_fraction\":" << r.huge_fraction << ",\"speedup\":" << before / r.ms_per_gib
          << "}";
    }
    out << "]}\n";
  }
  return 0;
}
