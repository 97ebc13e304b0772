// Does a second process's stream work slow a trainer's kernels on the same GPU (no MPS)? tierd's
// copy worker is such a process: per job its stream waits (a stream memory wait), copies, and
// writes the job's completion word. Two contexts cannot run kernels at once; the GPU time-slices
// them, so each time the other context's stream has work, the trainer's kernels might be
// preempted. The design's ground truth ("a daemon copy beside a trainer kernel: neither slowed")
// timed one long copy beside one long kernel; this probe times many small jobs beside many short
// kernels, which is what activation offload is.
//
// The trainer process runs --kernels back-to-back kernels (each spinning --kernel-us on every SM)
// on one stream and times them with events; after each kernel it writes a ticket (a stream memory
// write into shared host memory), as the client does on a producer stream. Meanwhile, per mode:
//   alone    nothing else
//   copy     another process issues D2H copies of --job-kib, one per --gap-us
//   memops   the same with a (satisfied) stream wait before and a stream write after each copy
// Prints the trainer's time per kernel against alone and the time lost per job, writes JSON.
// H100, 1000 kernels of 200 us, 4 MiB jobs every 250 us (about 630 jobs): copy 1.000x,
// memops 1.000x, twice on two machines: such jobs cost a neighbour's kernels nothing.
// A watchdog ends a mode that takes longer than --timeout seconds (where each side stood).
//   nvcc -O2 -arch=sm_90 bench/context_share_probe.cu -o context_share_probe
//   context_share_probe [--kernels=2000] [--kernel-us=200] [--job-kib=4096] [--gap-us=250]
//                       [--timeout=20] [--json=FILE]
#include <cuda.h>
#include <cuda_runtime.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda_probe_check.h"

namespace {

struct Shared {  // one page of host memory both processes map (created before fork)
  volatile uint32_t ticket;     // the trainer's stream writes kernel i's index + 1 after it
  volatile uint32_t pad0[15];
  volatile uint32_t done;       // the worker's stream writes job j + 1 after its copy
  volatile uint32_t pad1[15];
  std::atomic<int> phase;       // 0 set up, 1 trainer running, 2 trainer finished
  std::atomic<int> worker_ready;
  std::atomic<long> jobs;       // jobs the worker issued while the trainer ran
  std::atomic<long> issued;     // jobs issued so far (the watchdog's report)
  std::atomic<long> kernels;    // kernels the trainer launched so far
};

struct Options {
  int kernels = 2000;
  int kernel_us = 200;
  int job_kib = 4096;
  int gap_us = 250;
  int timeout_s = 20;
  std::string json = "context_share_probe.json";
};

__global__ void Spin(long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// The driver's stream memory operations, through the runtime (no -lcuda at link time).
using WaitValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
WaitValue32Fn cuWait = nullptr;
WaitValue32Fn cuWrite = nullptr;

void LoadDriver() {
  cudaDriverEntryPointQueryResult q;
  void* p = nullptr;
  CHECK(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &p, 12000, cudaEnableDefault, &q));
  if (!p || q != cudaDriverEntryPointSuccess) { std::fprintf(stderr, "no cuStreamWaitValue32\n"); std::exit(1); }
  cuWait = reinterpret_cast<WaitValue32Fn>(p);
  CHECK(cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &p, 12000, cudaEnableDefault, &q));
  if (!p || q != cudaDriverEntryPointSuccess) { std::fprintf(stderr, "no cuStreamWriteValue32\n"); std::exit(1); }
  cuWrite = reinterpret_cast<WaitValue32Fn>(p);
}

CUdeviceptr Mapped(volatile void* p) {
  void* dev = nullptr;
  CHECK(cudaHostGetDevicePointer(&dev, const_cast<void*>(p), 0));
  return reinterpret_cast<CUdeviceptr>(dev);
}

void Register(Shared* s) {
  LoadDriver();
  CHECK(cudaHostRegister(s, 4096, cudaHostRegisterMapped | cudaHostRegisterPortable));
}

// The other process's loop: jobs until the trainer finishes.
void Worker(Shared* s, const std::string& mode, const Options& o) {
  CHECK(cudaSetDevice(0));
  Register(s);
  size_t bytes = static_cast<size_t>(o.job_kib) << 10;
  char *dev = nullptr, *host = nullptr;
  CHECK(cudaMalloc(&dev, bytes));
  CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host), bytes, cudaHostAllocDefault));
  CHECK(cudaMemset(dev, 1, bytes));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK(cudaDeviceSynchronize());
  CUdeviceptr ticket = Mapped(&s->ticket), done = Mapped(&s->done);
  s->worker_ready.store(1);
  while (s->phase.load() == 0) std::this_thread::yield();
  long j = 0;
  while (s->phase.load() == 1) {
    if (mode == "memops")
      CHECK_CU(cuWait(stream, ticket, 0, CU_STREAM_WAIT_VALUE_GEQ));
    CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream));
    if (mode == "memops")
      CHECK_CU(cuWrite(stream, done, static_cast<uint32_t>(j + 1), CU_STREAM_WRITE_VALUE_DEFAULT));
    if (j % 16 == 15) CHECK(cudaStreamSynchronize(stream));
    std::this_thread::sleep_for(std::chrono::microseconds(o.gap_us));
    ++j;
    s->issued.store(j);
  }
  s->jobs.store(j);
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaFree(dev));
  CHECK(cudaFreeHost(host));
}

