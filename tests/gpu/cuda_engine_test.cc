// The CUDA engine in this process (the daemon's side) against a client in a child process: the
// test binary re-executes itself with --tier-gpu-client, so the child starts CUDA fresh (a forked
// CUDA process cannot use CUDA). The child allocates device memory (cudaMalloc and VMM with POSIX
// fd handles), exports it with client_gpu (fds travel by SCM_RIGHTS), writes tickets on its
// streams, and checks what reached its memory. Exits 77 ("no GPU: skipped") without a device.
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

namespace tier::engine {

// These tests drive the engine as a client would: through the client's GPU layer.
using namespace ::tier::client::gpu;  // NOLINT(build/namespaces)
namespace cuda = ::tier::gpu::cuda;
namespace {

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

std::string ReplyText(const Reply& r) {
  return absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(r.code)), ": ",
                      r.message);
}

BufferImport ImportOf(const Reply& r, UniqueFd fd = UniqueFd()) {
  BufferImport import;
  import.kind = static_cast<wire::BufferKind>(r.kind);
  import.device = r.device;
  import.bytes = r.bytes;
  std::memcpy(import.ipc_handle.data(), r.handle, sizeof(r.handle));
  std::memcpy(import.device_uuid.data(), r.uuid, sizeof(r.uuid));
  import.fd = std::move(fd);
  return import;
}

// A job's completion, awaited with a timeout.
struct Completion {
  std::promise<absl::Status> promise;
  std::future<absl::Status> future = promise.get_future();
  absl::AnyInvocable<void(absl::Status) &&> Callback() {
    return [this](absl::Status s) { promise.set_value(std::move(s)); };
  }
  bool Ready(std::chrono::milliseconds timeout) {
    return future.wait_for(timeout) == std::future_status::ready;
  }
};

class CudaEngineTest : public ::testing::TestWithParam<uint64_t> {
 protected:
  void SetUp() override {
    pool_ = static_cast<char*>(::mmap(nullptr, kPoolBytes, PROT_READ | PROT_WRITE,
                                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0));
    ASSERT_NE(pool_, MAP_FAILED);
    GpuEngineOptions options;
    options.copy_delay_us = GetParam();
    absl::StatusOr<std::unique_ptr<CopyEngine>> engine = StartGpuEngine(options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    ASSERT_TRUE(engine_->RegisterPool(pool_, kPoolBytes).ok());
    // The session's ticket page, as tierd makes it in the ring (shared with the client).
    ticket_fd_.reset(::memfd_create("tickets", MFD_CLOEXEC));
    ASSERT_TRUE(ticket_fd_.valid());
    ASSERT_EQ(::ftruncate(ticket_fd_.get(), ring::kTicketPageBytes), 0);
    void* page = ::mmap(nullptr, ring::kTicketPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                        ticket_fd_.get(), 0);
    ASSERT_NE(page, MAP_FAILED);
    tickets_ = new (page) ring::TicketPage();
    EngineSessionInfo info;
    info.id = 1;
    info.label = "test session";
    info.tickets = tickets_;
    absl::StatusOr<std::unique_ptr<EngineSession>> session = engine_->OpenSession(info);
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = *std::move(session);
  }

  void TearDown() override {
    if (session_) engine_->AbandonSession(session_.get());
    buffers_.clear();
    session_.reset();
    engine_.reset();
    if (pool_ != nullptr && pool_ != MAP_FAILED) ::munmap(pool_, kPoolBytes);
    if (tickets_ != nullptr) ::munmap(tickets_, ring::kTicketPageBytes);
  }

  // Allocates a client buffer (IPC or VMM) filled with `fill` and imports it; index in buffers_.
  int AddBuffer(Op op, uint8_t fill) {
    UniqueFd fd;
    Reply r = client_.Call(op, kBufferBytes, fill, &fd);
    if (r.code == static_cast<int32_t>(absl::StatusCode::kUnimplemented)) return -2;
    EXPECT_EQ(r.code, 0) << ReplyText(r);
    if (r.code != 0) return -1;
    absl::StatusOr<std::unique_ptr<ImportedBuffer>> b =
        engine_->Import(session_.get(), ImportOf(r, std::move(fd)));
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok()) return -1;
    EXPECT_EQ((*b)->bytes(), kBufferBytes);
    buffers_.push_back(*std::move(b));
    return static_cast<int>(buffers_.size()) - 1;
  }

