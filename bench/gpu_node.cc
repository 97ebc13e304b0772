// A node of several GPUs and one tierd (issue 26), in one run:
//
//   bandwidth  each GPU's link alone, then every GPU at once: D2H, H2D and both directions, through
//              tierd (lone jobs) and through the same-process baseline (cudaMemcpyAsync between
//              the GPU and pinned host memory, one stream per direction), in the same run; the
//              target is tierd with every GPU at once >= 95% of the baseline with every GPU at once
//   host       the host's memory bandwidth (read, write, copy) on 1, N GPUs', half and all cores'
//              threads: where the sum of the links meets the memory's cap
//   isolation  GPU 1..N-1's lone-job latency and bandwidth (tierd and baseline) while GPU 0 is idle,
//              saturated by baseline copies, saturated by a bulk tierd client, flooded with small
//              tierd jobs, or stalled (a tierd client whose tickets never come); the target is
//              tierd's figures within 5% of GPU 0 idle (the baseline's own change under the same
//              load is what the hardware costs: printed beside it)
//
//   tier_gpu_node [--tierd=BIN] [--tierd-flag=--KEY=VALUE]... [--gpus=N] [--seconds=1.5]
//                 [--job-mib=64] [--depth=4] [--latency-kib=4] [--flood-kib=256]
//                 [--flood-depth=32] [--host-seconds=0.5] [--skip=host,bandwidth,isolation]
//                 [--json=FILE] [--timeout=600]
//
// One worker process per GPU (bench/node_worker.h), forked before this process touches CUDA
// (it never does): each has its own tierd session, as one rank per GPU would. A private tierd
// (the one built beside this program, or --tierd) with the CUDA engine. With one GPU the isolation
// part says it needs two and is skipped. Prints tables (and `tierctl pools` when tierctl is built
// beside tierd) and writes JSON. Exit 0 when every measurement ran (targets are reported, not
// enforced), 1 on a failure, 3 when --timeout passed (a watchdog, not a hang).
#include <cuda_runtime_api.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "host_memory.h"
#include "node_worker.h"
#include "tierd_process.h"

