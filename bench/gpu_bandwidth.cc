// GPU data path through tierd against the same copies made in this process, in one run:
// bandwidth of jobs from 64 KiB to 1 GiB, device->host (offload), host->device (reload) and both at
// once, against cudaMemcpyAsync between device memory and pinned host memory (the same copies,
// one cudaMemcpyAsync each, as a process copying tensor by tensor does); tierd with lone jobs
// (tier_offload / tier_reload) and with batches of --batch jobs (tier_offload_batch /
// tier_reload_batch: one ticket per batch); and the latency one small job adds (submit to
// GPU-visible completion) against a bare copy of the same size.
//
//   tier_gpu_bench [--socket=PATH | --tierd=BIN] [--tierd-flag=--KEY=VALUE]... [--max-mib=1024]
//                  [--batch=16] [--json=FILE]
//
// --tierd-flag passes a setting to the private tierd (repeatable): the same run with and without
// --tierd-flag=--metrics_listen=127.0.0.1:9477 shows what the metrics cost the job path.
// Without --socket it starts a private tierd (the one built beside this program, or --tierd) with
// the CUDA engine and a pool large enough for the largest size. Prints a table and writes JSON.
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
#include <tuple>
#include <vector>

#include "tier/tier.h"
#include "tierd_process.h"

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

void Check(tier_status s, const char* what) {
  if (s != TIER_OK) {
    std::fprintf(stderr, "%s: %s: %s\n", what, tier_status_name(s), tier_last_error());
    std::exit(1);
  }
}

struct Row {
  uint64_t bytes;
  int jobs;
  double base_d2h, tier_d2h, base_h2d, tier_h2d, base_both, tier_both;  // GB/s
  double batch_d2h, batch_h2d, batch_both;  // GB/s, tierd with batches
};

constexpr uint64_t kKiB = 1024, kMiB = 1024 * 1024, kGiB = 1024 * kMiB;

class Bench {
 public:
  Bench(tier_session* session, uint64_t arena) : session_(session), arena_(arena) {
    Check(cudaMalloc(&device_, arena), "cudaMalloc");
    Check(cudaMemset(device_, 0x5A, arena), "cudaMemset");
    Check(cudaHostAlloc(&host_, arena, cudaHostAllocDefault), "cudaHostAlloc");
    std::memset(host_, 0x5A, arena);
    Check(cudaStreamCreateWithFlags(&d2h_, cudaStreamNonBlocking), "stream");
    Check(cudaStreamCreateWithFlags(&h2d_, cudaStreamNonBlocking), "stream");
    uint64_t offset = 0;
    Check(tier_buffer_register_device(session, device_, &buffer_, &offset), "register");
    base_offset_ = offset;
    Check(cudaDeviceSynchronize(), "sync");
  }

  // Same-process copies: n jobs of `bytes` each direction on its own stream.
  double Baseline(uint64_t bytes, int n, bool d2h, bool h2d) {
    Check(cudaDeviceSynchronize(), "sync");
    double t0 = Now();
    for (int i = 0; i < n; ++i) {
      uint64_t at = Slot(bytes, i);
      if (d2h) {
        Check(cudaMemcpyAsync(static_cast<char*>(host_) + at, static_cast<char*>(device_) + at,
                              bytes, cudaMemcpyDeviceToHost, d2h_), "d2h");
      }
      if (h2d) {
        uint64_t other = Slot(bytes, i + n);
        Check(cudaMemcpyAsync(static_cast<char*>(device_) + other,
                              static_cast<char*>(host_) + other, bytes, cudaMemcpyHostToDevice, h2d_),
              "h2d");
      }
    }
    Check(cudaStreamSynchronize(d2h_), "sync");
    Check(cudaStreamSynchronize(h2d_), "sync");
    double seconds = Now() - t0;
    return static_cast<double>(bytes) * n * ((d2h ? 1 : 0) + (h2d ? 1 : 0)) / seconds / 1e9;
  }

