// Which CUDA calls wait for GPU work, and does a waiting call stop other threads' stream operations?
//
// For each call under test: a stream of this process is made to wait (cuStreamWaitValue64) on a
// word in mapped host memory that only this program writes; then a second thread makes the call.
// If the call has not returned after --hold_ms it "blocks"; while it blocks, a third thread tries
// ordinary stream operations on an idle stream (query, write value, async copy, wait value) and
// reports whether those block too (a driver lock held across the wait). Then the word is written,
// the blocked stream runs, and the call's return is timed.
//
// Every call runs twice: with the waiting stream a non-blocking stream, and with it the legacy
// default stream (PyTorch's default current stream). The IPC and VMM imports use memory exported
// by a child process (started before this process touches CUDA).
//
// Output: one row per (call, waiting stream) and, with --json=FILE, the same as JSON. Exit 77
// without a GPU. This is the evidence behind the call classes in gpu/gpu_call_class.h.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "common/unix_socket.h"
#include "gpu/cuda_driver.h"
#include "gpu/runtime.h"

namespace {

using Clock = std::chrono::steady_clock;
using tier::gpu::cuda::Driver;

int hold_ms = 400;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

#define CHECK_RT(x)                                                                      \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorName(e_)); \
      std::exit(2);                                                                      \
    }                                                                                    \
  } while (0)