namespace {

using tier::bench::Command;
using tier::bench::CopyPath;
using tier::bench::Now;
using tier::bench::Op;
using tier::bench::Result;
using tier::bench::WorkerProcess;

constexpr uint64_t kKiB = 1024, kMiB = 1024 * kKiB;
constexpr int kMaxGpus = 64;
constexpr double kBandwidthTarget = 0.95;  // tierd / baseline, every GPU at once
constexpr double kIsolationTarget = 0.05;  // slowdown of the other GPUs' figures

const char* volatile phase = "start";

void Watchdog(int) {
  const char prefix[] = "\ntier_gpu_node: --timeout passed during: ";
  (void)!::write(2, prefix, sizeof prefix - 1);
  (void)!::write(2, phase, std::strlen(phase));
  (void)!::write(2, "\n", 1);
  ::_exit(3);  // the workers (PDEATHSIG) and tierd go with this process
}

struct Gpu {
  char name[256];
  char bus_id[32];
};

// The GPUs, asked in a child so that this process never initializes CUDA (it forks workers).
int ProbeGpus(std::vector<Gpu>* gpus) {
  int fds[2];
  if (::pipe(fds) != 0) return 0;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    n = std::min(n, kMaxGpus);
    (void)!::write(fds[1], &n, sizeof n);
    for (int g = 0; g < n; ++g) {
      Gpu gpu{};
      cudaDeviceProp prop{};
      if (cudaGetDeviceProperties(&prop, g) == cudaSuccess) {
        std::snprintf(gpu.name, sizeof gpu.name, "%s", prop.name);
      }
      cudaDeviceGetPCIBusId(gpu.bus_id, sizeof gpu.bus_id, g);
      (void)!::write(fds[1], &gpu, sizeof gpu);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  int n = 0;
  if (::read(fds[0], &n, sizeof n) != sizeof n) n = 0;
  for (int g = 0; g < n; ++g) {
    Gpu gpu{};
    if (::read(fds[0], &gpu, sizeof gpu) != sizeof gpu) break;
    gpus->push_back(gpu);
  }
  ::close(fds[0]);
  ::waitpid(pid, nullptr, 0);
  return static_cast<int>(gpus->size());
}

[[noreturn]] void Die(const Result& r, const char* what) {
  std::fprintf(stderr, "tier_gpu_node: %s failed: %s\n", what, r.error);
  std::exit(1);
}

// Sends `c` to every worker in `workers` (each with the same start), then collects the results.
std::vector<Result> RunAll(const std::vector<WorkerProcess*>& workers, Command c,
                           const char* what) {
  c.start = Now() + 0.2;
  for (WorkerProcess* w : workers) w->Send(c);
  std::vector<Result> results;
  for (WorkerProcess* w : workers) {
    results.push_back(w->Receive());
    if (!results.back().ok) Die(results.back(), what);
  }
  return results;
}

const char* kDirName[] = {"", "D2H", "H2D", "both"};

double Figure(const Result& r, int directions) {
  return directions == tier::bench::kD2H ? r.d2h_gbps
         : directions == tier::bench::kH2D ? r.h2d_gbps
                                           : r.d2h_gbps + r.h2d_gbps;
}

double Sum(const std::vector<Result>& rs, int directions) {
  double s = 0;
  for (const Result& r : rs) s += Figure(r, directions);
  return s;
}

struct Options {
  std::string tierd_bin, json_path = "gpu_node.json";
  std::vector<std::string> tierd_flags;
  int gpus = 0;  // 0: all
  double seconds = 1.5, host_seconds = 0.5;
  uint64_t job_bytes = 64 * kMiB, latency_bytes = 4 * kKiB, flood_bytes = 256 * kKiB;
  int depth = 4, flood_depth = 32;
  bool host = true, bandwidth = true, isolation = true;
  int timeout_s = 600;
};

bool Parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char* key) -> const char* {
      size_t n = std::strlen(key);
      return arg.compare(0, n, key) == 0 ? argv[i] + n : nullptr;
    };
    if (const char* v = value("--tierd=")) o->tierd_bin = v;
    else if (const char* v = value("--tierd-flag=")) o->tierd_flags.push_back(v);
    else if (const char* v = value("--gpus=")) o->gpus = std::max(0, std::atoi(v));
    else if (const char* v = value("--seconds=")) o->seconds = std::max(0.2, std::atof(v));
    else if (const char* v = value("--host-seconds=")) o->host_seconds = std::max(0.1, std::atof(v));
    else if (const char* v = value("--job-mib=")) o->job_bytes = std::max(1LL, std::atoll(v)) * kMiB;
    else if (const char* v = value("--depth=")) o->depth = std::clamp(std::atoi(v), 1, 64);
    else if (const char* v = value("--latency-kib=")) o->latency_bytes = std::max(1LL, std::atoll(v)) * kKiB;
    else if (const char* v = value("--flood-kib=")) o->flood_bytes = std::max(1LL, std::atoll(v)) * kKiB;
    else if (const char* v = value("--flood-depth=")) o->flood_depth = std::clamp(std::atoi(v), 1, 256);
    else if (const char* v = value("--json=")) o->json_path = v;
    else if (const char* v = value("--timeout=")) o->timeout_s = std::max(10, std::atoi(v));
    else if (const char* v = value("--skip=")) {
      std::string skip = v;
      o->host = skip.find("host") == std::string::npos;
      o->bandwidth = skip.find("bandwidth") == std::string::npos;
      o->isolation = skip.find("isolation") == std::string::npos;
    } else {
      return false;
    }
  }
  return true;
}

// ---- bandwidth ----------------------------------------------------------------------------------

struct BandwidthRun {
  // [direction 1..3][path 0 baseline, 1 tierd]
  std::vector<Result> alone[4][2];  // one per GPU, each measured by itself
  std::vector<Result> all[4][2];    // one per GPU, measured at once
};

BandwidthRun MeasureBandwidth(const std::vector<std::unique_ptr<WorkerProcess>>& workers,
                              const Options& o) {
  BandwidthRun run;
  std::vector<WorkerProcess*> every;
  for (const auto& w : workers) every.push_back(w.get());
  for (int d : {tier::bench::kD2H, tier::bench::kH2D, tier::bench::kBoth}) {
    for (int p = 0; p < 2; ++p) {
      Command c;
      c.op = Op::kStream;
      c.path = p == 0 ? CopyPath::kBaseline : CopyPath::kTierd;
      c.directions = d;
      c.depth = o.depth;
      c.job_bytes = o.job_bytes;
      c.seconds = o.seconds;
      phase = "bandwidth, one GPU alone";
      for (WorkerProcess* w : every) run.alone[d][p].push_back(RunAll({w}, c, phase)[0]);
      phase = "bandwidth, every GPU at once";
      run.all[d][p] = RunAll(every, c, phase);
    }
  }
  return run;
}