  void AddSemaphores() {
    Reply r = client_.Call(Op::kCreateSync, 0, 0, nullptr, ticket_fd_.get());
    ASSERT_EQ(r.code, 0) << ReplyText(r);
    absl::StatusOr<std::unique_ptr<ImportedBuffer>> page =
        engine_->Import(session_.get(), ImportOf(r));
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_EQ((*page)->bytes(), 0u);  // no job can name the page
    // Kept apart from buffers_, whose indexes match the child's buffer list.
    page_ = *std::move(page);
  }

  CopyJob Job(Direction direction, int buffer, uint64_t pool_offset, uint64_t sync,
              Completion& done) {
    CopyJob job;
    job.direction = direction;
    job.client = buffers_[buffer]->base();
    job.pool = pool_ + pool_offset;
    job.len = kBufferBytes;
    job.session = session_.get();
    job.sync = sync;
    job.done = done.Callback();
    return job;
  }

  bool PoolHolds(uint64_t offset, uint8_t byte) {
    for (uint64_t i = 0; i < kBufferBytes; ++i) {
      if (static_cast<uint8_t>(pool_[offset + i]) != byte) {
        ADD_FAILURE() << "pool byte " << i << " is " << int{static_cast<uint8_t>(pool_[offset + i])}
                      << ", expected " << int{byte};
        return false;
      }
    }
    return true;
  }

  // Offload then reload with no tickets: plain copies through IPC/VMM mappings.
  void RoundTrip(Op alloc) {
    int b = AddBuffer(alloc, 0x5A);
    if (b == -2) GTEST_SKIP() << "VMM POSIX fd handles unsupported on this GPU";
    ASSERT_GE(b, 0);
    Completion offload;
    engine_->Submit(Job(Direction::kToPool, b, 0, 0, offload));
    ASSERT_TRUE(offload.Ready(std::chrono::seconds(20)));
    ASSERT_TRUE(offload.future.get().ok());
    EXPECT_TRUE(PoolHolds(0, 0x5A));
    std::memset(pool_ + kBufferBytes, 0xC3, kBufferBytes);
    Completion reload;
    engine_->Submit(Job(Direction::kFromPool, b, kBufferBytes, 0, reload));
    ASSERT_TRUE(reload.Ready(std::chrono::seconds(20)));
    ASSERT_TRUE(reload.future.get().ok());
    Reply check = client_.Call(Op::kCheck, b, 0xC3);
    EXPECT_EQ(check.code, 0) << ReplyText(check);
  }

  ClientProcess client_;  // first: outlives every mapping of its memory
  char* pool_ = nullptr;
  std::unique_ptr<CopyEngine> engine_;
  std::unique_ptr<EngineSession> session_;
  std::vector<std::unique_ptr<ImportedBuffer>> buffers_;
  std::unique_ptr<ImportedBuffer> page_;
  UniqueFd ticket_fd_;
  ring::TicketPage* tickets_ = nullptr;
};

TEST_P(CudaEngineTest, IpcRoundTrip) { RoundTrip(Op::kAllocIpc); }

TEST_P(CudaEngineTest, VmmRoundTrip) { RoundTrip(Op::kAllocVmm); }

