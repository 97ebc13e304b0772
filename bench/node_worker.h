// One GPU's worker process for tier_gpu_node (bench/gpu_node.cc): forked before the parent
// touches CUDA, it owns one GPU (device memory, pinned host memory for the same-process baseline,
// its own tierd session) and runs the parent's commands one at a time:
//   stream   keep `depth` jobs of `job_bytes` in flight per direction (D2H, H2D or both, one
//            thread per direction) from `start` for `seconds` or until Stop(), through tierd
//            (tier_offload / tier_reload, lone jobs) or the baseline (cudaMemcpyAsync between its
//            device memory and pinned host memory, one stream per direction); GB/s each way
//   latency  lone small jobs one after the other for `seconds`: offload + job wait, reload + the
//            consumer stream's sync (tierd), or a bare copy + sync (baseline); median and p90
//   stall    a tierd client that never raises its tickets: `depth` offloads whose producer
//            stream and `depth` reloads whose consumer stream are held by a host function until
//            Stop(); tierd's lanes for this GPU wait for tickets meanwhile. Then everything is
//            released, completed and freed.
// Every participant of a measurement is told the same `start` (steady clock: one clock for every
// process of the machine), so they copy at once.
#ifndef TIER_BENCH_NODE_WORKER_H_
#define TIER_BENCH_NODE_WORKER_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>

namespace tier::bench {

double Now();  // steady clock, seconds

enum class Op : int32_t { kStream = 1, kLatency = 2, kStall = 3, kQuit = 4 };
enum class CopyPath : int32_t { kBaseline = 1, kTierd = 2 };
enum Directions : int32_t { kD2H = 1, kH2D = 2, kBoth = 3 };

struct Command {
  Op op = Op::kStream;
  CopyPath path = CopyPath::kTierd;
  int32_t directions = kBoth;
  int32_t depth = 4;
  uint64_t job_bytes = 0;
  double start = 0;    // steady clock
  double seconds = 0;  // <= 0: until Stop()
};

struct Result {
  int32_t ok = 0;
  double d2h_gbps = 0, h2d_gbps = 0;         // stream
  double offload_us = 0, reload_us = 0;      // latency: medians (baseline: bare D2H / H2D copy)
  double offload_p90_us = 0, reload_p90_us = 0;
  uint64_t samples = 0;                      // latency: round trips measured
  char error[240] = {};
};

struct WorkerOptions {
  int gpu = 0;
  std::string socket;       // tierd's control socket
  std::string name;         // the session's name
  uint64_t arena_bytes = 0;  // device (and pinned host) bytes per direction
};

// The parent's handle on one worker process. Fork() before this process makes any CUDA call.
class WorkerProcess {
 public:
  explicit WorkerProcess(const WorkerOptions& options);  // forks; the child never returns
  ~WorkerProcess();                                      // kQuit, then waits for the child
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  void Send(const Command& command);
  // The result of the oldest command sent; ok = 0 with an error when the worker failed or died.
  Result Receive();
  Result Run(const Command& command) {
    Send(command);
    return Receive();
  }
  // Ends a command that runs until stopped (seconds <= 0), and any stream or stall early.
  void Stop() { shared_->stop.store(1, std::memory_order_release); }
  int gpu() const { return gpu_; }
  pid_t pid() const { return pid_; }

  // Shared with the child (a MAP_SHARED page made before the fork).
  struct Shared {
    std::atomic<int> stop{0};
  };

 private:
  int gpu_;
  pid_t pid_ = -1;
  int command_fd_ = -1, result_fd_ = -1;
  Shared* shared_ = nullptr;
};

}  // namespace tier::bench

#endif  // TIER_BENCH_NODE_WORKER_H_