void PrintBandwidth(const BandwidthRun& run, const std::vector<Gpu>& gpus, const Options& o,
                    FILE* json) {
  const int n = static_cast<int>(gpus.size());
  std::printf("\n== bandwidth: %d GPU%s, lone jobs of %llu MiB, %d in flight per direction, %.1f s "
              "each (GB/s)\n",
              n, n > 1 ? "s" : "", static_cast<unsigned long long>(o.job_bytes / kMiB), o.depth,
              o.seconds);
  std::printf("%-14s | %8s %7s %5s | %8s %7s %5s | %8s %7s %5s\n", "", "D2H base", "tierd", "ratio",
              "H2D base", "tierd", "ratio", "both base", "tierd", "ratio");
  auto row = [](const char* label, double v[4][2]) {
    std::printf("%-14s", label);
    for (int d = 1; d <= 3; ++d) {
      std::printf(" | %8.2f %7.2f %4.0f%%", v[d][0], v[d][1], v[d][0] > 0 ? 100 * v[d][1] / v[d][0] : 0);
    }
    std::printf("\n");
  };
  double sum_alone[4][2] = {}, together[4][2] = {};
  for (int g = 0; g < n; ++g) {
    double v[4][2] = {};
    for (int d = 1; d <= 3; ++d) {
      for (int p = 0; p < 2; ++p) {
        v[d][p] = Figure(run.alone[d][p][g], d);
        sum_alone[d][p] += v[d][p];
      }
    }
    char label[32];
    std::snprintf(label, sizeof label, "GPU %d alone", g);
    row(label, v);
  }
  for (int g = 0; g < n && n > 1; ++g) {
    double v[4][2] = {};
    for (int d = 1; d <= 3; ++d) {
      for (int p = 0; p < 2; ++p) v[d][p] = Figure(run.all[d][p][g], d);
    }
    char label[32];
    std::snprintf(label, sizeof label, "GPU %d in all", g);
    row(label, v);
  }
  for (int d = 1; d <= 3; ++d) {
    for (int p = 0; p < 2; ++p) together[d][p] = Sum(run.all[d][p], d);
  }
  row("sum alone", sum_alone);
  row("ALL AT ONCE", together);
  std::printf("(base = cudaMemcpyAsync in the worker process, pinned host memory, one stream per "
              "direction; tierd = tier_offload / tier_reload; both = D2H + H2D at once)\n");
  std::printf("every GPU at once against the sum of each alone: baseline D2H %.0f%%, H2D %.0f%%, "
              "both %.0f%%; tierd D2H %.0f%%, H2D %.0f%%, both %.0f%%\n",
              100 * together[1][0] / sum_alone[1][0], 100 * together[2][0] / sum_alone[2][0],
              100 * together[3][0] / sum_alone[3][0], 100 * together[1][1] / sum_alone[1][1],
              100 * together[2][1] / sum_alone[2][1], 100 * together[3][1] / sum_alone[3][1]);
  bool pass = true;
  for (int d = 1; d <= 3; ++d) pass = pass && together[d][1] >= kBandwidthTarget * together[d][0];
  std::printf("TARGET tierd every-GPU / baseline every-GPU >= %.0f%%: D2H %.1f%%, H2D %.1f%%, both "
              "%.1f%%: %s\n",
              100 * kBandwidthTarget, 100 * together[1][1] / together[1][0],
              100 * together[2][1] / together[2][0], 100 * together[3][1] / together[3][0],
              pass ? "PASS" : "FAIL");

  std::fprintf(json, "\"bandwidth\": {\"job_bytes\": %llu, \"depth\": %d, \"seconds\": %.2f",
               static_cast<unsigned long long>(o.job_bytes), o.depth, o.seconds);
  for (int d = 1; d <= 3; ++d) {
    for (int p = 0; p < 2; ++p) {
      std::fprintf(json, ", \"%s_%s\": {\"alone\": [", kDirName[d], p ? "tierd" : "base");
      for (int g = 0; g < n; ++g) {
        std::fprintf(json, "%s%.3f", g ? ", " : "", Figure(run.alone[d][p][g], d));
      }
      std::fprintf(json, "], \"together\": [");
      for (int g = 0; g < n; ++g) {
        std::fprintf(json, "%s%.3f", g ? ", " : "", Figure(run.all[d][p][g], d));
      }
      std::fprintf(json, "], \"sum_alone\": %.3f, \"sum_together\": %.3f}", sum_alone[d][p],
                   together[d][p]);
    }
  }
  std::fprintf(json, ", \"target\": %.2f, \"pass\": %s}", kBandwidthTarget,
               pass ? "true" : "false");
}