// Read before written: the producer's memset is stuck behind a gate when the offload is
// submitted; the pool must receive the memset's bytes, never the buffer's older ones.
TEST_P(CudaEngineTest, OffloadWaitsForProducer) {
  AddSemaphores();
  int b = AddBuffer(Op::kAllocIpc, 0x11);
  ASSERT_GE(b, 0);
  Reply produce = client_.Call(Op::kBlockedProduce, b, 0x77);
  ASSERT_EQ(produce.code, 0) << ReplyText(produce);
  Completion offload;
  engine_->Submit(Job(Direction::kToPool, b, 0, produce.ticket, offload));
  // While the producer is held the copy cannot have finished (nor started).
  EXPECT_FALSE(offload.Ready(std::chrono::milliseconds(100)));
  Reply release = client_.Call(Op::kReleaseProducer);
  ASSERT_EQ(release.code, 0) << ReplyText(release);
  ASSERT_TRUE(offload.Ready(std::chrono::seconds(20)));
  ASSERT_TRUE(offload.future.get().ok());
  EXPECT_TRUE(PoolHolds(0, 0x77));
  Reply counters = client_.Call(Op::kCounters);
  ASSERT_EQ(counters.code, 0) << ReplyText(counters);
  EXPECT_EQ(counters.counters[0], produce.ticket);  // produced
  EXPECT_EQ(counters.counters[1], produce.ticket);  // offload_done
}

// Used before reloaded: the consumer reads right after tier_reload would return; it must see
// the reloaded bytes (under delay injection a missing wait reads the old 0x11 every time).
TEST_P(CudaEngineTest, ConsumerWaitsForReload) {
  AddSemaphores();
  int b = AddBuffer(Op::kAllocIpc, 0x11);
  ASSERT_GE(b, 0);
  std::memset(pool_, 0xAB, kBufferBytes);
  Reply ticket = client_.Call(Op::kReloadTicket, b);
  ASSERT_EQ(ticket.code, 0) << ReplyText(ticket);
  Completion reload;
  engine_->Submit(Job(Direction::kFromPool, b, 0, ticket.ticket, reload));
  ASSERT_TRUE(reload.Ready(std::chrono::seconds(20)));
  ASSERT_TRUE(reload.future.get().ok());
  Reply finish = client_.Call(Op::kFinishReload, b, 0xAB);
  EXPECT_EQ(finish.code, 0) << ReplyText(finish);
}

// The engine issues a lane's jobs in ticket order even when they are submitted out of order.
TEST_P(CudaEngineTest, TicketsIssueInOrder) {
  AddSemaphores();
  int b1 = AddBuffer(Op::kAllocIpc, 0x01);
  int b2 = AddBuffer(Op::kAllocIpc, 0x02);
  ASSERT_GE(b1, 0);
  ASSERT_GE(b2, 0);
  Reply t1 = client_.Call(Op::kProduce, b1, 0x21);
  Reply t2 = client_.Call(Op::kProduce, b2, 0x22);
  ASSERT_EQ(t1.code, 0) << ReplyText(t1);
  ASSERT_EQ(t2.code, 0) << ReplyText(t2);
  ASSERT_EQ(t2.ticket, t1.ticket + 1);
  Completion second, first;
  engine_->Submit(Job(Direction::kToPool, b2, kBufferBytes, t2.ticket, second));
  EXPECT_FALSE(second.Ready(std::chrono::milliseconds(50)));  // held for ticket t1
  engine_->Submit(Job(Direction::kToPool, b1, 0, t1.ticket, first));
  ASSERT_TRUE(first.Ready(std::chrono::seconds(20)));
  ASSERT_TRUE(second.Ready(std::chrono::seconds(20)));
  EXPECT_TRUE(first.future.get().ok());
  EXPECT_TRUE(second.future.get().ok());
  EXPECT_TRUE(PoolHolds(0, 0x21));
  EXPECT_TRUE(PoolHolds(kBufferBytes, 0x22));
}

