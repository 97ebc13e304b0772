// The CUDA engine's test (cuda_engine_test.cc) runs the engine in this process (the daemon's side)
// against a client in a child process: the test binary re-executes itself with --tier-gpu-client,
// so the child starts CUDA fresh (a forked CUDA process cannot use CUDA). This is that child and
// how the two talk: it allocates device memory (cudaMalloc and VMM with POSIX fd handles), exports
// it with client_gpu (fds travel by SCM_RIGHTS), writes tickets on its streams, and checks what
// reached its memory; ClientProcess is the parent's handle on it.
#ifndef TIER_TESTS_GPU_CUDA_ENGINE_CLIENT_H_
#define TIER_TESTS_GPU_CUDA_ENGINE_CLIENT_H_

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
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/unix_socket.h"
#include "client/gpu/client_gpu.h"
#include "engine/copy_engine.h"
#include "gpu/cuda_driver.h"
#include "gpu/runtime.h"
#include "engine/gpu_engine.h"

namespace tier::engine::cuda_engine_testing {

// These tests drive the engine as a client would: through the client's GPU layer.
using namespace ::tier::client::gpu;  // NOLINT(build/namespaces)
namespace cuda = ::tier::gpu::cuda;

constexpr const char* kClientFlag = "--tier-gpu-client";
constexpr uint64_t kBufferBytes = 8 << 20;
constexpr uint64_t kPoolBytes = 64 << 20;

enum class Op : uint32_t {
  kAllocIpc = 1,      // a = bytes, b = fill byte
  kAllocVmm,          // a = bytes, b = fill byte
  kCreateSync,        // ticket slot of GPU 0; the request carries the ticket page's memfd
  kBlockedProduce,    // a = buffer, b = byte: memset queued behind a host-held gate, ticket
  kReleaseProducer,   // opens the gate
  kProduce,           // a = buffer, b = byte: memset on the producer stream, ticket
  kReloadTicket,      // a = buffer: ticket + consumer wait + read back on the consumer stream
  kFinishReload,      // a = buffer, b = expected byte of the read back
  kCheck,             // a = buffer, b = expected byte (synchronous read)
  kCounters,
  kReleaseWaiters,    // consumer blocked on a ticket no daemon serves; ReleaseWaiters frees it
  // The dead-daemon hang (issue 30): a consumer blocked on a ticket no daemon serves, a thread
  // launching into it until the launch blocks (queue full, holding the driver's lock), then
  // ReleaseWaiters from another thread; the launches must finish. a = launches at most.
  kReleaseWhileLaunchBlocked,
  kCreateSync2,       // a second ticket slot (GPU 0's slot bound twice: the daemon refuses it)
  kExit,
};

struct Request {
  Op op;
  uint32_t pad;
  uint64_t a;
  uint64_t b;
};

struct Reply {
  int32_t code;  // absl::StatusCode
  uint32_t kind;
  int32_t device;
  uint32_t pad;
  uint64_t base;
  uint64_t bytes;
  uint64_t offset;
  uint64_t ticket;
  uint64_t counters[4];
  uint8_t handle[64];
  uint8_t uuid[16];
  char message[200];
};

// ---- The client (child process) ----------------------------------------------------------

struct ChildBuffer {
  void* ptr = nullptr;
  uint64_t bytes = 0;
};

class Client {
 public:
  explicit Client(int fd) : fd_(fd) {}

  int Run() {
    for (;;) {
      absl::StatusOr<ReceivedMessage> m = ReceiveMessage(fd_, sizeof(Request), 1);
      if (!m.ok() || m->data.size() != sizeof(Request)) return 0;  // parent gone
      Request request;
      std::memcpy(&request, m->data.data(), sizeof(request));
      if (request.op == Op::kExit) return 0;
      if (!m->fds.empty()) request_fd_ = std::move(m->fds[0]);
      Reply reply{};
      int fd = -1;
      absl::Status s = Handle(request, reply, fd);
      reply.code = static_cast<int32_t>(s.code());
      std::snprintf(reply.message, sizeof(reply.message), "%s", std::string(s.message()).c_str());
      std::vector<int> fds;
      if (fd >= 0) fds.push_back(fd);
      (void)SendMessage(fd_, &reply, sizeof(reply), fds);
      if (fd >= 0) ::close(fd);
    }
  }