// ---- host memory --------------------------------------------------------------------------------

std::vector<tier::bench::HostMemoryRate> MeasureHost(int gpus, const Options& o) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<int> counts = {1, gpus, 2 * gpus, std::max(1, cores / 2), cores};
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  counts.erase(std::remove_if(counts.begin(), counts.end(), [&](int t) { return t > cores; }),
               counts.end());
  phase = "host memory";
  return tier::bench::MeasureHostMemory(counts, o.host_seconds);
}

void PrintHost(const std::vector<tier::bench::HostMemoryRate>& rows, const BandwidthRun* run,
               FILE* json) {
  std::printf("\n== host memory: threads of one process, each on its own slice of a >= 1 GiB region "
              "(GB/s)\n");
  std::printf("%8s | %8s %8s %8s\n", "threads", "read", "write", "copy");
  double best_read = 0, best_write = 0, best_copy = 0;
  std::fprintf(json, "\"host_memory\": [");
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    std::printf("%8d | %8.1f %8.1f %8.1f\n", r.threads, r.read_gbps, r.write_gbps, r.copy_gbps);
    best_read = std::max(best_read, r.read_gbps);
    best_write = std::max(best_write, r.write_gbps);
    best_copy = std::max(best_copy, r.copy_gbps);
    std::fprintf(json, "%s{\"threads\": %d, \"read\": %.3f, \"write\": %.3f, \"copy\": %.3f}",
                 i ? ", " : "", r.threads, r.read_gbps, r.write_gbps, r.copy_gbps);
  }
  std::fprintf(json, "]");
  std::printf("(read: 64-bit loads; write: memset; copy: memcpy, bytes copied: twice that through "
              "memory)\n");
  if (run != nullptr && !run->all[1][0].empty()) {
    // D2H DMA writes host memory, H2D reads it; both directions do both.
    const double d2h = Sum(run->all[1][0], 1), h2d = Sum(run->all[2][0], 2);
    const double both = Sum(run->all[3][0], 3);
    std::printf("every GPU at once (baseline) against the best host figure: D2H %.1f GB/s = %.0f%% "
                "of write %.1f; H2D %.1f GB/s = %.0f%% of read %.1f; both %.1f GB/s = %.0f%% of "
                "copy traffic %.1f (2 x copy)\n",
                d2h, 100 * d2h / best_write, best_write, h2d, 100 * h2d / best_read, best_read,
                both, 100 * both / (2 * best_copy), 2 * best_copy);
  }
}

// ---- isolation ----------------------------------------------------------------------------------

struct VictimFigures {  // one scenario, the mean over GPUs 1..N-1
  double tierd_offload_us = 0, tierd_reload_us = 0, tierd_d2h = 0, tierd_h2d = 0;
  double base_offload_us = 0, base_reload_us = 0, base_d2h = 0, base_h2d = 0;
  double load_d2h = 0, load_h2d = 0;  // what GPU 0's load moved (stream loads)
};

struct Scenario {
  const char* name;
  const char* what;
  bool load;
  Command command;  // GPU 0's load
};

