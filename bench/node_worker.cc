#include "node_worker.h"

#include <cuda_runtime_api.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tier/tier.h"
#include "tierd_process.h"

namespace tier::bench {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {

constexpr int64_t kJobWaitMs = 60000;  // a job not done in a minute fails the command

// A failed call in the worker: the command fails with this message (the worker goes on).
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void Fail(const char* format, ...) {
  char message[240];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof message, format, args);
  va_end(args);
  throw Failure(message);
}

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Fail("%s: %s", what, cudaGetErrorString(e));
}

void Check(tier_status s, const char* what) {
  if (s != TIER_OK) Fail("%s: %s: %s", what, tier_status_name(s), tier_last_error());
}

void SleepUntil(double t) {
  const double left = t - Now();
  if (left > 0.002) std::this_thread::sleep_for(std::chrono::duration<double>(left - 0.001));
  while (Now() < t) {
  }
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

// What one direction's loop reports: bytes of the jobs that completed in the window, and the
// time from the start to the last of them.
struct Moved {
  uint64_t bytes = 0;
  double seconds = 0;
  double gbps() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};

// Blocks the CUDA host-function thread until *flag is set: a stream with this queued does not
// reach what follows (the stall command's producer and consumer streams).
void HoldUntilSet(void* flag) {
  auto* set = static_cast<std::atomic<int>*>(flag);
  while (set->load(std::memory_order_acquire) == 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

class Worker {
 public:
  Worker(const WorkerOptions& options, WorkerProcess::Shared* shared)
      : options_(options), shared_(shared), arena_(options.arena_bytes) {
    Check(cudaSetDevice(options.gpu), "cudaSetDevice");
    Check(cudaMalloc(&device_, 2 * arena_), "cudaMalloc");
    Check(cudaMemset(device_, 0x5A, 2 * arena_), "cudaMemset");
    Check(cudaHostAlloc(&host_, 2 * arena_, cudaHostAllocDefault), "cudaHostAlloc");
    std::memset(host_, 0x5A, 2 * arena_);
    for (cudaStream_t* s : {&base_d2h_, &base_h2d_, &producer_, &stall_producer_,
                            &stall_consumer_, &latency_consumer_}) {
      Check(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking), "cudaStreamCreate");
    }
    Check(cudaDeviceSynchronize(), "sync");
    Check(OpenSessionWhenReady(options.socket, options.name.c_str(), &session_),
          "opening a session");
    Check(tier_buffer_register_device(session_, device_, &buffer_, &base_), "register");
  }
  ~Worker() {
    if (session_ != nullptr) tier_session_close(session_);
  }

  Result Execute(const Command& c) {
    Result r;
    switch (c.op) {
      case Op::kStream:
        Stream(c, &r);
        break;
      case Op::kLatency:
        Latency(c, &r);
        break;
      case Op::kStall:
        Stall(c, &r);
        break;
      case Op::kQuit:
        break;
    }
    r.ok = 1;
    return r;
  }

 private:
  bool Stopped() const { return shared_->stop.load(std::memory_order_acquire) != 0; }
  double End(const Command& c) const { return c.seconds > 0 ? c.start + c.seconds : 1e300; }
  // Device and host bytes of the D2H side (sources) and the H2D side (destinations).
  char* Device(Directions side) const { return static_cast<char*>(device_) + (side == kH2D ? arena_ : 0); }
  char* Host(Directions side) const { return static_cast<char*>(host_) + (side == kH2D ? arena_ : 0); }
  uint64_t Offset(Directions side) const { return base_ + (side == kH2D ? arena_ : 0); }

  void CheckFits(const Command& c) const {
    if (c.job_bytes == 0 || c.depth < 1 || c.job_bytes * c.depth > arena_) {
      Fail("%d jobs of %llu bytes do not fit the %llu-byte arena", c.depth,
           static_cast<unsigned long long>(c.job_bytes), static_cast<unsigned long long>(arena_));
    }
  }

  void Stream(const Command& c, Result* r) {
    CheckFits(c);
    std::vector<tier_object_id> objects;
    if (c.path == CopyPath::kTierd && (c.directions & kH2D)) {
      objects = Preload(c);
      while (static_cast<int>(slot_consumers_.size()) < c.depth) {
        cudaStream_t s;
        Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
        slot_consumers_.push_back(s);
      }
    }
    Moved d2h, h2d;
    std::string d2h_error, h2d_error;  // one per thread
    auto run = [&](Directions d, Moved* out, std::string* error) {
      try {
        // The current device is per thread: the second thread's would be GPU 0.
        Check(cudaSetDevice(options_.gpu), "cudaSetDevice");
        *out = c.path == CopyPath::kBaseline ? BaselineLoop(c, d) : TierdLoop(c, d, objects);
      } catch (const Failure& f) {
        *error = f.what();
      }
    };
    std::thread second;
    if (c.directions == kBoth) second = std::thread(run, kH2D, &h2d, &h2d_error);
    if (c.directions & kD2H) run(kD2H, &d2h, &d2h_error);
    else run(kH2D, &h2d, &h2d_error);
    if (second.joinable()) second.join();
    FreeAll(objects);
    if (!d2h_error.empty() || !h2d_error.empty()) {
      Fail("%s", (d2h_error.empty() ? h2d_error : d2h_error).c_str());
    }
    r->d2h_gbps = d2h.gbps();
    r->h2d_gbps = h2d.gbps();
  }

  // One object per slot of the H2D side for the reloads to copy (offloaded before the start).
  std::vector<tier_object_id> Preload(const Command& c) {
    std::vector<tier_object_id> objects(c.depth);
    std::vector<tier_job_id> jobs(c.depth);
    tier_offload_options offload = OffloadOptions(&producer_);
    for (int k = 0; k < c.depth; ++k) {
      Check(tier_offload(session_, buffer_, Offset(kD2H) + k * c.job_bytes, c.job_bytes, &offload,
                         &objects[k], &jobs[k]), "preload offload");
    }
    for (tier_job_id job : jobs) Check(tier_job_wait(session_, job, kJobWaitMs), "preload job");
    return objects;
  }

  void FreeAll(const std::vector<tier_object_id>& objects) {
    std::vector<tier_job_id> jobs(objects.size());
    for (size_t k = 0; k < objects.size(); ++k) Check(tier_free(session_, objects[k], &jobs[k]), "free");
    for (tier_job_id job : jobs) Check(tier_job_wait(session_, job, kJobWaitMs), "free job");
  }

  static tier_offload_options OffloadOptions(cudaStream_t* producer) {
    tier_offload_options o;
    tier_offload_options_init(&o);
    o.num_producer_streams = 1;
    o.producer_streams = reinterpret_cast<void* const*>(producer);
    return o;
  }

  // cudaMemcpyAsync of slot k (k = sequence % depth) on the direction's stream, an event after
  // each; a slot is copied again once its previous copy's event completed.
  Moved BaselineLoop(const Command& c, Directions d) {
    cudaStream_t stream = d == kD2H ? base_d2h_ : base_h2d_;
    std::vector<cudaEvent_t> events(c.depth);
    for (cudaEvent_t& e : events) {
      Check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    }
    Moved moved;
    std::deque<int> in_flight;
    const double end = End(c);
    uint64_t next = 0;
    SleepUntil(c.start);
    const double start = Now();
    while (true) {
      while (Now() < end && !Stopped() && static_cast<int>(in_flight.size()) < c.depth) {
        const int k = static_cast<int>(next++ % c.depth);
        char* dev = Device(d) + k * c.job_bytes;
        char* host = Host(d) + k * c.job_bytes;
        Check(d == kD2H ? cudaMemcpyAsync(host, dev, c.job_bytes, cudaMemcpyDeviceToHost, stream)
                        : cudaMemcpyAsync(dev, host, c.job_bytes, cudaMemcpyHostToDevice, stream),
              "cudaMemcpyAsync");
        Check(cudaEventRecord(events[k], stream), "cudaEventRecord");
        in_flight.push_back(k);
      }
      if (in_flight.empty()) break;
      Check(cudaEventSynchronize(events[in_flight.front()]), "cudaEventSynchronize");
      in_flight.pop_front();
      const double t = Now();
      if (t <= end && !Stopped()) {
        moved.bytes += c.job_bytes;
        moved.seconds = t - start;
      }
    }
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    return moved;
  }

  // Lone tierd jobs: D2H offloads of slot k (each object freed once its offload completed), or
  // H2D reloads of objects[k] into slot k, each slot's reload on its own consumer stream (one
  // consumer stream would chain every reload's ticket behind the previous reload's completion).
  Moved TierdLoop(const Command& c, Directions d, const std::vector<tier_object_id>& objects) {
    tier_offload_options offload = OffloadOptions(&producer_);
    struct InFlight {
      tier_job_id job;
      tier_object_id object;
      int slot;
    };
    std::deque<InFlight> in_flight;
    std::vector<tier_job_id> frees;
    Moved moved;
    const double end = End(c);
    uint64_t next = 0;
    SleepUntil(c.start);
    const double start = Now();
    while (true) {
      while (Now() < end && !Stopped() && static_cast<int>(in_flight.size()) < c.depth) {
        InFlight f{0, 0, static_cast<int>(next++ % c.depth)};
        const uint64_t at = Offset(d) + f.slot * c.job_bytes;
        if (d == kD2H) {
          Check(tier_offload(session_, buffer_, at, c.job_bytes, &offload, &f.object, &f.job),
                "offload");
        } else {
          tier_reload_options reload;
          tier_reload_options_init(&reload);
          reload.consumer_stream = slot_consumers_[f.slot];
          Check(tier_reload(session_, objects[f.slot], buffer_, at, c.job_bytes, &reload, &f.job),
                "reload");
        }
        in_flight.push_back(f);
      }
      if (in_flight.empty()) break;
      InFlight f = in_flight.front();
      in_flight.pop_front();
      Check(tier_job_wait(session_, f.job, kJobWaitMs), d == kD2H ? "offload job" : "reload job");
      const double t = Now();
      if (t <= end && !Stopped()) {
        moved.bytes += c.job_bytes;
        moved.seconds = t - start;
      }
      if (d == kD2H) {
        tier_job_id free_job;
        Check(tier_free(session_, f.object, &free_job), "free");
        frees.push_back(free_job);
        if (frees.size() >= 64) {
          for (tier_job_id job : frees) Check(tier_job_wait(session_, job, kJobWaitMs), "free job");
          frees.clear();
        }
      }
    }
    for (tier_job_id job : frees) Check(tier_job_wait(session_, job, kJobWaitMs), "free job");
    return moved;
  }

  // Lone jobs of c.job_bytes one after the other until the window ends: tierd reload (+ the
  // consumer's sync: when the data is usable) and offload (+ its job wait), or the same bare
  // copies (+ stream sync).
  void Latency(const Command& c, Result* r) {
    if (c.job_bytes == 0 || c.job_bytes > arena_) Fail("latency jobs of %llu bytes", static_cast<unsigned long long>(c.job_bytes));
    std::vector<double> offload_s, reload_s;
    tier_object_id object = 0;
    tier_job_id job = 0;
    tier_offload_options offload = OffloadOptions(&producer_);
    tier_reload_options reload;
    tier_reload_options_init(&reload);
    reload.consumer_stream = latency_consumer_;
    const bool tierd = c.path == CopyPath::kTierd;
    if (tierd) {
      Check(tier_offload(session_, buffer_, Offset(kD2H), c.job_bytes, &offload, &object, &job),
            "offload");
      Check(tier_job_wait(session_, job, kJobWaitMs), "offload job");
    }
    const double end = End(c);
    SleepUntil(c.start);
    while (Now() < end && !Stopped()) {
      double t0 = Now();
      if (tierd) {
        Check(tier_reload(session_, object, buffer_, Offset(kH2D), c.job_bytes, &reload, &job),
              "reload");
        Check(cudaStreamSynchronize(latency_consumer_), "sync");
      } else {
        Check(cudaMemcpyAsync(Device(kH2D), Host(kH2D), c.job_bytes, cudaMemcpyHostToDevice,
                              latency_consumer_), "cudaMemcpyAsync");
        Check(cudaStreamSynchronize(latency_consumer_), "sync");
      }
      double t1 = Now();
      if (tierd) Check(tier_job_wait(session_, job, kJobWaitMs), "reload job");
      double t2 = Now();
      tier_object_id second = 0;
      if (tierd) {
        Check(tier_offload(session_, buffer_, Offset(kD2H), c.job_bytes, &offload, &second, &job),
              "offload");
        Check(tier_job_wait(session_, job, kJobWaitMs), "offload job");
      } else {
        Check(cudaMemcpyAsync(Host(kD2H), Device(kD2H), c.job_bytes, cudaMemcpyDeviceToHost,
                              base_d2h_), "cudaMemcpyAsync");
        Check(cudaStreamSynchronize(base_d2h_), "sync");
      }
      double t3 = Now();
      if (tierd) {
        Check(tier_free(session_, second, &job), "free");
        Check(tier_job_wait(session_, job, kJobWaitMs), "free job");
      }
      reload_s.push_back(t1 - t0);
      offload_s.push_back(t3 - t2);
    }
    if (tierd) FreeAll({object});
    r->samples = reload_s.size();
    r->reload_us = Quantile(reload_s, 0.5) * 1e6;
    r->reload_p90_us = Quantile(reload_s, 0.9) * 1e6;
    r->offload_us = Quantile(offload_s, 0.5) * 1e6;
    r->offload_p90_us = Quantile(offload_s, 0.9) * 1e6;
  }

  // Jobs whose tickets never come until Stop(): tierd holds them in this GPU's lanes, waiting.
  void Stall(const Command& c, Result* r) {
    CheckFits(c);
    std::vector<tier_object_id> objects = Preload(c);
    // A member, not a local: a host function may still read it after a failure left this call.
    std::atomic<int>& release = stall_release_;
    release.store(0, std::memory_order_release);
    Check(cudaLaunchHostFunc(stall_producer_, HoldUntilSet, &release), "cudaLaunchHostFunc");
    Check(cudaLaunchHostFunc(stall_consumer_, HoldUntilSet, &release), "cudaLaunchHostFunc");
    tier_offload_options offload = OffloadOptions(&stall_producer_);
    tier_reload_options reload;
    tier_reload_options_init(&reload);
    reload.consumer_stream = stall_consumer_;
    std::vector<tier_job_id> jobs;
    std::vector<tier_object_id> offloaded(c.depth);
    std::string error;
    try {
      for (int k = 0; k < c.depth; ++k) {
        tier_job_id job;
        Check(tier_offload(session_, buffer_, Offset(kD2H) + k * c.job_bytes, c.job_bytes,
                           &offload, &offloaded[k], &job), "stalled offload");
        jobs.push_back(job);
        Check(tier_reload(session_, objects[k], buffer_, Offset(kH2D) + k * c.job_bytes,
                          c.job_bytes, &reload, &job), "stalled reload");
        jobs.push_back(job);
      }
    } catch (const Failure& f) {
      error = f.what();
    }
    const double end = End(c);
    while (error.empty() && Now() < end && !Stopped()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    // Nothing may have completed while held: the jobs really waited for their tickets.
    size_t done_early = 0;
    for (tier_job_id job : jobs) done_early += tier_job_wait(session_, job, 0) == TIER_OK;
    release.store(1, std::memory_order_release);
    if (!error.empty()) Fail("%s", error.c_str());
    if (done_early > 0) Fail("%zu stalled jobs completed before their tickets were released", done_early);
    for (tier_job_id job : jobs) Check(tier_job_wait(session_, job, kJobWaitMs), "stalled job");
    Check(cudaStreamSynchronize(stall_consumer_), "sync");
    FreeAll(objects);
    FreeAll(offloaded);
    r->samples = jobs.size();
  }

  WorkerOptions options_;
  WorkerProcess::Shared* shared_;
  uint64_t arena_;
  void* device_ = nullptr;
  void* host_ = nullptr;
  cudaStream_t base_d2h_ = nullptr, base_h2d_ = nullptr, producer_ = nullptr;
  cudaStream_t stall_producer_ = nullptr, stall_consumer_ = nullptr, latency_consumer_ = nullptr;
  std::vector<cudaStream_t> slot_consumers_;
  std::atomic<int> stall_release_{1};
  tier_session* session_ = nullptr;
  tier_buffer_id buffer_ = 0;
  uint64_t base_ = 0;
};

bool ReadAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t got = ::read(fd, p, n);
    if (got <= 0) return false;
    p += got;
    n -= got;
  }
  return true;
}

bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t put = ::write(fd, p, n);
    if (put <= 0) return false;
    p += put;
    n -= put;
  }
  return true;
}

