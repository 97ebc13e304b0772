// Does one GPU's flood of copy calls slow another GPU's lone copy through the GPU runtime itself
// when both are driven from one process (issue 26, item 3)? tierd drives every GPU from one
// process (a worker thread per GPU); tier_gpu_node's baseline drives each GPU from a process of
// its own. This probe times a lone 4 KiB copy on GPU 1 (cudaMemcpyAsync + cudaStreamSynchronize,
// spinning) while GPU 0 is
//   alone         idle
//   same process  flooded with 256 KiB copies (both directions, 32 in flight) by another thread
//                 of the timing process, as tierd's workers share one process
//   other process flooded the same way by another process, as tier_gpu_node's baseline
// The difference between the last two is what sharing one process (the runtime's and driver's
// process-wide locks) costs another GPU's job; tierd cannot remove it except by fewer calls.
//
//   tier_gpu_driver_share [--seconds=1.5] [--timeout=120]
// Needs 2 GPUs; prints a table; exit 0 when every mode ran, 1 on a failure, 3 on --timeout.
#include <cuda_runtime_api.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kLoneBytes = 4096;
constexpr size_t kFloodBytes = 256 << 10;
constexpr int kFloodDepth = 32;

struct Figures {
  double median_us = 0, p90_us = 0;
  double flood_gbps = 0;  // what the flood moved, both directions (its own process's, if any)
  int ok = 0;
};

[[noreturn]] void Fail(const char* what, cudaError_t e) {
  std::fprintf(stderr, "tier_gpu_driver_share: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}
void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Fail(what, e);
}

// 256 KiB copies on GPU 0, both directions, kFloodDepth in flight each, until `stop`; bytes/s.
double Flood(const std::atomic<bool>& stop) {
  Check(cudaSetDevice(0), "cudaSetDevice(0)");
  (void)cudaSetDeviceFlags(cudaDeviceScheduleSpin);  // (auto spins too with cores to spare)
  void* dev = nullptr;
  void* host = nullptr;
  Check(cudaMalloc(&dev, 2 * kFloodDepth * kFloodBytes), "cudaMalloc");
  Check(cudaMallocHost(&host, 2 * kFloodDepth * kFloodBytes), "cudaMallocHost");
  cudaStream_t streams[2];
  std::vector<cudaEvent_t> events[2];
  std::deque<int> in_flight[2];
  for (int d = 0; d < 2; ++d) {
    Check(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking), "cudaStreamCreate");
    events[d].resize(kFloodDepth);
    for (cudaEvent_t& e : events[d]) {
      Check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    }
  }
  uint64_t bytes = 0, next[2] = {0, 0};
  const auto start = Clock::now();
  while (!stop.load()) {
    for (int d = 0; d < 2; ++d) {
      while (static_cast<int>(in_flight[d].size()) < kFloodDepth) {
        const int k = static_cast<int>(next[d]++ % kFloodDepth);
        char* dp = static_cast<char*>(dev) + (d * kFloodDepth + k) * kFloodBytes;
        char* hp = static_cast<char*>(host) + (d * kFloodDepth + k) * kFloodBytes;
        Check(d == 0 ? cudaMemcpyAsync(hp, dp, kFloodBytes, cudaMemcpyDeviceToHost, streams[d])
                     : cudaMemcpyAsync(dp, hp, kFloodBytes, cudaMemcpyHostToDevice, streams[d]),
              "flood cudaMemcpyAsync");
        Check(cudaEventRecord(events[d][k], streams[d]), "cudaEventRecord");
        in_flight[d].push_back(k);
      }
      // Reap what finished (a query, as a polling worker would; no blocking wait).
      while (!in_flight[d].empty() &&
             cudaEventQuery(events[d][in_flight[d].front()]) == cudaSuccess) {
        in_flight[d].pop_front();
        bytes += kFloodBytes;
      }
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (int d = 0; d < 2; ++d) Check(cudaStreamSynchronize(streams[d]), "flood sync");
  return bytes / seconds;
}

// Lone 4 KiB D2H copies on GPU 1 for `seconds`: median and p90 in microseconds.
Figures Lone(double seconds) {
  Check(cudaSetDevice(1), "cudaSetDevice(1)");
  (void)cudaSetDeviceFlags(cudaDeviceScheduleSpin);
  void* dev = nullptr;
  void* host = nullptr;
  Check(cudaMalloc(&dev, kLoneBytes), "cudaMalloc");
  Check(cudaMallocHost(&host, kLoneBytes), "cudaMallocHost");
  cudaStream_t stream;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  for (int i = 0; i < 100; ++i) {  // warm up
    Check(cudaMemcpyAsync(host, dev, kLoneBytes, cudaMemcpyDeviceToHost, stream), "warm-up copy");
    Check(cudaStreamSynchronize(stream), "warm-up sync");
  }
  std::vector<double> us;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    const auto t0 = Clock::now();
    Check(cudaMemcpyAsync(host, dev, kLoneBytes, cudaMemcpyDeviceToHost, stream), "lone copy");
    Check(cudaStreamSynchronize(stream), "lone sync");
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    const auto next = Clock::now() + std::chrono::microseconds(50);  // lone: jobs apart
    while (Clock::now() < next) {
    }
  }
  std::sort(us.begin(), us.end());
  Figures f;
  f.median_us = us[us.size() / 2];
  f.p90_us = us[us.size() * 9 / 10];
  f.ok = 1;
  return f;
}

// Runs `body` in a child process (CUDA initialized there only) and reads its Figures back.
template <typename Body>
pid_t Child(Body body, int* read_fd) {
  int fds[2];
  if (::pipe(fds) != 0) std::exit(1);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::close(fds[0]);
    Figures f = body();
    (void)!::write(fds[1], &f, sizeof f);
    ::_exit(0);
  }
  ::close(fds[1]);
  *read_fd = fds[0];
  return pid;
}