VictimFigures MeasureVictims(const std::vector<WorkerProcess*>& victims, WorkerProcess* gpu0,
                             const Scenario& s, const Options& o) {
  VictimFigures f;
  if (s.load) {
    Command load = s.command;
    load.start = Now() + 0.1;
    load.seconds = 0;  // until Stop()
    gpu0->Send(load);
    // Let the load reach its steady state (and the stall's jobs reach tierd's lanes).
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
  }
  auto mean = [&](const std::vector<Result>& rs, double Result::*field) {
    double s = 0;
    for (const Result& r : rs) s += r.*field;
    return s / rs.size();
  };
  for (CopyPath path : {CopyPath::kTierd, CopyPath::kBaseline}) {
    const bool tierd = path == CopyPath::kTierd;
    Command lat;
    lat.op = Op::kLatency;
    lat.path = path;
    lat.job_bytes = o.latency_bytes;
    lat.seconds = o.seconds;
    std::vector<Result> l = RunAll(victims, lat, phase);
    Command bw;
    bw.op = Op::kStream;
    bw.path = path;
    bw.directions = tier::bench::kBoth;
    bw.depth = o.depth;
    bw.job_bytes = o.job_bytes;
    bw.seconds = o.seconds;
    std::vector<Result> b = RunAll(victims, bw, phase);
    (tierd ? f.tierd_offload_us : f.base_offload_us) = mean(l, &Result::offload_us);
    (tierd ? f.tierd_reload_us : f.base_reload_us) = mean(l, &Result::reload_us);
    (tierd ? f.tierd_d2h : f.base_d2h) = mean(b, &Result::d2h_gbps);
    (tierd ? f.tierd_h2d : f.base_h2d) = mean(b, &Result::h2d_gbps);
  }
  if (s.load) {
    gpu0->Stop();
    Result r = gpu0->Receive();
    if (!r.ok) Die(r, s.name);
    f.load_d2h = r.d2h_gbps;
    f.load_h2d = r.h2d_gbps;
  }
  return f;
}