// The trainer: --kernels spins on every SM, a ticket after each; returns ms per kernel.
double Trainer(Shared* s, const Options& o, const std::string& mode) {
  CHECK(cudaSetDevice(0));
  Register(s);
  int sms = 0, clock_khz = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  long long cycles = static_cast<long long>(clock_khz) * o.kernel_us / 1000;
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUdeviceptr ticket = Mapped(&s->ticket);
  Spin<<<sms * 4, 256, 0, stream>>>(cycles);  // warm up
  CHECK(cudaStreamSynchronize(stream));
  if (mode != "alone")
    while (s->worker_ready.load() == 0) std::this_thread::yield();
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  s->phase.store(1);
  CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < o.kernels; ++i) {
    Spin<<<sms * 4, 256, 0, stream>>>(cycles);
    s->kernels.store(i + 1);
    CHECK_CU(cuWrite(stream, ticket, static_cast<uint32_t>(i + 1), CU_STREAM_WRITE_VALUE_DEFAULT));
  }
  CHECK(cudaEventRecord(stop, stream));
  CHECK(cudaEventSynchronize(stop));
  s->phase.store(2);
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  return ms / o.kernels;
}

double RunMode(const std::string& mode, const Options& o, long* jobs) {
  auto* s = static_cast<Shared*>(mmap(nullptr, 4096, PROT_READ | PROT_WRITE,
                                      MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (s == MAP_FAILED) std::exit(1);
  std::memset(static_cast<void*>(s), 0, 4096);
  int fds[2];
  if (pipe(fds) != 0) std::exit(1);
  pid_t trainer = fork();
  if (trainer == 0) {
    double per = Trainer(s, o, mode);
    if (write(fds[1], &per, sizeof per) != sizeof per) _exit(1);
    _exit(0);
  }
  pid_t worker = -1;
  if (mode != "alone") {
    worker = fork();
    if (worker == 0) {
      close(fds[0]);
      close(fds[1]);
      Worker(s, mode, o);
      _exit(0);
    }
  }
  close(fds[1]);  // a trainer that dies ends the read below
  double per = -1;
  // Watchdog: a mode that has not finished in --timeout seconds is reported (where each side
  // stood) and killed, and the probe goes on with the next mode.
  pollfd pfd{fds[0], POLLIN, 0};
  if (poll(&pfd, 1, o.timeout_s * 1000) <= 0) {
    std::fprintf(stderr, "%s: no result after %d s: trainer launched %ld kernels, ticket %u; "
                 "worker issued %ld jobs, done %u; killed\n", mode.c_str(), o.timeout_s,
                 s->kernels.load(), s->ticket, s->issued.load(), s->done);
    kill(trainer, SIGKILL);
    if (worker > 0) kill(worker, SIGKILL);
  } else if (read(fds[0], &per, sizeof per) != sizeof per) {
    per = -1;
  }
  int status = 0;
  waitpid(trainer, &status, 0);
  if (worker > 0) waitpid(worker, &status, 0);
  *jobs = s->jobs.load();
  close(fds[0]);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) std::fprintf(stderr, "%s: a process failed\n", mode.c_str());
  munmap(s, 4096);
  return per;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  setvbuf(stdout, nullptr, _IOLBF, 0);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* key) -> const char* {
      size_t n = std::strlen(key);
      return a.compare(0, n, key) == 0 ? argv[i] + n : nullptr;
    };
    if (const char* v = value("--kernels=")) o.kernels = std::atoi(v);
    else if (const char* v = value("--kernel-us=")) o.kernel_us = std::atoi(v);
    else if (const char* v = value("--job-kib=")) o.job_kib = std::atoi(v);
    else if (const char* v = value("--gap-us=")) o.gap_us = std::atoi(v);
    else if (const char* v = value("--json=")) o.json = v;
    else if (const char* v = value("--timeout=")) o.timeout_s = std::atoi(v);
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  const char* modes[] = {"alone", "copy", "memops"};
  std::printf("%d kernels of %d us on every SM; jobs of %d KiB, paced %d us (copy, memops)\n",
              o.kernels, o.kernel_us, o.job_kib, o.gap_us);
  std::printf("%-13s %10s %8s %8s %12s\n", "mode", "us/kernel", "x alone", "jobs", "us per job");
  FILE* out = std::fopen(o.json.c_str(), "w");
  std::fprintf(out, "{\"kernels\": %d, \"kernel_us\": %d, \"job_kib\": %d, \"gap_us\": %d, "
               "\"rows\": [", o.kernels, o.kernel_us, o.job_kib, o.gap_us);
  double alone = 0;
  for (size_t m = 0; m < sizeof modes / sizeof *modes; ++m) {
    long jobs = 0;
    double per = RunMode(modes[m], o, &jobs);
    if (m == 0) alone = per;
    double lost_us = (per - alone) * 1000.0 * o.kernels;
    std::printf("%-13s %10.1f %8.3f %8ld %12.1f\n", modes[m], per * 1000.0, per / alone, jobs,
                jobs ? lost_us / jobs : 0.0);
    std::fprintf(out, "%s{\"mode\": \"%s\", \"us_per_kernel\": %.3f, \"x_alone\": %.4f, "
                 "\"jobs\": %ld, \"lost_us_per_job\": %.2f}", m ? ", " : "", modes[m],
                 per * 1000.0, per / alone, jobs, jobs ? lost_us / jobs : 0.0);
  }
  std::fprintf(out, "]}\n");
  std::fclose(out);
  return 0;
}