// The child: a ready result (or the set-up error), then one result per command until kQuit.
[[noreturn]] void RunWorker(const WorkerOptions& options, WorkerProcess::Shared* shared,
                            int command_fd, int result_fd) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the benchmark
  std::unique_ptr<Worker> worker;
  Result ready;
  try {
    worker = std::make_unique<Worker>(options, shared);
    ready.ok = 1;
  } catch (const Failure& f) {
    std::snprintf(ready.error, sizeof ready.error, "GPU %d: %s", options.gpu, f.what());
  }
  if (!WriteAll(result_fd, &ready, sizeof ready) || !ready.ok) ::_exit(1);
  Command c;
  while (ReadAll(command_fd, &c, sizeof c) && c.op != Op::kQuit) {
    Result r;
    try {
      r = worker->Execute(c);
    } catch (const Failure& f) {
      r = Result{};
      std::snprintf(r.error, sizeof r.error, "GPU %d: %s", options.gpu, f.what());
    }
    if (!WriteAll(result_fd, &r, sizeof r)) break;
  }
  worker.reset();
  ::_exit(0);
}

}  // namespace

WorkerProcess::WorkerProcess(const WorkerOptions& options) : gpu_(options.gpu) {
  void* page = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                      -1, 0);
  if (page == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  shared_ = new (page) Shared();
  int commands[2], results[2];
  if (::pipe(commands) != 0 || ::pipe(results) != 0) {
    std::perror("pipe");
    std::exit(1);
  }
  std::fflush(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) {
    std::perror("fork");
    std::exit(1);
  }
  if (pid_ == 0) {
    ::close(commands[1]);
    ::close(results[0]);
    RunWorker(options, shared_, commands[0], results[1]);
  }
  ::close(commands[0]);
  ::close(results[1]);
  command_fd_ = commands[1];
  result_fd_ = results[0];
}

WorkerProcess::~WorkerProcess() {
  Command quit;
  quit.op = Op::kQuit;
  WriteAll(command_fd_, &quit, sizeof quit);
  ::close(command_fd_);
  ::close(result_fd_);
  if (pid_ > 0) ::waitpid(pid_, nullptr, 0);
  ::munmap(shared_, sizeof(Shared));
}

void WorkerProcess::Send(const Command& command) {
  shared_->stop.store(0, std::memory_order_release);
  if (!WriteAll(command_fd_, &command, sizeof command)) {
    std::fprintf(stderr, "GPU %d: the worker process is gone\n", gpu_);
  }
}

Result WorkerProcess::Receive() {
  Result r;
  if (!ReadAll(result_fd_, &r, sizeof r)) {
    r = Result{};
    std::snprintf(r.error, sizeof r.error, "GPU %d: the worker process died", gpu_);
  }
  return r;
}

}  // namespace tier::bench