void MeasureIsolation(const std::vector<std::unique_ptr<WorkerProcess>>& workers, const Options& o,
                      FILE* json) {
  std::vector<WorkerProcess*> victims;
  for (size_t g = 1; g < workers.size(); ++g) victims.push_back(workers[g].get());
  WorkerProcess* gpu0 = workers[0].get();
  Command bulk_base, bulk_tierd, flood, stall;
  bulk_base.op = bulk_tierd.op = flood.op = Op::kStream;
  bulk_base.path = CopyPath::kBaseline;
  bulk_tierd.path = flood.path = stall.path = CopyPath::kTierd;
  bulk_base.depth = bulk_tierd.depth = stall.depth = o.depth;
  bulk_base.job_bytes = bulk_tierd.job_bytes = stall.job_bytes = o.job_bytes;
  flood.depth = o.flood_depth;
  flood.job_bytes = o.flood_bytes;
  stall.op = Op::kStall;
  const std::vector<Scenario> scenarios = {
      {"idle", "GPU 0 does nothing", false, {}},
      {"bulk-base", "GPU 0: baseline copies, both directions, full link", true, bulk_base},
      {"bulk-tierd", "GPU 0: a bulk tierd client, both directions, full link", true, bulk_tierd},
      {"flood-tierd", "GPU 0: a tierd client of small lone jobs, both directions", true, flood},
      {"stall-tierd", "GPU 0: a tierd client whose tickets never come (jobs wait in its lanes)",
       true, stall},
  };
  std::vector<VictimFigures> figures;
  for (const Scenario& s : scenarios) {
    phase = s.name;
    figures.push_back(MeasureVictims(victims, gpu0, s, o));
  }
  const VictimFigures& idle = figures[0];
  std::printf("\n== isolation: GPU%s 1..%zu while GPU 0 is loaded (tierd lone jobs; latency: %llu "
              "KiB jobs, median; bandwidth: %llu MiB jobs, both directions at once)\n",
              victims.size() > 1 ? "s" : "", victims.size(),
              static_cast<unsigned long long>(o.latency_bytes / kKiB),
              static_cast<unsigned long long>(o.job_bytes / kMiB));
  std::printf("%-12s | %22s | %8s %8s %8s %8s | %8s %8s %8s %8s | %15s\n", "GPU 0", "GPU 0 moved GB/s",
              "off us", "rel us", "D2H", "H2D", "base off", "base rel", "base D2H", "base H2D",
              "worst vs idle");
  // Slowdown of each figure against idle: latency up, bandwidth down (positive = worse).
  auto slow_lat = [](double v, double ref) { return ref > 0 ? v / ref - 1 : 0; };
  auto slow_bw = [](double v, double ref) { return ref > 0 ? 1 - v / ref : 0; };
  bool pass = true;
  std::fprintf(json, "\"isolation\": {\"victims\": %zu, \"latency_bytes\": %llu, \"scenarios\": [",
               victims.size(), static_cast<unsigned long long>(o.latency_bytes));
  for (size_t i = 0; i < figures.size(); ++i) {
    const VictimFigures& f = figures[i];
    const double tierd_worst =
        std::max({slow_lat(f.tierd_offload_us, idle.tierd_offload_us),
                  slow_lat(f.tierd_reload_us, idle.tierd_reload_us),
                  slow_bw(f.tierd_d2h, idle.tierd_d2h), slow_bw(f.tierd_h2d, idle.tierd_h2d)});
    const double base_worst =
        std::max({slow_lat(f.base_offload_us, idle.base_offload_us),
                  slow_lat(f.base_reload_us, idle.base_reload_us),
                  slow_bw(f.base_d2h, idle.base_d2h), slow_bw(f.base_h2d, idle.base_h2d)});
    char moved[32] = "-";
    if (scenarios[i].load) {
      std::snprintf(moved, sizeof moved, "%.1f + %.1f", f.load_d2h, f.load_h2d);
    }
    char worst[32] = "-";
    if (i > 0) std::snprintf(worst, sizeof worst, "%+.1f%% (base %+.1f%%)", 100 * tierd_worst, 100 * base_worst);
    std::printf("%-12s | %22s | %8.1f %8.1f %8.2f %8.2f | %8.1f %8.1f %8.2f %8.2f | %s\n",
                scenarios[i].name, moved, f.tierd_offload_us, f.tierd_reload_us, f.tierd_d2h,
                f.tierd_h2d, f.base_offload_us, f.base_reload_us, f.base_d2h, f.base_h2d, worst);
    // Within the target, or no worse than what the same load does to the baseline's figures
    // (the hardware's share: the host's memory, the PCIe switch) by more than the target.
    const bool ok = tierd_worst <= kIsolationTarget ||
                    tierd_worst <= std::max(0.0, base_worst) + kIsolationTarget;
    if (i > 0) pass = pass && ok;
    std::fprintf(json,
                 "%s{\"name\": \"%s\", \"load_d2h\": %.3f, \"load_h2d\": %.3f, "
                 "\"tierd_offload_us\": %.2f, \"tierd_reload_us\": %.2f, \"tierd_d2h\": %.3f, "
                 "\"tierd_h2d\": %.3f, \"base_offload_us\": %.2f, \"base_reload_us\": %.2f, "
                 "\"base_d2h\": %.3f, \"base_h2d\": %.3f, \"tierd_worst_slowdown\": %.4f, "
                 "\"base_worst_slowdown\": %.4f}",
                 i ? ", " : "", scenarios[i].name, f.load_d2h, f.load_h2d, f.tierd_offload_us,
                 f.tierd_reload_us, f.tierd_d2h, f.tierd_h2d, f.base_offload_us, f.base_reload_us,
                 f.base_d2h, f.base_h2d, tierd_worst, base_worst);
  }
  std::fprintf(json, "], \"target\": %.2f, \"pass\": %s}", kIsolationTarget,
               pass ? "true" : "false");
  for (size_t i = 1; i < scenarios.size(); ++i) {
    std::printf("  %-12s %s\n", scenarios[i].name, scenarios[i].what);
  }
  std::printf("(off/rel us: a lone offload + job wait / reload + consumer sync; D2H/H2D: GB/s per "
              "GPU, mean over GPUs 1..N-1; worst vs idle: the largest slowdown of the four tierd "
              "figures, and of the four baseline figures under the same load)\n");
  std::printf("TARGET GPUs 1..N-1 through tierd within %.0f%% of GPU 0 idle (or of the baseline's "
              "own change under the same load): %s\n",
              100 * kIsolationTarget, pass ? "PASS" : "FAIL");
}