// A client that never writes its ticket (it died): the job waits on the host, not on the GPU, and
// abandoning the session cancels it.
TEST_P(CudaEngineTest, AbandonCancelsJobsWaitingForTickets) {
  AddSemaphores();
  int b = AddBuffer(Op::kAllocIpc, 0x33);
  ASSERT_GE(b, 0);
  Completion offload;
  engine_->Submit(Job(Direction::kToPool, b, 0, 1, offload));  // ticket 1 is never written
  EXPECT_FALSE(offload.Ready(std::chrono::milliseconds(100)));
  engine_->AbandonSession(session_.get());
  ASSERT_TRUE(offload.Ready(std::chrono::seconds(20)));
  EXPECT_EQ(offload.future.get().code(), absl::StatusCode::kCancelled);
}

TEST_P(CudaEngineTest, BadHandleIsRejected) {
  Reply page = client_.Call(Op::kCreateSync, 0, 0, nullptr, ticket_fd_.get());  // a valid UUID
  ASSERT_EQ(page.code, 0) << ReplyText(page);
  BufferImport import = ImportOf(page);
  import.kind = wire::BufferKind::kCudaIpc;
  import.bytes = kBufferBytes;
  for (size_t i = 0; i < import.ipc_handle.size(); ++i) import.ipc_handle[i] = 0xA5 ^ i;
  absl::StatusOr<std::unique_ptr<ImportedBuffer>> b = engine_->Import(session_.get(), std::move(import));
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << b.status();
  EXPECT_NE(b.status().message().find("IPC handle"), absl::string_view::npos) << b.status();

  BufferImport unknown_gpu = ImportOf(page);
  unknown_gpu.device_uuid.fill(0xEE);
  b = engine_->Import(session_.get(), std::move(unknown_gpu));
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("UUID"), absl::string_view::npos) << b.status();

  BufferImport bad_fd = ImportOf(page);
  bad_fd.kind = wire::BufferKind::kCudaVmmFd;
  bad_fd.fd.reset(::open("/dev/null", O_RDONLY));
  b = engine_->Import(session_.get(), std::move(bad_fd));
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << b.status();
}

TEST_P(CudaEngineTest, HandleOfDeadProcessIsRejected) {
  Reply r = client_.Call(Op::kAllocIpc, kBufferBytes, 0x44);
  ASSERT_EQ(r.code, 0) << ReplyText(r);
  client_.Kill();  // the exporter exits: its memory is freed
  absl::StatusOr<std::unique_ptr<ImportedBuffer>> b = engine_->Import(session_.get(), ImportOf(r));
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << b.status();
  EXPECT_NE(b.status().message().find("exited"), absl::string_view::npos) << b.status();
}

// Finding 12 (issue 30): a segment registration named how much address space tierd reserves for
// it (up to 4 TiB), and nothing counted it. A reservation larger than twice the GPU's memory is
// refused, and the session goes on.
TEST_P(CudaEngineTest, ASegmentReservationLargerThanTheGpuIsRefused) {
  if (GetParam() != 0) GTEST_SKIP() << "registration only: delay injection changes nothing";
  UniqueFd fd;
  Reply r = client_.Call(Op::kAllocVmm, kBufferBytes, 0x11, &fd);
  if (r.code == static_cast<int32_t>(absl::StatusCode::kUnimplemented)) {
    GTEST_SKIP() << "VMM POSIX fd handles unsupported on this GPU";
  }
  ASSERT_EQ(r.code, 0) << ReplyText(r);
  BufferImport import = ImportOf(r);
  import.kind = wire::BufferKind::kCudaVmmSegment;
  import.page_fds.push_back(std::move(fd));
  import.page_bytes = {kBufferBytes};
  import.reserve_bytes = uint64_t{4} << 40;  // 4 TiB: no GPU has that much
  absl::StatusOr<std::unique_ptr<ImportedBuffer>> b =
      engine_->Import(session_.get(), std::move(import));
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << b.status();
  EXPECT_NE(b.status().message().find("larger than twice GPU"), absl::string_view::npos)
      << b.status();
  EXPECT_GE(AddBuffer(Op::kAllocIpc, 0x22), 0);  // the session goes on
}