  // Through tierd: n offloads (timed: submit to every completion), then n reloads of those
  // objects (timed: submit to GPU-visible completion on the consumer stream), then both at once
  // (offloads of new objects interleaved with reloads of the first ones).
  void Daemon(uint64_t bytes, int n, int batch, double* d2h, double* h2d, double* both) {
    std::vector<tier_object_id> first(n), second(n);
    std::vector<tier_job_id> jobs;
    jobs.reserve(2 * n);
    Check(cudaDeviceSynchronize(), "sync");
    tier_offload_options offload;
    tier_offload_options_init(&offload);
    void* producers[] = {d2h_};
    offload.num_producer_streams = 1;
    offload.producer_streams = producers;
    tier_reload_options reload;
    tier_reload_options_init(&reload);
    reload.consumer_stream = h2d_;

    double t0 = Now();
    for (int i = 0; i < n; i += batch) {
      Offload(bytes, i, std::min(batch, n - i), offload, first, jobs);
    }
    WaitAll(jobs);
    *d2h = static_cast<double>(bytes) * n / (Now() - t0) / 1e9;

    t0 = Now();
    for (int i = 0; i < n; i += batch) {
      Reload(bytes, i, std::min(batch, n - i), n, reload, first, jobs);
    }
    Check(cudaStreamSynchronize(h2d_), "sync");
    *h2d = static_cast<double>(bytes) * n / (Now() - t0) / 1e9;
    WaitAll(jobs);

    t0 = Now();
    reload.flags = TIER_RELOAD_FREE_AFTER;
    for (int i = 0; i < n; i += batch) {
      Offload(bytes, i, std::min(batch, n - i), offload, second, jobs);
      Reload(bytes, i, std::min(batch, n - i), n, reload, first, jobs);
    }
    WaitAll(jobs);
    Check(cudaStreamSynchronize(h2d_), "sync");
    *both = 2.0 * static_cast<double>(bytes) * n / (Now() - t0) / 1e9;
    for (tier_object_id object : second) {
      tier_job_id job;
      Check(tier_free(session_, object, &job), "free");
      jobs.push_back(job);
    }
    WaitAll(jobs);
  }

  // Median seconds of: a bare 4 KiB H2D copy + stream sync, and the same through tier_reload;
  // a bare D2H copy + sync, and tier_offload + job wait.
  void Latency(uint64_t bytes, int n, double out[4]) {
    std::vector<double> bare_h2d, tier_h2d, bare_d2h, tier_d2h;
    tier_object_id object;
    tier_job_id job;
    Check(tier_offload(session_, buffer_, base_offset_, bytes, nullptr, &object, &job), "offload");
    Check(tier_job_wait(session_, job, -1), "offload job");
    tier_reload_options reload;
    tier_reload_options_init(&reload);
    reload.consumer_stream = h2d_;
    tier_offload_options offload;
    tier_offload_options_init(&offload);
    void* producers[] = {d2h_};
    offload.num_producer_streams = 1;
    offload.producer_streams = producers;
    for (int i = 0; i < n + 50; ++i) {  // the first 50 warm up
      double t0 = Now();
      Check(cudaMemcpyAsync(device_, host_, bytes, cudaMemcpyHostToDevice, h2d_), "h2d");
      Check(cudaStreamSynchronize(h2d_), "sync");
      double t1 = Now();
      Check(tier_reload(session_, object, buffer_, base_offset_ + bytes, bytes, &reload, &job),
            "reload");
      Check(cudaStreamSynchronize(h2d_), "sync");
      double t2 = Now();
      Check(tier_job_wait(session_, job, -1), "reload job");
      double t3 = Now();
      Check(cudaMemcpyAsync(host_, device_, bytes, cudaMemcpyDeviceToHost, d2h_), "d2h");
      Check(cudaStreamSynchronize(d2h_), "sync");
      double t4 = Now();
      tier_object_id o2;
      Check(tier_offload(session_, buffer_, base_offset_, bytes, &offload, &o2, &job), "offload");
      Check(tier_job_wait(session_, job, -1), "offload job");
      double t5 = Now();
      Check(tier_free(session_, o2, &job), "free");
      Check(tier_job_wait(session_, job, -1), "free job");
      if (i < 50) continue;
      bare_h2d.push_back(t1 - t0);
      tier_h2d.push_back(t2 - t1);
      bare_d2h.push_back(t4 - t3);
      tier_d2h.push_back(t5 - t4);
    }
    Check(tier_free(session_, object, &job), "free");
    Check(tier_job_wait(session_, job, -1), "free job");
    out[0] = Median(bare_h2d);
    out[1] = Median(tier_h2d);
    out[2] = Median(bare_d2h);
    out[3] = Median(tier_d2h);
  }

