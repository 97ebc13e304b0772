// The CUDA engine in this process (the daemon's side) against a client in a child process
// (tests/gpu/cuda_engine_client.h): round trips through cudaMalloc and VMM memory, the ticket
// ordering on the GPU, abandoning a session, bad and dead handles, released waiters, and the done
// counters in the ticket page; each with and without delay injection. Exits 77 ("no GPU:
// skipped") without a device.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "gpu/cuda_engine_client.h"

namespace tier::engine::cuda_engine_testing {
namespace {

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
}  // namespace tier::engine::cuda_engine_testing

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], tier::engine::cuda_engine_testing::kClientFlag) == 0) {
    return tier::engine::cuda_engine_testing::Client(std::atoi(argv[2])).Run();
  }
  // Before any other CUDA call: skip where there is no device (--gtest_list_tests lists the
  // tests anywhere: no test runs).
  ::testing::InitGoogleTest(&argc, argv);
  if (!GTEST_FLAG_GET(list_tests) && tier::client::gpu::GpuDeviceCount() == 0) {
    std::printf("no GPU: skipped\n");
    return 77;
  }
  return RUN_ALL_TESTS();
}
