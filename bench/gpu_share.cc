// How sessions share one GPU's link through tierd (issue 18, point 2): several client processes
// offload at once, each with its own job size and queue depth, and each one's bandwidth is set
// against what it gets alone in the same run.
//
//   tier_gpu_share [--tierd=BIN] [--tierd-flag=--KEY=VALUE]... [--seconds=3] [--json=FILE]
//
// Scenarios (D2H offloads, each freed once done):
//   alone    every client kind by itself: its demand, and the link's rate for it
//   equal    4 clients of 4 MiB jobs, 4 in flight each: shares and Jain's fairness index
//   mixed    a bulk client (64 MiB jobs, 8 in flight) and a light one (1 MiB, 2 in flight): the
//            light one's rate against its max-min fair share, min(alone, half the link)
// Each client is its own process (forked before anything touches CUDA) with its own session;
// the benchmark's own process makes no CUDA or gRPC call. Prints a table and writes JSON.
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "tier/tier.h"
#include "tierd_process.h"

namespace {

constexpr uint64_t kMiB = 1024 * 1024;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    ::_exit(1);
  }
}

void Check(tier_status s, const char* what) {
  if (s != TIER_OK) {
    std::fprintf(stderr, "%s: %s: %s\n", what, tier_status_name(s), tier_last_error());
    ::_exit(1);
  }
}

struct Client {
  std::string name;
  uint64_t job_bytes;
  int depth;  // offloads in flight
};

// One client process: opens a session, registers its buffer, says it is ready, waits for the
// start time, then keeps `depth` offloads in flight for `seconds` and writes the bytes it
// completed in that window to `out`.
[[noreturn]] void RunClient(const Client& client, const std::string& socket, int ready, int go,
                            int out, double seconds) {
  Check(cudaSetDevice(0), "cudaSetDevice");
  void* device = nullptr;
  const uint64_t arena = client.job_bytes * client.depth;
  Check(cudaMalloc(&device, arena), "cudaMalloc");
  Check(cudaMemset(device, 0x5A, arena), "cudaMemset");
  Check(cudaDeviceSynchronize(), "sync");
  tier_session* session = nullptr;
  Check(tier::bench::OpenSessionWhenReady(socket, client.name.c_str(), &session),
        "opening a session");
  tier_buffer_id buffer = 0;
  uint64_t base = 0;
  Check(tier_buffer_register_device(session, device, &buffer, &base), "register");
  char byte = 1;
  if (::write(ready, &byte, 1) != 1) ::_exit(1);
  double start = 0;
  if (::read(go, &start, sizeof(start)) != sizeof(start)) ::_exit(1);
  while (Now() < start) {
  }
  const double end = start + seconds;
  struct InFlight {
    tier_job_id job;
    tier_object_id object;
  };
  std::deque<InFlight> in_flight;
  std::vector<tier_job_id> frees;
  uint64_t done_bytes = 0;
  int slot = 0;
  while (true) {
    const double now = Now();
    while (now < end && static_cast<int>(in_flight.size()) < client.depth) {
      InFlight f;
      Check(tier_offload(session, buffer, base + client.job_bytes * slot, client.job_bytes,
                         nullptr, &f.object, &f.job),
            "offload");
      slot = (slot + 1) % client.depth;
      in_flight.push_back(f);
    }
    if (in_flight.empty()) break;
    InFlight f = in_flight.front();
    in_flight.pop_front();
    Check(tier_job_wait(session, f.job, -1), "offload job");
    if (Now() <= end) done_bytes += client.job_bytes;
    tier_job_id free_job;
    Check(tier_free(session, f.object, &free_job), "free");
    frees.push_back(free_job);
    if (frees.size() >= 64) {
      for (tier_job_id job : frees) Check(tier_job_wait(session, job, -1), "free job");
      frees.clear();
    }
  }
  for (tier_job_id job : frees) Check(tier_job_wait(session, job, -1), "free job");
  tier_session_close(session);
  if (::write(out, &done_bytes, sizeof(done_bytes)) != sizeof(done_bytes)) ::_exit(1);
  ::_exit(0);
}

// Runs `clients` at once; returns each one's GB/s over the window.
std::vector<double> RunTogether(const std::vector<Client>& clients, const std::string& socket,
                                double seconds) {
  int ready[2], go[2];
  if (::pipe(ready) != 0 || ::pipe(go) != 0) std::exit(1);
  std::vector<pid_t> pids;
  std::vector<int> results;
  for (const Client& client : clients) {
    int result[2];
    if (::pipe(result) != 0) std::exit(1);
    pid_t pid = ::fork();
    if (pid == 0) RunClient(client, socket, ready[1], go[0], result[1], seconds);
    ::close(result[1]);
    pids.push_back(pid);
    results.push_back(result[0]);
  }
  for (size_t k = 0; k < clients.size(); ++k) {
    char byte;
    if (::read(ready[0], &byte, 1) != 1) std::exit(1);
  }
  const double start = Now() + 0.2;  // every client starts at the same instant
  for (size_t k = 0; k < clients.size(); ++k) {
    if (::write(go[1], &start, sizeof(start)) != sizeof(start)) std::exit(1);
  }
  std::vector<double> gbps;
  for (size_t k = 0; k < clients.size(); ++k) {
    uint64_t bytes = 0;
    if (::read(results[k], &bytes, sizeof(bytes)) != sizeof(bytes)) {
      std::fprintf(stderr, "client %s failed\n", clients[k].name.c_str());
      std::exit(1);
    }
    ::close(results[k]);
    gbps.push_back(static_cast<double>(bytes) / seconds / 1e9);
  }
  for (pid_t p : pids) {
    int status = 0;
    ::waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) std::exit(1);
  }
  for (int fd : {ready[0], ready[1], go[0], go[1]}) ::close(fd);
  return gbps;
}