#define CHECK_DRV(x)                                                        \
  do {                                                                      \
    CUresult r_ = (x);                                                      \
    if (r_ != CUDA_SUCCESS) {                                               \
      std::fprintf(stderr, "%s:%d %s: %d\n", __FILE__, __LINE__, #x, (int)r_); \
      std::exit(2);                                                         \
    }                                                                       \
  } while (0)

struct Exported {
  cudaIpcMemHandle_t ipc;
  uint64_t vmm_bytes;
};

// The child: exports a cudaMalloc allocation (legacy IPC) and a VMM allocation (POSIX fd), then
// waits for the parent to finish.
[[noreturn]] void Child(int sock) {
  CHECK_RT(cudaSetDevice(0));
  void* p = nullptr;
  CHECK_RT(cudaMalloc(&p, 4 << 20));
  const Driver& d = **tier::gpu::cuda::GetDriver();
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  CHECK_DRV(d.MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle h;
  CHECK_DRV(d.MemCreate(&h, gran, &prop, 0));
  int fd = -1;
  CHECK_DRV(d.MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  // Several exports of the same allocation: the parent imports it more than once.
  std::vector<int> fds = {fd};
  for (int i = 0; i < 7; ++i) {
    int more = -1;
    CHECK_DRV(d.MemExportToShareableHandle(&more, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    fds.push_back(more);
  }
  Exported e{};
  CHECK_RT(cudaIpcGetMemHandle(&e.ipc, p));
  e.vmm_bytes = gran;
  if (!tier::SendMessage(sock, &e, sizeof(e), fds).ok()) std::_Exit(3);
  char c;
  (void)!::read(sock, &c, 1);
  std::_Exit(0);
}

struct Row {
  std::string call;
  std::string waiting_stream;
  bool blocked = false;
  bool others_blocked = false;
  std::string others_detail;
  double returned_after_release_ms = 0;
  bool hung = false;
};

class Probe {
 public:
  Probe() : d_(**tier::gpu::cuda::GetDriver()) {
    CHECK_RT(cudaSetDevice(0));
    CHECK_RT(cudaFree(nullptr));
    void* words = nullptr;
    CHECK_RT(cudaHostAlloc(&words, 4096, cudaHostAllocMapped | cudaHostAllocPortable));
    words_ = static_cast<uint64_t*>(words);
    std::memset(words_, 0, 4096);
    void* dev = nullptr;
    CHECK_RT(cudaHostGetDevicePointer(&dev, words_, 0));
    word_dev_ = reinterpret_cast<CUdeviceptr>(dev);
    CHECK_RT(cudaStreamCreateWithFlags(&waiter_, cudaStreamNonBlocking));
    CHECK_RT(cudaStreamCreateWithFlags(&idle_, cudaStreamNonBlocking));
    CHECK_RT(cudaMalloc(&scratch_, 1 << 20));
    CHECK_RT(cudaHostAlloc(&host_scratch_, 1 << 20, cudaHostAllocDefault));
  }

  // Runs `call` on a second thread while `legacy ? stream 0 : waiter_` waits on the host word.
  Row Run(const std::string& name, bool legacy, const std::function<void()>& call) {
    Row row;
    row.call = name;
    row.waiting_stream = legacy ? "legacy default" : "non-blocking";
    uint64_t gen = ++gen_;
    CUstream waiting = legacy ? nullptr : reinterpret_cast<CUstream>(waiter_);
    CHECK_DRV(d_.StreamWaitValue64(waiting, word_dev_, gen, CU_STREAM_WAIT_VALUE_GEQ));
    // Something behind the wait, so the stream is visibly busy.
    CHECK_DRV(d_.StreamWriteValue64(waiting, word_dev_ + 64, gen, CU_STREAM_WRITE_VALUE_DEFAULT));
    std::promise<void> done_promise;
    std::future<void> done = done_promise.get_future();
    std::thread t([&] {
      (void)cudaSetDevice(0);  // the primary context current, also for driver API calls
      call();
      done_promise.set_value();
    });
    Clock::time_point start = Clock::now();
    std::vector<std::future<void>> stuck;
    if (done.wait_for(std::chrono::milliseconds(hold_ms)) != std::future_status::ready) {
      row.blocked = true;
      row.others_detail = OthersBlocked(&row.others_blocked, stuck);
    }
    Clock::time_point release = Clock::now();
    std::atomic_ref<uint64_t>(words_[0]).store(gen);
    for (std::future<void>& f : stuck) f.wait();  // they return once the blocked call does
    if (done.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      row.hung = true;
      t.detach();  // the process exits after the report
      return row;
    }
    row.returned_after_release_ms = row.blocked ? Ms(Clock::now() - release) : -Ms(Clock::now() - start);
    t.join();
    CHECK_RT(cudaStreamSynchronize(legacy ? nullptr : waiter_));
    return row;
  }

  // While a call blocks: do plain stream operations on an idle stream return?
  // Operations still blocked are left in `stuck`, to be waited for after the release.
  std::string OthersBlocked(bool* any, std::vector<std::future<void>>& stuck) {
    struct Op {
      const char* name;
      std::function<void()> fn;
    };
    std::vector<Op> ops = {
        {"cudaStreamQuery", [&] { (void)cudaStreamQuery(idle_); }},
        {"cuStreamWriteValue64",
         [&] {
           (void)d_.StreamWriteValue64(reinterpret_cast<CUstream>(idle_), word_dev_ + 128, 1,
                                       CU_STREAM_WRITE_VALUE_DEFAULT);
         }},
        {"cuStreamWaitValue64",
         [&] {
           (void)d_.StreamWaitValue64(reinterpret_cast<CUstream>(idle_), word_dev_ + 128, 0,
                                      CU_STREAM_WAIT_VALUE_GEQ);
         }},
        {"cudaMemcpyAsync",
         [&] {
           (void)cudaMemcpyAsync(scratch_, host_scratch_, 4096, cudaMemcpyHostToDevice, idle_);
         }},
        {"cudaEventRecord+Query",
         [&] {
           cudaEvent_t ev;
           (void)cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
           (void)cudaEventRecord(ev, idle_);
           (void)cudaEventQuery(ev);
           (void)cudaEventDestroy(ev);
         }},
    };
    std::string detail;
    for (Op& op : ops) {
      auto task = std::make_shared<std::packaged_task<void()>>(op.fn);
      std::future<void> f = task->get_future();
      std::thread([task] {
        (void)cudaSetDevice(0);
        (*task)();
      }).detach();
      bool ok = f.wait_for(std::chrono::milliseconds(200)) == std::future_status::ready;
      if (!ok) {
        *any = true;
        detail += std::string(detail.empty() ? "" : ",") + op.name;
        stuck.push_back(std::move(f));
      }
    }
    return detail;
  }

  const Driver& d_;
  uint64_t* words_ = nullptr;
  CUdeviceptr word_dev_ = 0;
  cudaStream_t waiter_ = nullptr;
  cudaStream_t idle_ = nullptr;
  void* scratch_ = nullptr;
  void* host_scratch_ = nullptr;
  uint64_t gen_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--json=", 0) == 0) json_path = a.substr(7);
    if (a.rfind("--hold_ms=", 0) == 0) hold_ms = std::stoi(a.substr(10));
  }
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) return 2;
  pid_t child = ::fork();
  if (child == 0) {
    ::close(sv[0]);
    Child(sv[1]);
  }
  ::close(sv[1]);
  if (tier::gpu::DeviceCount() == 0) {
    std::printf("no GPU: skipped\n");
    ::kill(child, SIGKILL);
    return 77;
  }
  absl::StatusOr<tier::ReceivedMessage> msg = tier::ReceiveMessage(sv[0], 4096, 8);
  if (!msg.ok() || msg->data.size() != sizeof(Exported) || msg->fds.size() != 8) {
    std::fprintf(stderr, "child export failed\n");
    return 2;
  }
  Exported exported;
  std::memcpy(&exported, msg->data.data(), sizeof(exported));

  Probe probe;
  const Driver& d = probe.d_;
  std::vector<Row> rows;
  for (bool legacy : {false, true}) {
    auto run = [&](const std::string& name, const std::function<void()>& fn) {
      rows.push_back(probe.Run(name, legacy, fn));
      const Row& r = rows.back();
      std::printf("%-34s %-15s %-8s %-8s %8.1f %s\n", r.call.c_str(), r.waiting_stream.c_str(),
                  r.hung ? "HUNG" : (r.blocked ? "BLOCKS" : "returns"),
                  r.others_blocked ? "yes" : "no", r.returned_after_release_ms,
                  r.others_detail.c_str());
      std::fflush(stdout);
    };
    std::printf("%-34s %-15s %-8s %-8s %8s %s\n", "call", "waiting stream", "call",
                "others", "ms", "other ops blocked");
    int fd_index = legacy ? 4 : 0;
    // Daemon side: importing and closing client memory.
    void* ipc = nullptr;
    run("cudaIpcOpenMemHandle", [&] {
      CHECK_RT(cudaIpcOpenMemHandle(&ipc, exported.ipc, cudaIpcMemLazyEnablePeerAccess));
    });
    run("cudaIpcCloseMemHandle", [&] { CHECK_RT(cudaIpcCloseMemHandle(ipc)); });
    CUmemGenericAllocationHandle h = 0;
    int fd = msg->fds[fd_index].get();
    run("cuMemImportFromShareableHandle", [&] {
      CHECK_DRV(d.MemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    });
    CUdeviceptr va = 0;
    run("cuMemAddressReserve", [&] {
      CHECK_DRV(d.MemAddressReserve(&va, exported.vmm_bytes, exported.vmm_bytes, 0, 0));
    });
    run("cuMemMap", [&] { CHECK_DRV(d.MemMap(va, exported.vmm_bytes, 0, h, 0)); });
    run("cuMemSetAccess", [&] {
      CUmemAccessDesc access{};
      access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = 0;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      CHECK_DRV(d.MemSetAccess(va, exported.vmm_bytes, &access, 1));
    });
    run("cuMemRelease (mapped)", [&] { CHECK_DRV(d.MemRelease(h)); });
    run("cuMemUnmap", [&] { CHECK_DRV(d.MemUnmap(va, exported.vmm_bytes)); });
    run("cuMemAddressFree", [&] { CHECK_DRV(d.MemAddressFree(va, exported.vmm_bytes)); });
    // Host memory registration (the pool, a client's memfd).
    size_t host_bytes = 64 << 20;
    void* host = ::mmap(nullptr, host_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                        -1, 0);
    run("cudaHostRegister 64MiB", [&] { CHECK_RT(cudaHostRegister(host, host_bytes, cudaHostRegisterPortable)); });
    run("cudaHostUnregister", [&] { CHECK_RT(cudaHostUnregister(host)); });
    ::munmap(host, host_bytes);
    void* mapped = nullptr;
    run("cudaHostAlloc mapped 64KiB", [&] {
      CHECK_RT(cudaHostAlloc(&mapped, 64 << 10, cudaHostAllocMapped | cudaHostAllocPortable));
    });
    run("cudaFreeHost", [&] { CHECK_RT(cudaFreeHost(mapped)); });
    // Streams and events.
    cudaStream_t s = nullptr;
    run("cudaStreamCreateWithFlags", [&] { CHECK_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); });
    run("cudaStreamDestroy (idle)", [&] { CHECK_RT(cudaStreamDestroy(s)); });
    run("cudaStreamQuery (waiting one)", [&] {
      (void)cudaStreamQuery(legacy ? nullptr : probe.waiter_);
    });
    cudaEvent_t ev = nullptr;
    run("cudaEventCreate", [&] { CHECK_RT(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)); });
    run("cudaEventDestroy", [&] { CHECK_RT(cudaEventDestroy(ev)); });
    // Client side: device memory and its export.
    void* dm = nullptr;
    run("cudaMalloc 2MiB", [&] { CHECK_RT(cudaMalloc(&dm, 2 << 20)); });
    cudaIpcMemHandle_t handle;
    run("cudaIpcGetMemHandle", [&] { CHECK_RT(cudaIpcGetMemHandle(&handle, dm)); });
    run("cudaPointerGetAttributes", [&] {
      cudaPointerAttributes a{};
      CHECK_RT(cudaPointerGetAttributes(&a, dm));
    });
    run("cuMemGetAddressRange", [&] {
      CUdeviceptr b;
      size_t n;
      CHECK_DRV(d.MemGetAddressRange(&b, &n, reinterpret_cast<CUdeviceptr>(dm)));
    });
    run("cuPointerGetAttribute BUFFER_ID", [&] {
      unsigned long long id;
      CHECK_DRV(d.PointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                      reinterpret_cast<CUdeviceptr>(dm)));
    });
    run("cudaFree 2MiB", [&] { CHECK_RT(cudaFree(dm)); });
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemGenericAllocationHandle own = 0;
    run("cuMemCreate", [&] { CHECK_DRV(d.MemCreate(&own, exported.vmm_bytes, &prop, 0)); });
    CUdeviceptr own_va = 0;
    CHECK_DRV(d.MemAddressReserve(&own_va, exported.vmm_bytes, exported.vmm_bytes, 0, 0));
    CHECK_DRV(d.MemMap(own_va, exported.vmm_bytes, 0, own, 0));
    run("cuMemRetainAllocationHandle", [&] {
      CUmemGenericAllocationHandle r;
      CHECK_DRV(d.MemRetainAllocationHandle(&r, reinterpret_cast<void*>(own_va)));
      CHECK_DRV(d.MemRelease(r));
    });
    int own_fd = -1;
    run("cuMemExportToShareableHandle", [&] {
      CHECK_DRV(d.MemExportToShareableHandle(&own_fd, own, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    });
    ::close(own_fd);
    CHECK_DRV(d.MemUnmap(own_va, exported.vmm_bytes));
    CHECK_DRV(d.MemAddressFree(own_va, exported.vmm_bytes));
    CHECK_DRV(d.MemRelease(own));
    run("cudaDeviceSynchronize", [&] { CHECK_RT(cudaDeviceSynchronize()); });
  }
  (void)!::write(sv[0], "x", 1);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f != nullptr) {
      std::fprintf(f, "[\n");
      for (size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        std::fprintf(f,
                     "  {\"call\": \"%s\", \"waiting_stream\": \"%s\", \"blocks\": %s, "
                     "\"blocks_other_threads\": %s, \"other_ops_blocked\": \"%s\", \"hung\": %s, "
                     "\"returned_after_release_ms\": %.2f}%s\n",
                     r.call.c_str(), r.waiting_stream.c_str(), r.blocked ? "true" : "false",
                     r.others_blocked ? "true" : "false", r.others_detail.c_str(),
                     r.hung ? "true" : "false", r.returned_after_release_ms,
                     i + 1 < rows.size() ? "," : "");
      }
      std::fprintf(f, "]\n");
      std::fclose(f);
    }
  }
  return 0;
}