 private:
  // Offloads of slots [i, i + count) into objects[i...]: lone jobs, or one batch.
  void Offload(uint64_t bytes, int i, int count, const tier_offload_options& options,
               std::vector<tier_object_id>& objects, std::vector<tier_job_id>& jobs) {
    if (count == 1) {
      tier_job_id job;
      Check(tier_offload(session_, buffer_, base_offset_ + Slot(bytes, i), bytes, &options,
                         &objects[i], &job), "offload");
      jobs.push_back(job);
      return;
    }
    std::vector<tier_batch_job> batch = Batch(bytes, i, count);
    Check(tier_offload_batch(session_, batch.data(), batch.size(), &options), "offload batch");
    for (int k = 0; k < count; ++k) {
      objects[i + k] = batch[k].object;
      jobs.push_back(batch[k].job);
    }
  }
  // Reloads of objects[i, i + count) into slots n + i...: lone jobs, or one batch.
  void Reload(uint64_t bytes, int i, int count, int n, const tier_reload_options& options,
              const std::vector<tier_object_id>& objects, std::vector<tier_job_id>& jobs) {
    if (count == 1) {
      tier_job_id job;
      Check(tier_reload(session_, objects[i], buffer_, base_offset_ + Slot(bytes, i + n), bytes,
                        &options, &job), "reload");
      jobs.push_back(job);
      return;
    }
    std::vector<tier_batch_job> batch = Batch(bytes, i + n, count);
    for (int k = 0; k < count; ++k) batch[k].object = objects[i + k];
    Check(tier_reload_batch(session_, batch.data(), batch.size(), &options), "reload batch");
    for (int k = 0; k < count; ++k) jobs.push_back(batch[k].job);
  }

  // `count` jobs of `bytes` on slots first, first + 1, ... of the arena.
  std::vector<tier_batch_job> Batch(uint64_t bytes, int first, int count) const {
    std::vector<tier_batch_job> batch(count);
    for (int k = 0; k < count; ++k) {
      batch[k] = tier_batch_job{};
      batch[k].struct_size = sizeof(tier_batch_job);
      batch[k].buffer = buffer_;
      batch[k].offset = base_offset_ + Slot(bytes, first + k);
      batch[k].len = bytes;
    }
    return batch;
  }