// Jain's index: 1 when every share is equal, 1/n when one takes everything.
double Jain(const std::vector<double>& x) {
  double sum = 0, squares = 0;
  for (double v : x) {
    sum += v;
    squares += v * v;
  }
  return squares > 0 ? sum * sum / (x.size() * squares) : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tierd_bin, json_path = "gpu_share.json";
  std::vector<std::string> tierd_flags;
  double seconds = 3;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--tierd=", 0) == 0) tierd_bin = arg.substr(8);
    else if (arg.rfind("--tierd-flag=", 0) == 0) tierd_flags.push_back(arg.substr(13));
    else if (arg.rfind("--seconds=", 0) == 0) seconds = std::max(0.5, std::stod(arg.substr(10)));
    else if (arg.rfind("--json=", 0) == 0) json_path = arg.substr(7);
    else {
      std::fprintf(stderr,
                   "usage: %s [--tierd=BIN] [--tierd-flag=--KEY=VALUE]... [--seconds=S] "
                   "[--json=FILE]\n",
                   argv[0]);
      return 2;
    }
  }
  // No CUDA call here: the client processes fork from this one.
  if (::access("/dev/nvidiactl", F_OK) != 0) {
    std::fprintf(stderr, "no GPU: nothing to measure\n");
    return 77;
  }
  std::vector<std::string> flags = {"--engine=cuda", "--pool_bytes=4096M",
                                    "--pool_lock=best-effort"};
  flags.insert(flags.end(), tierd_flags.begin(), tierd_flags.end());
  tier::bench::TierdProcess daemon(tierd_bin, flags);

  const Client bulk{"bulk-64MiB-x8", 64 * kMiB, 8};
  const Client light{"light-1MiB-x2", 1 * kMiB, 2};
  const Client even{"even-4MiB-x4", 4 * kMiB, 4};
  RunTogether({even}, daemon.socket(), 1.0);  // warm up: pool, streams, mappings

  const double bulk_alone = RunTogether({bulk}, daemon.socket(), seconds)[0];
  const double light_alone = RunTogether({light}, daemon.socket(), seconds)[0];
  const double even_alone = RunTogether({even}, daemon.socket(), seconds)[0];
  std::vector<double> equal = RunTogether({even, even, even, even}, daemon.socket(), seconds);
  std::vector<double> mixed = RunTogether({bulk, light}, daemon.socket(), seconds);

  double equal_sum = 0;
  for (double v : equal) equal_sum += v;
  const double mixed_sum = mixed[0] + mixed[1];
  const double light_fair = std::min(light_alone, mixed_sum / 2);

  std::printf("tier_gpu_share: D2H offloads, %.1f s per scenario (GB/s)\n\n", seconds);
  std::printf("%-8s %-16s %8s %8s\n", "scenario", "client", "GB/s", "alone");
  std::printf("%-8s %-16s %8.2f %8s\n", "alone", bulk.name.c_str(), bulk_alone, "-");
  std::printf("%-8s %-16s %8.2f %8s\n", "alone", light.name.c_str(), light_alone, "-");
  std::printf("%-8s %-16s %8.2f %8s\n", "alone", even.name.c_str(), even_alone, "-");
  for (size_t i = 0; i < equal.size(); ++i) {
    std::printf("%-8s %-14s#%zu %8.2f %8.2f\n", "equal", even.name.c_str(), i, equal[i],
                even_alone);
  }
  std::printf("%-8s %-16s %8.2f %8.2f\n", "mixed", bulk.name.c_str(), mixed[0], bulk_alone);
  std::printf("%-8s %-16s %8.2f %8.2f\n", "mixed", light.name.c_str(), mixed[1], light_alone);
  std::printf("\nequal: sum %.2f GB/s (%.0f%% of one client alone), Jain's index %.3f\n",
              equal_sum, 100 * equal_sum / even_alone, Jain(equal));
  std::printf("mixed: light client %.2f GB/s = %.0f%% of its max-min fair share %.2f "
              "(min(alone, half of the %.2f GB/s used))\n",
              mixed[1], 100 * mixed[1] / light_fair, light_fair, mixed_sum);

  if (FILE* json = std::fopen(json_path.c_str(), "w")) {
    std::fprintf(json,
                 "{\"seconds\": %.2f, \"alone\": {\"bulk\": %.3f, \"light\": %.3f, \"even\": %.3f}, "
                 "\"equal\": [%.3f, %.3f, %.3f, %.3f], \"equal_jain\": %.4f, "
                 "\"mixed\": {\"bulk\": %.3f, \"light\": %.3f}, \"light_fair_share\": %.3f}\n",
                 seconds, bulk_alone, light_alone, even_alone, equal[0], equal[1], equal[2],
                 equal[3], Jain(equal), mixed[0], mixed[1], light_fair);
    std::fclose(json);
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}