// Daemon death on the client side: a consumer blocked on reload_done is released.
TEST_P(CudaEngineTest, ReleaseWaitersFreesConsumer) {
  ASSERT_EQ(client_.Call(Op::kCreateSync, 0, 0, nullptr, ticket_fd_.get()).code, 0);
  Reply r = client_.Call(Op::kReleaseWaiters);
  EXPECT_EQ(r.code, 0) << ReplyText(r);
}

// The dead-daemon hang (issue 30): the consumer stream waits for a reload no daemon will copy,
// a thread keeps launching onto it until the launch blocks inside the driver, and only then is
// the daemon found dead. The release must not need anything that blocked launch holds: it is a
// CPU store into the ticket page, and every launch completes. (With the release written from a
// fresh stream, stream creation blocked on the driver lock the launch held: a hang.)
TEST_P(CudaEngineTest, ReleaseWaitersFreesALaunchBlockedBehindTheWait) {
  if (GetParam() != 0) GTEST_SKIP() << "no daemon copies here: delay injection changes nothing";
  ASSERT_EQ(client_.Call(Op::kCreateSync, 0, 0, nullptr, ticket_fd_.get()).code, 0);
  Reply r = client_.Call(Op::kReleaseWhileLaunchBlocked, 2000000);
  EXPECT_EQ(r.code, 0) << ReplyText(r);
  std::printf("launches queued behind the wait: %llu; launcher blocked at the release: %s\n",
              static_cast<unsigned long long>(r.bytes), r.offset == 1 ? "yes" : "no");
  EXPECT_EQ(r.offset, 1u) << "the launcher never blocked: the queue did not fill";
}

// The done counters live in the session's ticket page: what the daemon's stream writes there is
// what the client reads, and a slot is bound once per GPU.
TEST_P(CudaEngineTest, DoneCountersLandInTheTicketPage) {
  AddSemaphores();
  Reply again = client_.Call(Op::kCreateSync2);
  ASSERT_EQ(again.code, 0) << ReplyText(again);
  EXPECT_EQ(engine_->Import(session_.get(), ImportOf(again)).status().code(),
            absl::StatusCode::kAlreadyExists);
  int b = AddBuffer(Op::kAllocIpc, 0x21);
  ASSERT_GE(b, 0);
  Reply produce = client_.Call(Op::kProduce, b, 0x37);
  ASSERT_EQ(produce.code, 0) << ReplyText(produce);
  Completion offload;
  engine_->Submit(Job(Direction::kToPool, b, 0, produce.ticket, offload));
  ASSERT_TRUE(offload.Ready(std::chrono::seconds(20)));
  ASSERT_TRUE(offload.future.get().ok());
  Reply counters;
  for (int i = 0; i < 2000; ++i) {  // the done write lands after the copy's completion word
    counters = client_.Call(Op::kCounters);
    if (counters.counters[1] >= produce.ticket) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(counters.counters[0], produce.ticket);  // produced
  EXPECT_EQ(counters.counters[1], produce.ticket);  // offload_done, written by tierd's stream
  EXPECT_EQ(tickets_->slots[0].offload_done.value.load(), produce.ticket);
}

INSTANTIATE_TEST_SUITE_P(Delay, CudaEngineTest, ::testing::Values(0, 2000),
                         [](const ::testing::TestParamInfo<uint64_t>& info) {
                           return absl::StrCat("delay_us_", info.param);
                         });

}  // namespace
}  // namespace tier::engine

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], tier::engine::kClientFlag) == 0) {
    return tier::engine::Client(std::atoi(argv[2])).Run();
  }
  // Before GTest and before any other CUDA call: skip where there is no device.
  if (tier::client::gpu::GpuDeviceCount() == 0) {
    std::printf("no GPU: skipped\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