 private:
  static absl::Status Cuda(cudaError_t e, const char* what) {
    return ::tier::gpu::CheckRuntime(e, what);
  }

  static void Fill(Reply& reply, const DeviceAllocation& a) {
    reply.kind = static_cast<uint32_t>(a.kind);
    reply.device = a.device;
    reply.base = a.base;
    reply.bytes = a.bytes;
    reply.offset = a.offset;
    std::memcpy(reply.handle, a.ipc_handle.data(), sizeof(reply.handle));
    std::memcpy(reply.uuid, a.device_uuid.data(), sizeof(reply.uuid));
  }

  // Exports a pointer inside the allocation and checks client_gpu found the allocation's base.
  absl::Status Export(const ChildBuffer& b, wire::BufferKind kind, Reply& reply, int& fd) {
    absl::StatusOr<DeviceAllocation> a = ExportDeviceAllocation(static_cast<char*>(b.ptr) + 4096);
    if (!a.ok()) return a.status();
    if (a->kind != kind || a->base != reinterpret_cast<uint64_t>(b.ptr) || a->offset != 4096 ||
        a->bytes < b.bytes) {
      return absl::InternalError(absl::StrCat("export found kind ", static_cast<int>(a->kind),
                                              " base ", a->base, " offset ", a->offset, " bytes ",
                                              a->bytes, " for a pointer 4096 into ", b.bytes,
                                              " bytes at ", reinterpret_cast<uint64_t>(b.ptr)));
    }
    Fill(reply, *a);
    reply.bytes = b.bytes;
    reply.ticket = buffers_.size() - 1;  // the buffer's index
    if (a->fd.valid()) fd = a->fd.release();
    return absl::OkStatus();
  }

  absl::StatusOr<cudaStream_t> Stream(cudaStream_t& stream) {
    if (stream == nullptr) {
      if (absl::Status s = Cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                "cudaStreamCreateWithFlags");
          !s.ok()) {
        return s;
      }
    }
    return stream;
  }