Figures Collect(pid_t pid, int fd) {
  Figures f;
  if (::read(fd, &f, sizeof f) != sizeof f) f.ok = 0;
  ::close(fd);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 1.5;
  int timeout_s = 120;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--seconds=", 0) == 0) seconds = std::max(0.1, std::atof(a.c_str() + 10));
    else if (a.rfind("--timeout=", 0) == 0) timeout_s = std::max(10, std::atoi(a.c_str() + 10));
    else {
      std::fprintf(stderr, "usage: %s [--seconds=S] [--timeout=S]\n", argv[0]);
      return 2;
    }
  }
  ::signal(SIGALRM, [](int) {
    const char msg[] = "tier_gpu_driver_share: --timeout passed\n";
    (void)!::write(2, msg, sizeof msg - 1);
    ::_exit(3);
  });
  ::alarm(timeout_s);
  int fd = -1;
  pid_t probe = Child([] {
    Figures f;
    int n = 0;
    f.ok = cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
    return f;
  }, &fd);
  const int gpus = Collect(probe, fd).ok;
  if (gpus < 2) {
    std::printf("tier_gpu_driver_share: needs 2 GPUs (this machine shows %d): skipped\n", gpus);
    return 0;
  }
  std::printf("GPU 1: lone %zu-byte D2H copies (cudaMemcpyAsync + cudaStreamSynchronize, spin), "
              "%.1f s each\n", kLoneBytes, seconds);
  std::printf("%-14s | %10s %10s | %14s\n", "GPU 0", "median us", "p90 us", "flood GB/s");
  Figures rows[3];
  // alone
  pid_t pid = Child([seconds] { return Lone(seconds); }, &fd);
  rows[0] = Collect(pid, fd);
  // same process: the flood on another thread of the timing process
  pid = Child([seconds] {
    std::atomic<bool> stop{false};
    double flood = 0;
    std::thread t([&] { flood = Flood(stop); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the flood's steady state
    Figures f = Lone(seconds);
    stop = true;
    t.join();
    f.flood_gbps = flood / 1e9;
    return f;
  }, &fd);
  rows[1] = Collect(pid, fd);
  // other process: the flood in a process of its own
  // (It floods until this process closes `go`: after the timing process is done.)
  int go[2];
  if (::pipe(go) != 0) return 1;
  int flood_fd = -1;
  pid_t flood_pid = Child([&go] {
    ::close(go[1]);
    std::atomic<bool> stop{false};
    std::thread until([&] {
      char c;
      while (::read(go[0], &c, 1) > 0) {
      }
      stop = true;
    });
    Figures f;
    f.flood_gbps = Flood(stop) / 1e9;
    until.join();
    f.ok = 1;
    return f;
  }, &flood_fd);
  pid = Child([seconds, &go] {
    ::close(go[1]);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the flood's process starts
    return Lone(seconds);
  }, &fd);
  rows[2] = Collect(pid, fd);
  ::close(go[1]);
  ::close(go[0]);
  rows[2].flood_gbps = Collect(flood_pid, flood_fd).flood_gbps;
  const char* names[3] = {"alone", "same process", "other process"};
  bool ok = true;
  for (int i = 0; i < 3; ++i) {
    ok = ok && rows[i].ok;
    std::printf("%-14s | %10.2f %10.2f | %14.1f\n", names[i], rows[i].median_us, rows[i].p90_us,
                rows[i].flood_gbps);
  }
  if (ok && rows[0].median_us > 0) {
    std::printf("GPU 0's flood adds to GPU 1's lone copy: %+.1f%% from another process, %+.1f%% "
                "from the same process (the runtime's share: %+.1f points)\n",
                100 * (rows[2].median_us / rows[0].median_us - 1),
                100 * (rows[1].median_us / rows[0].median_us - 1),
                100 * (rows[1].median_us - rows[2].median_us) / rows[0].median_us);
  }
  return ok ? 0 : 1;
}