  uint64_t Slot(uint64_t bytes, int i) const {
    uint64_t slots = std::max<uint64_t>(1, arena_ / bytes);
    return (static_cast<uint64_t>(i) % slots) * bytes;
  }
  void WaitAll(std::vector<tier_job_id>& jobs) {
    for (tier_job_id job : jobs) Check(tier_job_wait(session_, job, -1), "job");
    jobs.clear();
  }
  static double Median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
  }

  tier_session* session_;
  uint64_t arena_;
  void* device_ = nullptr;
  void* host_ = nullptr;
  cudaStream_t d2h_ = nullptr, h2d_ = nullptr;
  tier_buffer_id buffer_ = 0;
  uint64_t base_offset_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string socket, json_path = "gpu_bench.json", tierd_bin;
  uint64_t max_bytes = kGiB;
  int batch = 16;
  std::vector<std::string> tierd_flags;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--socket=", 0) == 0) socket = arg.substr(9);
    else if (arg.rfind("--tierd=", 0) == 0) tierd_bin = arg.substr(8);
    else if (arg.rfind("--json=", 0) == 0) json_path = arg.substr(7);
    else if (arg.rfind("--max-mib=", 0) == 0) max_bytes = std::stoull(arg.substr(10)) * kMiB;
    else if (arg.rfind("--tierd-flag=", 0) == 0) tierd_flags.push_back(arg.substr(13));
    else if (arg.rfind("--batch=", 0) == 0) batch = std::max(1, std::stoi(arg.substr(8)));
    else {
      std::fprintf(stderr,
                   "usage: %s [--socket=PATH | --tierd=BIN] [--tierd-flag=--KEY=VALUE]... "
                   "[--max-mib=N] [--batch=N] [--json=FILE]\n",
                   argv[0]);
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "no GPU: nothing to measure\n");
    return 77;
  }
  // Per size: enough bytes to reach steady state; the pool holds two sizes' worth at once.
  const uint64_t total = std::max<uint64_t>(2 * max_bytes, 2 * kGiB);
  std::unique_ptr<tier::bench::TierdProcess> daemon;
  if (socket.empty()) {
    std::vector<std::string> flags = {
        "--engine=cuda", "--pool_bytes=" + std::to_string((2 * total + kGiB) >> 20) + "M",
        "--pool_lock=best-effort"};
    flags.insert(flags.end(), tierd_flags.begin(), tierd_flags.end());
    daemon = std::make_unique<tier::bench::TierdProcess>(tierd_bin, flags);
    socket = daemon->socket();
  }
  tier_session* session = nullptr;
  Check(tier::bench::OpenSessionWhenReady(socket, "tier_gpu_bench", &session),
        "opening a session");
  tier_session_info info{};
  info.struct_size = sizeof(info);
  tier_session_get_info(session, &info);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("tier_gpu_bench on %s, daemon engine %s\n", prop.name, info.engine);

  {
    Bench bench(session, std::max<uint64_t>(max_bytes, 256 * kMiB) * 2);
    std::vector<Row> rows;
    for (uint64_t bytes = 64 * kKiB; bytes <= max_bytes; bytes *= 4) {
      int n = static_cast<int>(std::clamp<uint64_t>(total / 4 / bytes, 2, 2048));
      Row row{bytes, n, 0, 0, 0, 0, 0, 0, 0, 0, 0};
      bench.Baseline(bytes, std::min(n, 8), true, true);  // warm up
      row.base_d2h = bench.Baseline(bytes, n, true, false);
      row.base_h2d = bench.Baseline(bytes, n, false, true);
      row.base_both = bench.Baseline(bytes, n, true, true);
      bench.Daemon(bytes, n, 1, &row.tier_d2h, &row.tier_h2d, &row.tier_both);
      if (batch > 1) bench.Daemon(bytes, n, batch, &row.batch_d2h, &row.batch_h2d, &row.batch_both);
      rows.push_back(row);
    }
    double lat[4];
    bench.Latency(4 * kKiB, 1000, lat);
    // tierd's own figure for this GPU's link (what planners read, tier_link_rate), against the
    // largest row measured here through tierd.
    double link_d2h = 0, link_h2d = 0;
    if (tier_link_rate(session, 0, &link_d2h, &link_h2d) != TIER_OK) link_d2h = link_h2d = 0;
    const Row& largest = rows.back();

    std::printf("\n%10s %6s | %8s %7s %5s %7s %5s | %8s %7s %5s %7s %5s | %8s %7s %5s %7s %5s\n",
                "job", "jobs", "D2H base", "tierd", "ratio", "batch", "ratio", "H2D base", "tierd",
                "ratio", "batch", "ratio", "both base", "tierd", "ratio", "batch", "ratio");
    for (const Row& r : rows) {
      char size[32];
      if (r.bytes >= kMiB) std::snprintf(size, sizeof size, "%llu MiB", (unsigned long long)(r.bytes / kMiB));
      else std::snprintf(size, sizeof size, "%llu KiB", (unsigned long long)(r.bytes / kKiB));
      std::printf("%10s %6d", size, r.jobs);
      for (auto [base, lone, batched] : {std::tuple{r.base_d2h, r.tier_d2h, r.batch_d2h},
                                         std::tuple{r.base_h2d, r.tier_h2d, r.batch_h2d},
                                         std::tuple{r.base_both, r.tier_both, r.batch_both}}) {
        std::printf(" | %8.2f %7.2f %4.0f%% %7.2f %4.0f%%", base, lone, 100 * lone / base, batched,
                    100 * batched / base);
      }
      std::printf("\n");
    }
    std::printf("(GB/s; base = one cudaMemcpyAsync per job in this process; tierd = lone jobs; "
                "batch = tierd with batches of %d jobs; both = D2H + H2D at once)\n\n", batch);
    std::printf("4 KiB job latency, median of 1000: reload %.1f us (bare H2D copy %.1f us, added %.1f us)"
                "; offload %.1f us (bare D2H copy %.1f us, added %.1f us)\n",
                lat[1] * 1e6, lat[0] * 1e6, (lat[1] - lat[0]) * 1e6, lat[3] * 1e6, lat[2] * 1e6,
                (lat[3] - lat[2]) * 1e6);
    std::printf("tierd's link figure (tier_link_rate): D2H %.2f GB/s = %.0f%% of the %llu MiB "
                "row's tierd D2H, H2D %.2f GB/s = %.0f%% of its tierd H2D\n",
                link_d2h / 1e9, 100 * link_d2h / 1e9 / largest.tier_d2h,
                (unsigned long long)(largest.bytes / kMiB), link_h2d / 1e9,
                100 * link_h2d / 1e9 / largest.tier_h2d);

    FILE* json = std::fopen(json_path.c_str(), "w");
    if (json != nullptr) {
      std::fprintf(json, "{\"device\": \"%s\", \"engine\": \"%s\", \"batch\": %d, \"bandwidth_gbps\": [",
                   prop.name, info.engine, batch);
      for (size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        std::fprintf(json,
                     "%s{\"bytes\": %llu, \"jobs\": %d, \"d2h_base\": %.3f, \"d2h_tierd\": %.3f, "
                     "\"h2d_base\": %.3f, \"h2d_tierd\": %.3f, \"both_base\": %.3f, "
                     "\"both_tierd\": %.3f, \"d2h_batch\": %.3f, \"h2d_batch\": %.3f, "
                     "\"both_batch\": %.3f}",
                     i ? ", " : "", (unsigned long long)r.bytes, r.jobs, r.base_d2h, r.tier_d2h,
                     r.base_h2d, r.tier_h2d, r.base_both, r.tier_both, r.batch_d2h, r.batch_h2d,
                     r.batch_both);
      }
      std::fprintf(json,
                   "], \"latency_4k_us\": {\"bare_h2d\": %.2f, \"reload\": %.2f, \"bare_d2h\": %.2f, "
                   "\"offload\": %.2f}, \"tierd_link_gbps\": {\"d2h\": %.3f, \"h2d\": %.3f}}\n",
                   lat[0] * 1e6, lat[1] * 1e6, lat[2] * 1e6, lat[3] * 1e6, link_d2h / 1e9,
                   link_h2d / 1e9);
      std::fclose(json);
      std::printf("wrote %s\n", json_path.c_str());
    }
  }
  tier_session_close(session);
  daemon.reset();
  return 0;
}