// `tierctl pools` of the bench's tierd, when tierctl is built beside it.
void PrintPools(const std::string& tierd_bin, const std::string& socket) {
  std::filesystem::path tierctl =
      std::filesystem::path(tierd_bin).parent_path().parent_path() / "tierctl" / "tierctl";
  if (::access(tierctl.c_str(), X_OK) != 0) return;
  std::printf("\n== tierctl pools (the bench's tierd, after the run)\n");
  std::fflush(stdout);
  std::string cmd = tierctl.string() + " --socket " + socket + " pools";
  if (std::system(cmd.c_str()) != 0) std::printf("(tierctl pools failed)\n");
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!Parse(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: %s [--tierd=BIN] [--tierd-flag=--KEY=VALUE]... [--gpus=N] [--seconds=S] "
                 "[--job-mib=N] [--depth=N] [--latency-kib=N] [--flood-kib=N] [--flood-depth=N] "
                 "[--host-seconds=S] [--skip=host,bandwidth,isolation] [--json=FILE] "
                 "[--timeout=S]\n",
                 argv[0]);
    return 2;
  }
  ::signal(SIGALRM, Watchdog);
  ::alarm(o.timeout_s);
  std::vector<Gpu> gpus;
  if (::access("/dev/nvidiactl", F_OK) != 0 || ProbeGpus(&gpus) == 0) {
    std::fprintf(stderr, "no GPU: nothing to measure\n");
    return 77;
  }
  if (o.gpus > 0 && o.gpus < static_cast<int>(gpus.size())) gpus.resize(o.gpus);
  const int n = static_cast<int>(gpus.size());
  std::printf("tier_gpu_node: %d GPU%s:", n, n > 1 ? "s" : "");
  for (int g = 0; g < n; ++g) std::printf(" [%d] %s (%s)", g, gpus[g].name, gpus[g].bus_id);
  std::printf("\n");

  if (o.tierd_bin.empty()) {
    o.tierd_bin = (std::filesystem::canonical("/proc/self/exe").parent_path().parent_path() /
                   "daemon" / "tierd").string();
  }
  // Room for every GPU's objects at once (reload sources, offloads in flight, a stalled client
  // beside a load) twice over, so no part of a split pool fills.
  const uint64_t arena = std::max({o.job_bytes * o.depth, o.flood_bytes * o.flood_depth,
                                   o.latency_bytes});
  const uint64_t pool = n * 4 * arena + 1024 * kMiB;
  std::vector<std::string> flags = {"--engine=cuda", "--pool_bytes=" + std::to_string(pool >> 20) + "M",
                                    "--pool_lock=best-effort"};
  flags.insert(flags.end(), o.tierd_flags.begin(), o.tierd_flags.end());
  phase = "starting tierd and the workers";
  tier::bench::TierdProcess daemon(o.tierd_bin, flags);
  std::vector<std::unique_ptr<WorkerProcess>> workers;
  for (int g = 0; g < n; ++g) {
    tier::bench::WorkerOptions w;
    w.gpu = g;
    w.socket = daemon.socket();
    w.name = "gpu-node-" + std::to_string(g);
    w.arena_bytes = arena;
    workers.push_back(std::make_unique<WorkerProcess>(w));
  }
  std::vector<WorkerProcess*> every;
  for (const auto& w : workers) {
    Result ready = w->Receive();
    if (!ready.ok) Die(ready, "a worker's set-up");
    every.push_back(w.get());
  }
  // Warm up every path once (streams, tierd's lanes, the pool's pages).
  phase = "warm-up";
  for (CopyPath path : {CopyPath::kBaseline, CopyPath::kTierd}) {
    Command c;
    c.op = Op::kStream;
    c.path = path;
    c.directions = tier::bench::kBoth;
    c.depth = o.depth;
    c.job_bytes = o.job_bytes;
    c.seconds = 0.3;
    RunAll(every, c, phase);
  }

  FILE* json = std::fopen(o.json_path.c_str(), "w");
  if (json == nullptr) json = std::fopen("/dev/null", "w");
  std::fprintf(json, "{\"gpus\": [");
  for (int g = 0; g < n; ++g) {
    std::fprintf(json, "%s{\"name\": \"%s\", \"bus_id\": \"%s\"}", g ? ", " : "", gpus[g].name,
                 gpus[g].bus_id);
  }
  std::fprintf(json, "]");

  std::unique_ptr<BandwidthRun> bandwidth;
  if (o.bandwidth) {
    bandwidth = std::make_unique<BandwidthRun>(MeasureBandwidth(workers, o));
    std::fprintf(json, ", ");
    PrintBandwidth(*bandwidth, gpus, o, json);
  }
  if (o.host) {
    std::vector<tier::bench::HostMemoryRate> host = MeasureHost(n, o);
    std::fprintf(json, ", ");
    PrintHost(host, bandwidth.get(), json);
  }
  if (o.isolation) {
    if (n < 2) {
      std::printf("\n== isolation: needs 2 GPUs or more (this machine shows %d): skipped\n", n);
      std::fprintf(json, ", \"isolation\": null");
    } else {
      std::fprintf(json, ", ");
      MeasureIsolation(workers, o, json);
    }
  }
  std::fprintf(json, "}\n");
  std::fclose(json);
  phase = "tierctl pools";
  PrintPools(o.tierd_bin, daemon.socket());
  phase = "stopping";
  workers.clear();
  std::printf("wrote %s\n", o.json_path.c_str());
  return 0;
}