  absl::Status WaitStream(cudaStream_t stream) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    cudaError_t e;
    while ((e = cudaStreamQuery(stream)) == cudaErrorNotReady) {
      if (std::chrono::steady_clock::now() > deadline) {
        return absl::DeadlineExceededError("client stream still blocked after 20 s");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return Cuda(e, "client stream");
  }

  absl::Status Compare(const uint8_t* data, uint64_t bytes, uint8_t expected) {
    for (uint64_t i = 0; i < bytes; ++i) {
      if (data[i] != expected) {
        return absl::DataLossError(absl::StrCat("byte ", i, " is ", int{data[i]}, ", expected ",
                                                int{expected}));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Handle(const Request& r, Reply& reply, int& fd) {
    if (absl::Status s = Cuda(cudaSetDevice(0), "cudaSetDevice"); !s.ok()) return s;
    switch (r.op) {
      case Op::kAllocIpc: {
        ChildBuffer b;
        b.bytes = r.a;
        if (absl::Status s = Cuda(cudaMalloc(&b.ptr, b.bytes), "cudaMalloc"); !s.ok()) return s;
        if (absl::Status s = Cuda(cudaMemset(b.ptr, static_cast<int>(r.b), b.bytes), "memset");
            !s.ok()) {
          return s;
        }
        if (absl::Status s = Cuda(cudaDeviceSynchronize(), "sync"); !s.ok()) return s;
        buffers_.push_back(b);
        return Export(b, wire::BufferKind::kCudaIpc, reply, fd);
      }
      case Op::kAllocVmm: {
        absl::StatusOr<const cuda::Driver*> d = cuda::GetDriver();
        if (!d.ok()) return d.status();
        int supported = 0;
        (*d)->DeviceGetAttribute(&supported,
                                 CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0);
        if (!supported) return absl::UnimplementedError("no POSIX fd VMM handles on GPU 0");
        CUmemAllocationProp prop{};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        size_t granularity = 0;
        if (absl::Status s = cuda::CheckDriver((*d)->MemGetAllocationGranularity(
                                                   &granularity, &prop,
                                                   CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                                               "granularity");
            !s.ok()) {
          return s;
        }
        ChildBuffer b;
        b.bytes = (r.a + granularity - 1) / granularity * granularity;
        CUmemGenericAllocationHandle handle = 0;
        if (absl::Status s = cuda::CheckDriver((*d)->MemCreate(&handle, b.bytes, &prop, 0),
                                               "cuMemCreate");
            !s.ok()) {
          return s;
        }
        CUdeviceptr va = 0;
        if (absl::Status s = cuda::CheckDriver(
                (*d)->MemAddressReserve(&va, b.bytes, granularity, 0, 0), "cuMemAddressReserve");
            !s.ok()) {
          return s;
        }
        if (absl::Status s = cuda::CheckDriver((*d)->MemMap(va, b.bytes, 0, handle, 0), "cuMemMap");
            !s.ok()) {
          return s;
        }
        (void)(*d)->MemRelease(handle);
        CUmemAccessDesc access{};
        access.location = prop.location;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        if (absl::Status s = cuda::CheckDriver((*d)->MemSetAccess(va, b.bytes, &access, 1),
                                               "cuMemSetAccess");
            !s.ok()) {
          return s;
        }
        b.ptr = reinterpret_cast<void*>(va);
        if (absl::Status s = Cuda(cudaMemset(b.ptr, static_cast<int>(r.b), b.bytes), "memset");
            !s.ok()) {
          return s;
        }
        if (absl::Status s = Cuda(cudaDeviceSynchronize(), "sync"); !s.ok()) return s;
        buffers_.push_back(b);
        return Export(b, wire::BufferKind::kCudaVmmFd, reply, fd);
      }
      case Op::kCreateSync: {
        // The session's ticket page, shared with the parent (the daemon side) as tierd shares
        // the ring's.
        if (!request_fd_.valid()) return absl::InvalidArgumentError("no ticket page fd");
        void* page = ::mmap(nullptr, ring::kTicketPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                            request_fd_.get(), 0);
        if (page == MAP_FAILED) return absl::InternalError("mmap of the ticket page");
        tickets_ = static_cast<ring::TicketPage*>(page);
        absl::StatusOr<std::unique_ptr<TicketPageRegistration>> registration =
            RegisterTicketPage(tickets_);
        if (!registration.ok()) return registration.status();
        ticket_registration_ = *std::move(registration);
        absl::StatusOr<std::unique_ptr<DeviceSync>> sync =
            CreateDeviceSync(0, &tickets_->slots[0]);
        if (!sync.ok()) return sync.status();
        sync_ = *std::move(sync);
        absl::StatusOr<DeviceAllocation> a = sync_->Export();
        if (!a.ok()) return a.status();
        Fill(reply, *a);
        return absl::OkStatus();
      }
      case Op::kBlockedProduce:
      case Op::kProduce: {
        absl::StatusOr<cudaStream_t> p = Stream(producer_);
        if (!p.ok()) return p.status();
        const ChildBuffer& b = buffers_.at(r.a);
        if (r.op == Op::kBlockedProduce) {
          if (gate_ == nullptr) {
            if (absl::Status s = Cuda(cudaHostAlloc(reinterpret_cast<void**>(&gate_), 64,
                                                    cudaHostAllocMapped | cudaHostAllocPortable),
                                      "cudaHostAlloc");
                !s.ok()) {
              return s;
            }
          }
          std::atomic_ref<uint64_t>(*gate_).store(0);
          void* gate_dev = nullptr;
          if (absl::Status s = Cuda(cudaHostGetDevicePointer(&gate_dev, gate_, 0), "devptr");
              !s.ok()) {
            return s;
          }
          absl::StatusOr<const cuda::Driver*> d = cuda::GetDriver();
          if (!d.ok()) return d.status();
          // The producer stream stalls here until the parent says so: the data it then writes
          // is what a correctly ordered offload must copy.
          if (absl::Status s = cuda::CheckDriver(
                  (*d)->StreamWaitValue64(*p, reinterpret_cast<CUdeviceptr>(gate_dev), 1,
                                          CU_STREAM_WAIT_VALUE_GEQ),
                  "cuStreamWaitValue64");
              !s.ok()) {
            return s;
          }
        }
        if (absl::Status s =
                Cuda(cudaMemsetAsync(b.ptr, static_cast<int>(r.b), b.bytes, *p), "memsetAsync");
            !s.ok()) {
          return s;
        }
        void* streams[] = {*p};
        absl::StatusOr<uint64_t> ticket = sync_->TicketOffload(streams);
        if (!ticket.ok()) return ticket.status();
        reply.ticket = *ticket;
        return absl::OkStatus();
      }
      case Op::kReleaseProducer:
        std::atomic_ref<uint64_t>(*gate_).store(1);
        return WaitStream(producer_);
      case Op::kReloadTicket: {
        absl::StatusOr<cudaStream_t> c = Stream(consumer_);
        if (!c.ok()) return c.status();
        const ChildBuffer& b = buffers_.at(r.a);
        absl::StatusOr<uint64_t> ticket = sync_->TicketReload(*c);
        if (!ticket.ok()) return ticket.status();
        if (absl::Status s = sync_->WaitReloadDone(*c, *ticket); !s.ok()) return s;
        // The consumer's first use: a read back, which must see the reloaded bytes.
        readback_.assign(b.bytes, 0);
        if (readback_host_ == nullptr) {
          if (absl::Status s = Cuda(cudaMallocHost(&readback_host_, kBufferBytes), "mallocHost");
              !s.ok()) {
            return s;
          }
        }
        if (absl::Status s = Cuda(cudaMemcpyAsync(readback_host_, b.ptr, b.bytes,
                                                  cudaMemcpyDeviceToHost, *c),
                                  "memcpyAsync");
            !s.ok()) {
          return s;
        }
        reply.ticket = *ticket;
        return absl::OkStatus();
      }
      case Op::kFinishReload: {
        if (absl::Status s = WaitStream(consumer_); !s.ok()) return s;
        return Compare(static_cast<uint8_t*>(readback_host_), buffers_.at(r.a).bytes,
                       static_cast<uint8_t>(r.b));
      }
      case Op::kCheck: {
        const ChildBuffer& b = buffers_.at(r.a);
        std::vector<uint8_t> host(b.bytes);
        if (absl::Status s = Cuda(cudaMemcpy(host.data(), b.ptr, b.bytes, cudaMemcpyDeviceToHost),
                                  "memcpy");
            !s.ok()) {
          return s;
        }
        return Compare(host.data(), b.bytes, static_cast<uint8_t>(r.b));
      }
      case Op::kCounters: {
        std::array<uint64_t, 4> c = sync_->ReadCounters();
        std::memcpy(reply.counters, c.data(), sizeof(reply.counters));
        return absl::OkStatus();
      }
      case Op::kReleaseWaiters: {
        absl::StatusOr<cudaStream_t> c = Stream(consumer_);
        if (!c.ok()) return c.status();
        absl::StatusOr<uint64_t> ticket = sync_->TicketReload(*c);
        if (!ticket.ok()) return ticket.status();
        if (absl::Status s = sync_->WaitReloadDone(*c, *ticket); !s.ok()) return s;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (cudaStreamQuery(*c) != cudaErrorNotReady) {
          return absl::InternalError("consumer stream did not wait for a ticket nobody served");
        }
        sync_->ReleaseWaiters();
        return WaitStream(*c);
      }
      case Op::kReleaseWhileLaunchBlocked: {
        absl::StatusOr<cudaStream_t> c = Stream(consumer_);
        if (!c.ok()) return c.status();
        absl::StatusOr<uint64_t> ticket = sync_->TicketReload(*c);
        if (!ticket.ok()) return ticket.status();
        if (absl::Status s = sync_->WaitReloadDone(*c, *ticket); !s.ok()) return s;
        void* scratch = nullptr;
        if (absl::Status s = Cuda(cudaMalloc(&scratch, 4096), "malloc"); !s.ok()) return s;
        std::atomic<uint64_t> launched{0};
        std::atomic<bool> done{false};
        cudaError_t launch_error = cudaSuccess;
        std::thread launcher([&] {
          for (uint64_t i = 0; i < r.a; ++i) {
            cudaError_t e = cudaMemsetAsync(scratch, static_cast<int>(i), 4096, *c);
            if (e != cudaSuccess) {
              launch_error = e;
              break;
            }
            launched.fetch_add(1);
          }
          done = true;
        });
        // Until the launcher stops making progress (blocked in the driver: the queue is full)
        // or has launched everything.
        uint64_t seen = ~uint64_t{0};
        while (!done && launched.load() != seen) {
          seen = launched.load();
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
        reply.bytes = launched.load();  // launches queued behind the wait
        reply.offset = done ? 0 : 1;    // 1: the launcher was blocked when the release came
        sync_->ReleaseWaiters();
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (!done && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        if (!done) {
          // The hang itself: report it and leave the thread (the test process exits).
          launcher.detach();
          return absl::DeadlineExceededError(absl::StrCat(
              "the launcher stayed blocked 20 s after ReleaseWaiters (", launched.load(),
              " launches)"));
        }
        launcher.join();
        if (launch_error != cudaSuccess) return absl::InternalError(cudaGetErrorName(launch_error));
        if (absl::Status s = WaitStream(*c); !s.ok()) return s;
        (void)cudaFree(scratch);
        return absl::OkStatus();
      }
      case Op::kCreateSync2: {
        absl::StatusOr<DeviceAllocation> a = sync_->Export();
        if (!a.ok()) return a.status();
        Fill(reply, *a);
        return absl::OkStatus();
      }
      case Op::kExit:
        break;
    }
    return absl::InvalidArgumentError("unknown op");
  }

  int fd_;
  UniqueFd request_fd_;
  std::vector<ChildBuffer> buffers_;
  ring::TicketPage* tickets_ = nullptr;
  std::unique_ptr<TicketPageRegistration> ticket_registration_;
  std::unique_ptr<DeviceSync> sync_;
  cudaStream_t producer_ = nullptr;
  cudaStream_t consumer_ = nullptr;
  uint64_t* gate_ = nullptr;
  void* readback_host_ = nullptr;
  std::vector<uint8_t> readback_;
};

// ---- The daemon side (this process) -------------------------------------------------------

// The child client process and its socket.
class ClientProcess {
 public:
  ClientProcess() {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, fds) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(fds[0]);
      std::string fd = std::to_string(fds[1]);
      ::execl("/proc/self/exe", "cuda_engine_test_client", kClientFlag, fd.c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(fds[1]);
    fd_.reset(fds[0]);
  }
  ~ClientProcess() { Kill(); }

  // Sends a request (with `send_fd` if >= 0); the reply's fd (if any) goes to *fd.
  Reply Call(Op op, uint64_t a = 0, uint64_t b = 0, UniqueFd* fd = nullptr, int send_fd = -1) {
    Request request{op, 0, a, b};
    Reply reply{};
    reply.code = static_cast<int32_t>(absl::StatusCode::kUnavailable);
    std::vector<int> fds;
    if (send_fd >= 0) fds.push_back(send_fd);
    if (!SendMessage(fd_.get(), &request, sizeof(request), fds).ok()) return reply;
    absl::StatusOr<ReceivedMessage> m = ReceiveMessage(fd_.get(), sizeof(Reply), 1);
    if (!m.ok() || m->data.size() != sizeof(Reply)) return reply;
    std::memcpy(&reply, m->data.data(), sizeof(reply));
    if (fd != nullptr && !m->fds.empty()) *fd = std::move(m->fds[0]);
    return reply;
  }

  void Kill() {
    if (pid_ <= 0) return;
    Request request{Op::kExit, 0, 0, 0};
    (void)SendMessage(fd_.get(), &request, sizeof(request));
    for (int i = 0; i < 2000; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  UniqueFd fd_;
};

}  // namespace tier::engine::cuda_engine_testing

#endif  // TIER_TESTS_GPU_CUDA_ENGINE_CLIENT_H_
