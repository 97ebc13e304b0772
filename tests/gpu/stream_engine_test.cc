// The GPU engine's runtime-neutral core (engine/stream_engine.h) over a fake runtime whose streams
// are host threads running stream memory operations and copies on host memory, in order. This
// runs everywhere (label unit) and checks what does not depend on the GPU: tickets (read from the
// session's ticket page), ticket ordering, completion detection, delay injection,
// reload-after-offload on pool bytes, fed reloads, ticket-only jobs, abandoning a session.
//
// The fake also models what blocks on a real GPU (tests/gpu/cuda_blocking_probe.cc measured it
// on the H100): closing client memory waits until every stream of the process is idle and holds
// the "driver lock" meanwhile, which every other runtime call takes too. With it, the deadlock of
// issue 10 is a CPU test (DeadlockModel below), and every runtime call is checked against the
// thread rule of engine/stream_engine.h (which thread may make which call).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <random>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/thread_role.h"
#include "client/gpu/client_gpu.h"
#include "engine/copy_engine.h"
#include "engine/stream_engine.h"

namespace tier::engine {

// These tests drive the engine as a client would: through the client's GPU layer.
using namespace ::tier::client::gpu;  // NOLINT(build/namespaces)
namespace {

uint64_t Load(uint64_t addr) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(addr)).load();
}
void Store(uint64_t addr, uint64_t value) {
  std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(addr)).store(value);
}

// Fake copies and the tests' writes to client memory while jobs run take this, as a stand-in for
// the memory system (the order between them is set by timing, as between a GPU and its host).
std::mutex memory_mu;

// What the fake runtime saw; checked after every test.
struct Observed {
  std::mutex mu;
  std::vector<std::string> rule_violations;
  std::set<uint64_t> wait_targets;  // addresses streams were made to wait on
  std::vector<uint64_t> write_targets;  // addresses streams were made to write, in order
  std::vector<size_t> batch_calls;      // copies per CopyBatchAsync call
  std::vector<std::pair<char*, uint64_t>> copies;  // (client address, bytes) of each copy issued
  std::atomic<bool> hold_copies{false};  // copies wait on their streams while set
  // Copies from or to client memory starting in [first, first + bytes) wait on their streams
  // while listed (a session kept on the link: LinkShare counts lanes with copies in flight).
  std::vector<std::pair<const char*, uint64_t>> held_ranges;  // guarded by mu
  bool Held(const char* client) {
    std::lock_guard lock(mu);
    for (auto [first, bytes] : held_ranges) {
      if (client >= first && client < first + bytes) return true;
    }
    return false;
  }
  std::set<char*> mapped_hosts;  // host ranges registered mapped (ticket pages), not yet released
};

// One in-order stream: a thread executing queued operations.
class FakeStream {
 public:
  FakeStream() : thread_([this] { Run(); }) {}
  ~FakeStream() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Push(std::function<bool()> op) {  // op returns false while it must wait
    {
      std::lock_guard lock(mu_);
      ops_.push_back(std::move(op));
    }
    cv_.notify_all();
  }
  bool Idle() {
    std::lock_guard lock(mu_);
    return ops_.empty();
  }

 private:
  void Run() {
    for (;;) {
      std::function<bool()> op;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !ops_.empty(); });
        if (stop_) return;
        op = ops_.front();
      }
      while (!op()) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
        std::lock_guard lock(mu_);
        if (stop_) return;
      }
      std::lock_guard lock(mu_);
      ops_.pop_front();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<bool()>> ops_;
  bool stop_ = false;
  std::thread thread_;
};

class FakeRuntime;

class FakeMapping final : public DeviceMapping {
 public:
  FakeMapping(FakeRuntime& runtime, char* base, uint64_t bytes, int device)
      : runtime_(runtime), base_(base), bytes_(bytes), device_(device) {}
  ~FakeMapping() override;  // closing client memory synchronizes implicitly (see FakeRuntime)
  char* base() const override { return base_; }
  uint64_t bytes() const override { return bytes_; }
  int device() const override { return device_; }

 private:
  FakeRuntime& runtime_;
  char* base_;
  uint64_t bytes_;
  int device_;  // the GPU the import named (the fake has as many as asked for)
};

// "Device" memory is host memory; an IPC handle carries the pointer.
class FakeRuntime final : public GpuRuntime {
 public:
  explicit FakeRuntime(Observed& observed) : observed_(observed) {}

  absl::string_view name() const override { return "fake"; }
  absl::Status SetDevice(int) override {
    Call call(*this, GpuCallClass::kEnqueue, "SetDevice");
    return absl::OkStatus();
  }
  absl::StatusOr<GpuStream> CreateStream(int, bool) override {
    Call call(*this, GpuCallClass::kSetup, "CreateStream");
    auto* stream = new FakeStream();
    std::lock_guard lock(streams_mu_);
    streams_.insert(stream);
    return stream;
  }
  void DestroyStream(int, GpuStream stream) override {
    Call call(*this, GpuCallClass::kRelease, "DestroyStream");
    {
      std::lock_guard lock(streams_mu_);
      streams_.erase(static_cast<FakeStream*>(stream));
    }
    delete static_cast<FakeStream*>(stream);
  }
  absl::StatusOr<bool> StreamDone(int, GpuStream stream) override {
    Call call(*this, GpuCallClass::kEnqueue, "StreamDone");
    return static_cast<FakeStream*>(stream)->Idle();
  }
  absl::Status WaitValue64(GpuStream stream, uint64_t addr, uint64_t value) override {
    Call call(*this, GpuCallClass::kEnqueue, "WaitValue64");
    {
      std::lock_guard lock(observed_.mu);
      observed_.wait_targets.insert(addr);
    }
    static_cast<FakeStream*>(stream)->Push([addr, value] { return Load(addr) >= value; });
    return absl::OkStatus();
  }
  absl::Status WriteValue64(GpuStream stream, uint64_t addr, uint64_t value) override {
    Call call(*this, GpuCallClass::kEnqueue, "WriteValue64");
    {
      std::lock_guard lock(observed_.mu);
      observed_.write_targets.push_back(addr);
    }
    static_cast<FakeStream*>(stream)->Push([addr, value] {
      Store(addr, value);
      return true;
    });
    return absl::OkStatus();
  }
  absl::Status CopyAsync(GpuStream stream, Direction direction, char* client, char* pool,
                         uint64_t len) override {
    Call call(*this, GpuCallClass::kEnqueue, "CopyAsync");
    {
      std::lock_guard lock(observed_.mu);
      observed_.copies.push_back({client, len});
    }
    static_cast<FakeStream*>(stream)->Push([=, this] {
      if (observed_.hold_copies.load() || observed_.Held(client)) return false;
      std::lock_guard lock(memory_mu);
      if (direction == Direction::kToPool) {
        std::memcpy(pool, client, len);
      } else {
        std::memcpy(client, pool, len);
      }
      return true;
    });
    return absl::OkStatus();
  }
  absl::Status CopyBatchAsync(GpuStream stream, Direction direction,
                              absl::Span<const CopyOp> ops) override {
    {
      std::lock_guard lock(observed_.mu);
      observed_.batch_calls.push_back(ops.size());
    }
    return GpuRuntime::CopyBatchAsync(stream, direction, ops);
  }
  absl::Status HostCopyAsync(GpuStream stream, char* dst, const char* src, uint64_t len) override {
    Call call(*this, GpuCallClass::kEnqueue, "HostCopyAsync");
    static_cast<FakeStream*>(stream)->Push([=] {
      std::lock_guard lock(memory_mu);
      std::memcpy(dst, src, len);
      return true;
    });
    return absl::OkStatus();
  }
  absl::StatusOr<MappedHost> AllocMappedHost(uint64_t bytes) override {
    Call call(*this, GpuCallClass::kSetup, "AllocMappedHost");
    void* p = std::aligned_alloc(4096, bytes);
    std::memset(p, 0, bytes);
    return MappedHost{p, reinterpret_cast<uint64_t>(p)};
  }
  void FreeMappedHost(void* host) override { std::free(host); }  // engine teardown only
  absl::Status RegisterHost(char*, uint64_t) override {
    Call call(*this, GpuCallClass::kSetup, "RegisterHost");
    return absl::OkStatus();
  }
  absl::Status RegisterMappedHost(char* base, uint64_t) override {
    Call call(*this, GpuCallClass::kSetup, "RegisterMappedHost");
    std::lock_guard lock(observed_.mu);
    observed_.mapped_hosts.insert(base);
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> HostDeviceAddress(int, char* host) override {
    Call call(*this, GpuCallClass::kSetup, "HostDeviceAddress");
    return reinterpret_cast<uint64_t>(host);
  }
  void UnregisterHost(char* base) override {
    ImplicitSync("UnregisterHost");
    std::lock_guard lock(observed_.mu);
    observed_.mapped_hosts.erase(base);
  }
  absl::StatusOr<int> FindDevice(const BufferImport& import) override {
    Call call(*this, GpuCallClass::kSetup, "FindDevice");
    if (import.device_uuid[0] == 0xFF) return absl::FailedPreconditionError("no such GPU");
    return import.device;
  }
  absl::StatusOr<std::unique_ptr<DeviceMapping>> Open(BufferImport& import) override {
    Call call(*this, GpuCallClass::kSetup, "Open");
    char* base = nullptr;
    std::memcpy(&base, import.ipc_handle.data(), sizeof(base));
    if (base == nullptr) return absl::InvalidArgumentError("bad fake handle");
    return std::make_unique<FakeMapping>(*this, base, import.bytes, import.device);
  }

  // As cudaIpcCloseMemHandle on the H100: takes the driver lock exclusively and waits until every
  // stream of the process is idle.
  void ImplicitSync(const char* what) {
    Check(GpuCallClass::kRelease, what);
    std::unique_lock lock(driver_);
    for (;;) {
      bool idle = true;
      {
        std::lock_guard streams(streams_mu_);
        for (FakeStream* s : streams_) idle = idle && s->Idle();
      }
      if (idle) return;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

 private:
  // Every call holds the driver lock shared, and is checked against the thread rule.
  class Call {
   public:
    Call(FakeRuntime& runtime, GpuCallClass cls, const char* what) : lock_(runtime.driver_) {
      runtime.Check(cls, what);
    }

   private:
    std::shared_lock<std::shared_mutex> lock_;
  };

  void Check(GpuCallClass cls, const char* what) {
    ThreadRole role = CurrentThreadRole();
    if (MayCall(role, cls)) return;
    std::lock_guard lock(observed_.mu);
    observed_.rule_violations.push_back(absl::StrCat(what, " (", GpuCallClassName(cls),
                                                     ") on a ", ThreadRoleName(role), " thread"));
  }

  Observed& observed_;
  std::shared_mutex driver_;
  std::mutex streams_mu_;
  std::set<FakeStream*> streams_;
};

FakeMapping::~FakeMapping() { runtime_.ImplicitSync("closing client memory"); }

constexpr uint64_t kLen = 1 << 16;

struct Completion {
  std::promise<absl::Status> promise;
  std::future<absl::Status> future = promise.get_future();
  absl::AnyInvocable<void(absl::Status) &&> Callback() {
    return [this](absl::Status s) { promise.set_value(std::move(s)); };
  }
  bool Ready(int ms) {
    return future.wait_for(std::chrono::milliseconds(ms)) == std::future_status::ready;
  }
};

// Runs `fn` on a thread that takes `role`, as the daemon's threads do, and waits for it.
template <typename Fn>
void OnThread(ThreadRole role, Fn fn) {
  std::thread([&] {
    SetThreadRole(role);
    fn();
  }).join();
}

// One client session as the engine sees it: ticket page (with the done words), three buffers.
struct FakeClient {
  ring::TicketPage tickets;
  std::vector<char> memory[3];
  std::unique_ptr<EngineSession> session;
  std::unique_ptr<ImportedBuffer> semaphores;
  std::vector<std::unique_ptr<ImportedBuffer>> buffers;

  void SetTicket(Direction d, uint64_t v) {
    (d == Direction::kToPool ? tickets.slots[0].produced : tickets.slots[0].reload_ready)
        .value.store(v);
  }
  uint64_t DoneAddr(Direction d) {
    return reinterpret_cast<uint64_t>(
        &(d == Direction::kToPool ? tickets.slots[0].offload_done : tickets.slots[0].reload_done)
             .value);
  }
  uint64_t Done(Direction d) { return Load(DoneAddr(d)); }
};

class StreamEngineTest : public ::testing::Test {
 protected:
  void Start(uint64_t delay_us = 0, uint32_t lane_wait_warn_ms = 10000,
             uint64_t lane_window_bytes = 0) {
    GpuEngineOptions options;
    options.copy_delay_us = delay_us;
    options.lane_window_bytes = lane_window_bytes;
    options.shutdown_grace_ms = 2000;
    options.lane_wait_warn_ms = lane_wait_warn_ms;
    auto runtime = std::make_unique<FakeRuntime>(observed_);
    runtime_ = runtime.get();
    engine_ = MakeStreamEngine(std::move(runtime), options);
    pool_.assign(4 * kLen, 0);
    ASSERT_NO_FATAL_FAILURE(Open(a_, 7));
  }

  void Open(FakeClient& c, uint64_t id, bool semaphores = true, int device = 0) {
    EngineSessionInfo info;
    info.id = id;
    info.label = absl::StrCat("session ", id);
    info.tickets = &c.tickets;
    c.session = *engine_->OpenSession(info);
    if (semaphores) {
      absl::StatusOr<std::unique_ptr<ImportedBuffer>> slot = BindSlot(c);
      ASSERT_TRUE(slot.ok()) << slot.status();
      c.semaphores = *std::move(slot);
    }
    for (auto& m : c.memory) {
      m.assign(kLen, 0);
      absl::StatusOr<std::unique_ptr<ImportedBuffer>> b =
          Import(c, wire::BufferKind::kCudaIpc, m.data(), kLen, device);
      ASSERT_TRUE(b.ok()) << b.status();
      c.buffers.push_back(*std::move(b));
    }
  }

  void Close(FakeClient& c) {
    if (c.session) engine_->AbandonSession(c.session.get());
    c.buffers.clear();
    c.semaphores.reset();
    c.session.reset();
  }

  void TearDown() override {
    Close(a_);
    Close(b_);
    engine_.reset();
    std::lock_guard lock(observed_.mu);
    for (const std::string& v : observed_.rule_violations) ADD_FAILURE() << "rule: " << v;
    // The rule that keeps tierd out of deadlocks: no stream waits on a client's words.
    for (FakeClient* c : {&a_, &b_}) {
      auto lo = reinterpret_cast<uint64_t>(&c->tickets);
      for (uint64_t addr : observed_.wait_targets) {
        EXPECT_FALSE(addr >= lo && addr < lo + sizeof(c->tickets))
            << "a tierd stream waited on a client's ticket page";
      }
    }
    // Every ticket page registered for the done writes was unregistered by the engine's end.
    EXPECT_TRUE(observed_.mapped_hosts.empty()) << "a session's ticket page stayed registered";
  }

  void Hold(const std::vector<char>& memory) {
    std::lock_guard lock(observed_.mu);
    observed_.held_ranges.push_back({memory.data(), memory.size()});
  }
  void ReleaseHeld() {
    std::lock_guard lock(observed_.mu);
    observed_.held_ranges.clear();
  }
  size_t Issued() {
    std::lock_guard lock(observed_.mu);
    return observed_.copies.size();
  }
  // Waits (bounded) until `n` copies were issued.
  bool AwaitIssued(size_t n) {
    for (int i = 0; i < 2000 && Issued() < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return Issued() >= n;
  }
  // Puts b_'s D2H lane on the link for good (a copy from its buffer 2 held on its stream) and
  // waits until that copy is issued: the link is shared from then on (LinkShare).
  void KeepBOnTheLink(Completion& done, Direction d = Direction::kToPool, uint64_t len = kLen) {
    Hold(b_.memory[2]);
    b_.SetTicket(d, 1);
    const size_t before = Issued();
    CopyJob job = Job(b_, d, 2, 3, 1, done);
    job.len = len;
    Submit(std::move(job));
    ASSERT_TRUE(AwaitIssued(before + 1));
  }

  // Binds the client's ticket slot of GPU 0 (BufferKind kCudaSemaphores: no memory).
  absl::StatusOr<std::unique_ptr<ImportedBuffer>> BindSlot(FakeClient& c, uint8_t uuid0 = 0) {
    BufferImport import;
    import.kind = wire::BufferKind::kCudaSemaphores;
    import.device = 0;
    import.bytes = 0;
    import.device_uuid[0] = uuid0;
    return engine_->Import(c.session.get(), std::move(import));
  }

  absl::StatusOr<std::unique_ptr<ImportedBuffer>> Import(FakeClient& c, wire::BufferKind kind,
                                                         char* base, uint64_t bytes,
                                                         int device = 0) {
    BufferImport import;
    import.kind = kind;
    import.device = device;
    import.bytes = bytes;
    std::memcpy(import.ipc_handle.data(), &base, sizeof(base));
    return engine_->Import(c.session.get(), std::move(import));
  }

  CopyJob Job(FakeClient& c, Direction d, int buffer, int slot, uint64_t sync, Completion& done) {
    CopyJob job;
    job.direction = d;
    job.client = c.memory[buffer].data();
    job.pool = pool_.data() + slot * kLen;
    job.len = kLen;
    job.session = c.session.get();
    job.sync = sync;
    job.done = done.Callback();
    return job;
  }

  // Submits as the daemon does: from the ring poller, which may make no runtime call.
  void Submit(CopyJob job) {
    OnThread(ThreadRole::kRingPoller, [&] { engine_->Submit(std::move(job)); });
  }

  bool PoolHolds(int slot, char byte) {
    std::lock_guard lock(memory_mu);
    for (uint64_t i = 0; i < kLen; ++i) {
      if (pool_[slot * kLen + i] != byte) return false;
    }
    return true;
  }

  Observed observed_;
  FakeRuntime* runtime_ = nullptr;
  std::unique_ptr<CopyEngine> engine_;
  std::vector<char> pool_;
  FakeClient a_;
  FakeClient b_;
};

TEST_F(StreamEngineTest, OffloadWaitsForTicketAndSignalsDone) {
  Start();
  std::memset(a_.memory[0].data(), 0x11, kLen);
  Completion done;
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, done));
  EXPECT_FALSE(done.Ready(50));  // produced is still 0
  {
    std::lock_guard lock(memory_mu);
    std::memset(a_.memory[0].data(), 0x77, kLen);  // the producer finishes...
  }
  a_.SetTicket(Direction::kToPool, 1);  // ...and its ticket lands
  ASSERT_TRUE(done.Ready(5000));
  EXPECT_TRUE(done.future.get().ok());
  EXPECT_TRUE(PoolHolds(0, 0x77));
  EXPECT_EQ(a_.Done(Direction::kToPool), 1u);
}

TEST_F(StreamEngineTest, ReloadSignalsReloadDone) {
  Start();
  std::memset(pool_.data(), 0x5C, kLen);
  a_.SetTicket(Direction::kFromPool, 1);
  Completion done;
  Submit(Job(a_, Direction::kFromPool, 1, 0, 1, done));
  ASSERT_TRUE(done.Ready(5000));
  EXPECT_TRUE(done.future.get().ok());
  EXPECT_EQ(a_.Done(Direction::kFromPool), 1u);
  EXPECT_EQ(a_.memory[1][kLen - 1], 0x5C);
}

TEST_F(StreamEngineTest, LaterTicketIsHeldUntilEarlierArrives) {
  Start();
  a_.SetTicket(Direction::kToPool, 2);
  std::memset(a_.memory[0].data(), 0x01, kLen);
  std::memset(a_.memory[1].data(), 0x02, kLen);
  Completion first, second;
  Submit(Job(a_, Direction::kToPool, 1, 1, 2, second));
  EXPECT_FALSE(second.Ready(50));
  EXPECT_EQ(a_.Done(Direction::kToPool), 0u);  // done = 2 would claim ticket 1 done too
  std::vector<LaneStatus> lanes = engine_->Lanes(a_.session.get());
  ASSERT_EQ(lanes.size(), 2u);
  EXPECT_EQ(lanes[0].held, 1u);
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, first));
  ASSERT_TRUE(first.Ready(5000));
  ASSERT_TRUE(second.Ready(5000));
  EXPECT_TRUE(PoolHolds(0, 0x01));
  EXPECT_TRUE(PoolHolds(1, 0x02));
  EXPECT_EQ(a_.Done(Direction::kToPool), 2u);

  Completion again;
  Submit(Job(a_, Direction::kToPool, 0, 2, 2, again));  // a ticket used twice
  ASSERT_TRUE(again.Ready(1000));
  EXPECT_EQ(again.future.get().code(), absl::StatusCode::kInvalidArgument);
}

// A batch: three offloads under one ticket. Nothing is issued until all three arrived (the
// ticket is already there); then the three copies go to the runtime in one call and the ticket
// is signalled once, after them.
TEST_F(StreamEngineTest, BatchIsIssuedOnceCompleteAndSignalledOnce) {
  Start();
  for (int b = 0; b < 3; ++b) std::memset(a_.memory[b].data(), 0x21 + b, kLen);
  a_.SetTicket(Direction::kToPool, 1);
  Completion done[3];
  for (int b = 0; b < 2; ++b) {
    CopyJob job = Job(a_, Direction::kToPool, b, b, 1, done[b]);
    job.batch_size = 3;
    Submit(std::move(job));
  }
  EXPECT_FALSE(done[0].Ready(50)) << "a batch was issued before all of its jobs arrived";
  EXPECT_EQ(a_.Done(Direction::kToPool), 0u);
  EXPECT_EQ(engine_->Lanes(a_.session.get())[0].held, 2u);
  CopyJob last = Job(a_, Direction::kToPool, 2, 2, 1, done[2]);
  last.batch_size = 3;
  Submit(std::move(last));
  for (auto& d : done) {
    ASSERT_TRUE(d.Ready(5000));
    EXPECT_TRUE(d.future.get().ok());
  }
  for (int b = 0; b < 3; ++b) EXPECT_TRUE(PoolHolds(b, static_cast<char>(0x21 + b)));
  EXPECT_EQ(a_.Done(Direction::kToPool), 1u);
  std::lock_guard lock(observed_.mu);
  EXPECT_EQ(std::count(observed_.write_targets.begin(), observed_.write_targets.end(),
                       a_.DoneAddr(Direction::kToPool)),
            1);
  EXPECT_NE(std::find(observed_.batch_calls.begin(), observed_.batch_calls.end(), 3u),
            observed_.batch_calls.end())
      << "the batch's copies did not go to the runtime in one call";
}

// A batch's jobs may reach the engine out of order with other tickets (the daemon holds a reload
// of a spilled object back): ticket 2 waits for the whole batch 1, and an entry beyond the
// batch's size is refused without disturbing it.
TEST_F(StreamEngineTest, BatchHoldsLaterTicketsAndRefusesExtraEntries) {
  Start();
  std::memset(pool_.data(), 0x61, 3 * kLen);
  a_.SetTicket(Direction::kFromPool, 2);
  Completion batch[2], after, extra;
  Submit(Job(a_, Direction::kFromPool, 2, 2, 2, after));  // ticket 2, lone
  CopyJob first = Job(a_, Direction::kFromPool, 0, 0, 1, batch[0]);
  first.batch_size = 2;
  Submit(std::move(first));
  EXPECT_FALSE(after.Ready(50));
  EXPECT_EQ(a_.Done(Direction::kFromPool), 0u);
  CopyJob second = Job(a_, Direction::kFromPool, 1, 1, 1, batch[1]);
  second.batch_size = 2;
  Submit(std::move(second));
  for (Completion* c : {&batch[0], &batch[1], &after}) {
    ASSERT_TRUE(c->Ready(5000));
    EXPECT_TRUE(c->future.get().ok());
  }
  EXPECT_EQ(a_.Done(Direction::kFromPool), 2u);
  EXPECT_EQ(a_.memory[0][kLen - 1], 0x61);
  EXPECT_EQ(a_.memory[1][0], 0x61);
  CopyJob late = Job(a_, Direction::kFromPool, 0, 0, 1, extra);
  late.batch_size = 2;
  Submit(std::move(late));
  ASSERT_TRUE(extra.Ready(1000));
  EXPECT_EQ(extra.future.get().code(), absl::StatusCode::kInvalidArgument);
}

// A rejected job of a batch reaches the engine as a ticket-only job: the batch still completes,
// and the ticket is still signalled.
TEST_F(StreamEngineTest, BatchWithATicketOnlyMemberStillSignals) {
  Start();
  std::memset(a_.memory[0].data(), 0x71, kLen);
  a_.SetTicket(Direction::kToPool, 1);
  Completion copied, rejected;
  CopyJob job = Job(a_, Direction::kToPool, 0, 0, 1, copied);
  job.batch_size = 2;
  Submit(std::move(job));
  CopyJob ticket_only;
  ticket_only.direction = Direction::kToPool;
  ticket_only.session = a_.session.get();
  ticket_only.sync = 1;
  ticket_only.batch_size = 2;
  ticket_only.device = 0;
  ticket_only.done = rejected.Callback();
  Submit(std::move(ticket_only));
  ASSERT_TRUE(copied.Ready(5000));
  ASSERT_TRUE(rejected.Ready(5000));
  EXPECT_TRUE(copied.future.get().ok());
  EXPECT_TRUE(PoolHolds(0, 0x71));
  EXPECT_EQ(a_.Done(Direction::kToPool), 1u);
}

TEST_F(StreamEngineTest, AbandonCancelsAPartialBatch) {
  Start();
  a_.SetTicket(Direction::kToPool, 1);
  Completion first;
  CopyJob job = Job(a_, Direction::kToPool, 0, 0, 1, first);
  job.batch_size = 4;
  Submit(std::move(job));
  EXPECT_FALSE(first.Ready(50));
  engine_->AbandonSession(a_.session.get());
  ASSERT_TRUE(first.Ready(5000));
  EXPECT_EQ(first.future.get().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(PoolHolds(0, 0));
}

// Jobs issued in one pass of the worker complete through one `completed` write: many lone jobs
// whose tickets are all there take fewer completion writes than jobs.
TEST_F(StreamEngineTest, OneCompletionWritePerPass) {
  Start();
  a_.SetTicket(Direction::kToPool, 64);
  std::vector<Completion> done(64);
  // Queued while the lane waits for a smaller ticket, then released at once.
  for (uint64_t t = 64; t >= 2; --t) {
    Submit(Job(a_, Direction::kToPool, t % 3, t % 4, t, done[t - 1]));
  }
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, done[0]));
  for (auto& d : done) {
    ASSERT_TRUE(d.Ready(5000));
    EXPECT_TRUE(d.future.get().ok());
  }
  EXPECT_EQ(a_.Done(Direction::kToPool), 64u);
  std::lock_guard lock(observed_.mu);
  size_t done_writes = std::count(observed_.write_targets.begin(), observed_.write_targets.end(),
                                  a_.DoneAddr(Direction::kToPool));
  EXPECT_EQ(done_writes, 64u);  // lone tickets: one each
  EXPECT_LT(observed_.write_targets.size() - done_writes, 64u);
}

// The lane's window, while another session's lane of the GPU has work: a copy larger than it
// goes in chunks of a quarter of it, at most a window's worth on the stream at once, each chunk
// completed on its own; the job completes once, whole, with one done write. The other lane here
// waits for its client's ticket.
TEST_F(StreamEngineTest, ACopyLargerThanTheWindowGoesInChunksWhileTheLinkIsShared) {
  Start(0, 10000, kLen / 2);
  ASSERT_NO_FATAL_FAILURE(Open(b_, 8));
  Completion waiting;
  ASSERT_NO_FATAL_FAILURE(KeepBOnTheLink(waiting));  // copy 0: b's, held on its stream
  for (uint64_t i = 0; i < kLen; ++i) a_.memory[0][i] = static_cast<char>(i * 7);
  a_.SetTicket(Direction::kToPool, 1);
  Completion done;
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, done));
  ASSERT_TRUE(done.Ready(5000));
  EXPECT_TRUE(done.future.get().ok());
  EXPECT_EQ(std::memcmp(pool_.data(), a_.memory[0].data(), kLen), 0);
  EXPECT_EQ(a_.Done(Direction::kToPool), 1u);
  {
    std::lock_guard lock(observed_.mu);
    ASSERT_EQ(observed_.copies.size(), 9u);
    for (size_t i = 1; i < observed_.copies.size(); ++i) {
      EXPECT_EQ(observed_.copies[i].first, a_.memory[0].data() + (i - 1) * (kLen / 8));
      EXPECT_EQ(observed_.copies[i].second, kLen / 8);
    }
    EXPECT_EQ(std::count(observed_.write_targets.begin(), observed_.write_targets.end(),
                         a_.DoneAddr(Direction::kToPool)),
              1);
  }
  ReleaseHeld();
  ASSERT_TRUE(waiting.Ready(5000));
  EXPECT_TRUE(waiting.future.get().ok());
}

// Finding 17 (issue 30): a lane that only waits for its client's ticket is not on the link: it
// does not force the window on another session (it used to, for as long as the ticket stayed
// away).
TEST_F(StreamEngineTest, ALaneWaitingForATicketDoesNotWindowAnother) {
  Start(0, 10000, kLen / 2);
  ASSERT_NO_FATAL_FAILURE(Open(b_, 8));
  Completion waiting;
  Submit(Job(b_, Direction::kToPool, 0, 1, 1, waiting));  // its ticket never comes (here)
  a_.SetTicket(Direction::kToPool, 1);
  Completion done;
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, done));
  ASSERT_TRUE(done.Ready(5000));
  {
    std::lock_guard lock(observed_.mu);
    ASSERT_EQ(observed_.copies.size(), 1u);
    EXPECT_EQ(observed_.copies[0].second, kLen);
  }
  b_.SetTicket(Direction::kToPool, 1);
  ASSERT_TRUE(waiting.Ready(5000));
}

// A session alone on the GPU is never held back by the window: its copy goes whole.
TEST_F(StreamEngineTest, ALaneAloneIgnoresTheWindow) {
  Start(0, 10000, kLen / 2);
  a_.SetTicket(Direction::kToPool, 1);
  Completion done;
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, done));
  ASSERT_TRUE(done.Ready(5000));
  EXPECT_TRUE(done.future.get().ok());
  std::lock_guard lock(observed_.mu);
  ASSERT_EQ(observed_.copies.size(), 1u);
  EXPECT_EQ(observed_.copies[0].second, kLen);
}

// Two sessions on one GPU: while the first one's large copy fills its window (its copies held
// on the stream), the second one's copy is issued ahead of the first one's remaining chunks,
// instead of behind all of them. Both land whole.
TEST_F(StreamEngineTest, TheWindowLetsAnotherSessionsCopyAheadOfALargeOne) {
  Start(0, 10000, kLen / 2);
  ASSERT_NO_FATAL_FAILURE(Open(b_, 8));
  for (uint64_t i = 0; i < kLen; ++i) a_.memory[0][i] = static_cast<char>(i * 3);
  std::memset(b_.memory[0].data(), 0x4B, kLen);
  Completion on_link, big, small;
  // Copy 0, small: b's second copy below still fits its own window.
  ASSERT_NO_FATAL_FAILURE(KeepBOnTheLink(on_link, Direction::kToPool, kLen / 8));
  Hold(a_.memory[0]);  // a's chunks stay in flight: its window fills
  a_.SetTicket(Direction::kToPool, 1);
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, big));
  ASSERT_TRUE(AwaitIssued(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(Issued(), 5u) << "the first lane issued more than its window";
  CopyJob job = Job(b_, Direction::kToPool, 0, 1, 2, small);
  job.len = kLen / 8;
  b_.SetTicket(Direction::kToPool, 2);
  Submit(std::move(job));
  ASSERT_TRUE(AwaitIssued(6));
  {
    std::lock_guard lock(observed_.mu);
    ASSERT_EQ(observed_.copies.size(), 6u);
    EXPECT_EQ(observed_.copies[5].first, b_.memory[0].data())
        << "the second session's copy waited behind the first one's chunks";
  }
  ReleaseHeld();
  ASSERT_TRUE(big.Ready(5000));
  ASSERT_TRUE(small.Ready(5000));
  ASSERT_TRUE(on_link.Ready(5000));
  EXPECT_TRUE(big.future.get().ok());
  EXPECT_TRUE(small.future.get().ok());
  EXPECT_EQ(std::memcmp(pool_.data(), a_.memory[0].data(), kLen), 0);
  EXPECT_EQ(std::memcmp(pool_.data() + kLen, b_.memory[0].data(), kLen / 8), 0);
  EXPECT_EQ(a_.Done(Direction::kToPool), 1u);
  EXPECT_EQ(b_.Done(Direction::kToPool), 2u);
}

// A reload of pool bytes an offload is still writing in chunks waits for the whole offload: it
// is issued after the offload's last chunk and waits on the GPU for it.
TEST_F(StreamEngineTest, AReloadWaitsForEveryChunkOfTheOffloadItReads) {
  Start(0, 10000, kLen / 2);
  ASSERT_NO_FATAL_FAILURE(Open(b_, 8));
  Completion waiting[2];
  ASSERT_NO_FATAL_FAILURE(KeepBOnTheLink(waiting[0], Direction::kToPool));  // both directions
  ASSERT_NO_FATAL_FAILURE(KeepBOnTheLink(waiting[1], Direction::kFromPool));
  for (uint64_t i = 0; i < kLen; ++i) a_.memory[0][i] = static_cast<char>(i * 5 + 1);
  a_.SetTicket(Direction::kToPool, 1);
  a_.SetTicket(Direction::kFromPool, 1);
  Completion offload, reload;
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, offload));
  Submit(Job(a_, Direction::kFromPool, 1, 0, 1, reload));
  ASSERT_TRUE(offload.Ready(5000));
  ASSERT_TRUE(reload.Ready(5000));
  EXPECT_TRUE(offload.future.get().ok());
  EXPECT_TRUE(reload.future.get().ok());
  EXPECT_EQ(std::memcmp(a_.memory[1].data(), a_.memory[0].data(), kLen), 0);
  {
    std::lock_guard lock(observed_.mu);
    EXPECT_GE(observed_.copies.size(), 16u) << "the copies were not chunked";
  }
  ReleaseHeld();
  for (auto& w : waiting) ASSERT_TRUE(w.Ready(5000));
}

TEST_F(StreamEngineTest, TicketOnlyJobSignals) {
  Start();
  a_.SetTicket(Direction::kFromPool, 1);
  Completion done;
  CopyJob job;
  job.direction = Direction::kFromPool;
  job.len = 0;
  job.session = a_.session.get();
  job.sync = 1;
  job.done = done.Callback();
  Submit(std::move(job));
  ASSERT_TRUE(done.Ready(5000));
  EXPECT_TRUE(done.future.get().ok());
  EXPECT_EQ(a_.Done(Direction::kFromPool), 1u);
}

// A reload of pool bytes an offload is still filling waits for that offload: on the host until
// the offload is issued, then on the "GPU" for its copy.
TEST_F(StreamEngineTest, ReloadWaitsForOffloadIntoSamePoolBytes) {
  Start();
  std::memset(a_.memory[0].data(), 0x42, kLen);
  Completion offload, reload;
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, offload));  // waits: produced = 0
  Submit(Job(a_, Direction::kFromPool, 1, 0, 0, reload));
  EXPECT_FALSE(reload.Ready(50));
  a_.SetTicket(Direction::kToPool, 1);
  ASSERT_TRUE(offload.Ready(5000));
  ASSERT_TRUE(reload.Ready(5000));
  EXPECT_EQ(a_.memory[1][0], 0x42);
  EXPECT_EQ(a_.memory[1][kLen - 1], 0x42);
}

// The same while the offload waits for a smaller ticket (held): the reload, submitted after it,
// must still wait for it, though the offload reaches its lane's queue only later.
TEST_F(StreamEngineTest, ReloadWaitsForAHeldOffloadIntoSamePoolBytes) {
  Start();
  std::memset(a_.memory[0].data(), 0x33, kLen);
  a_.SetTicket(Direction::kToPool, 2);
  Completion second, first, reload;
  Submit(Job(a_, Direction::kToPool, 0, 0, 2, second));  // held: ticket 1 has not arrived
  Submit(Job(a_, Direction::kFromPool, 1, 0, 0, reload));
  EXPECT_FALSE(reload.Ready(50)) << "the reload read pool bytes before the offload wrote them";
  Submit(Job(a_, Direction::kToPool, 2, 1, 1, first));
  ASSERT_TRUE(second.Ready(5000));
  ASSERT_TRUE(reload.Ready(5000));
  EXPECT_EQ(a_.memory[1][0], 0x33);
  EXPECT_EQ(a_.memory[1][kLen - 1], 0x33);
  ASSERT_TRUE(first.Ready(5000));
}

// Issue 26, item 3: GPUs share one engine, never a wait. A session on GPU 0 whose client stopped
// (its offloads and a reload of their pool bytes wait in GPU 0's lanes for tickets that do not
// come) does not hold a session on GPU 1: its offload and the reload right behind it, into and out
// of the same pool bytes, complete (each within a deadline, no sleep). GPU 0's jobs then go on
// once their tickets arrive.
TEST_F(StreamEngineTest, AStalledSessionOnOneGpuDoesNotHoldAnotherGpusJobs) {
  Start();
  std::vector<Completion> stalled(3);
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, stalled[0]));
  Submit(Job(a_, Direction::kToPool, 1, 1, 2, stalled[1]));
  Submit(Job(a_, Direction::kFromPool, 2, 0, 1, stalled[2]));  // behind offload 0's pool bytes
  ASSERT_NO_FATAL_FAILURE(Open(b_, 8, /*semaphores=*/false, /*device=*/1));
  std::memset(b_.memory[0].data(), 0x5A, kLen);
  for (int round = 0; round < 20; ++round) {
    Completion offload, reload;
    Submit(Job(b_, Direction::kToPool, 0, 3, 0, offload));
    Submit(Job(b_, Direction::kFromPool, 1, 3, 0, reload));
    ASSERT_TRUE(offload.Ready(5000)) << "GPU 1's offload waited for GPU 0's stalled lanes";
    ASSERT_TRUE(reload.Ready(5000)) << "GPU 1's reload waited for GPU 0's stalled lanes";
    EXPECT_TRUE(offload.future.get().ok());
    EXPECT_TRUE(reload.future.get().ok());
  }
  EXPECT_EQ(b_.memory[1][0], 0x5A);
  EXPECT_EQ(b_.memory[1][kLen - 1], 0x5A);
  for (Completion& c : stalled) EXPECT_FALSE(c.Ready(0)) << "GPU 0's jobs did not wait";
  a_.SetTicket(Direction::kToPool, 2);
  a_.SetTicket(Direction::kFromPool, 1);
  for (Completion& c : stalled) ASSERT_TRUE(c.Ready(5000));
}

// Delay injection: the copy is issued copy_delay_us after its ticket arrived, so a client that
// overwrites the source without waiting for offload_done deterministically changes the result.
TEST_F(StreamEngineTest, DelayStartsCopyLate) {
  Start(/*delay_us=*/100000);
  std::memset(a_.memory[0].data(), 0x10, kLen);
  a_.SetTicket(Direction::kToPool, 1);
  Completion done;
  auto start = std::chrono::steady_clock::now();
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, done));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // well inside the delay
  {
    std::lock_guard lock(memory_mu);
    std::memset(a_.memory[0].data(), 0x20, kLen);  // the early reuse a missing wait would allow
  }
  ASSERT_TRUE(done.Ready(5000));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
  EXPECT_TRUE(PoolHolds(0, 0x20));
}

// Waits (briefly) until `pred` holds.
template <typename Pred>
bool Eventually(Pred pred) {
  for (int i = 0; i < 5000; ++i) {
    {
      std::lock_guard lock(memory_mu);
      if (pred()) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// A reload whose pool bytes arrive in chunks (from NVMe): each chunk reaches the client as soon
// as the feed has it, before the rest has arrived; the job completes once, after the end.
TEST_F(StreamEngineTest, FedReloadCopiesEachChunkAsItArrives) {
  Start();
  constexpr uint64_t kChunk = kLen / 4;
  a_.SetTicket(Direction::kFromPool, 1);
  auto feed = std::make_shared<SourceFeed>(kLen, kChunk);
  Completion done;
  CopyJob job = Job(a_, Direction::kFromPool, 0, 0, 1, done);
  job.feed = feed;
  Submit(std::move(job));
  EXPECT_FALSE(done.Ready(30));
  for (uint64_t i = 0; i < 3; ++i) {
    std::memset(pool_.data() + i * kChunk, 0x40 + static_cast<int>(i), kChunk);
    OnThread(ThreadRole::kSpillIo, [&] { feed->Advance((i + 1) * kChunk); });
    ASSERT_TRUE(Eventually([&] { return a_.memory[0][i * kChunk + kChunk - 1] == 0x40 + int(i); }))
        << "chunk " << i << " was not copied on arrival";
    EXPECT_EQ(a_.memory[0][(i + 1) * kChunk], 0) << "chunk " << i + 1 << " copied before it arrived";
    EXPECT_FALSE(done.Ready(0));
  }
  std::memset(pool_.data() + 3 * kChunk, 0x43, kChunk);
  OnThread(ThreadRole::kSpillIo, [&] { feed->End(absl::OkStatus()); });
  ASSERT_TRUE(done.Ready(5000));
  EXPECT_TRUE(done.future.get().ok());
  EXPECT_EQ(a_.memory[0][kLen - 1], 0x43);
  EXPECT_EQ(a_.Done(Direction::kFromPool), 1u);
}

// The feed ends in an error half way: the job fails with it, the client's stream is still
// released (done written), and past the verified chunks the client gets the zeros the producer
// left, never other bytes.
TEST_F(StreamEngineTest, FedReloadEndingInAnErrorFailsButReleasesTheTicket) {
  Start();
  constexpr uint64_t kChunk = kLen / 4;
  std::memset(a_.memory[1].data(), 0x7F, kLen);
  a_.SetTicket(Direction::kFromPool, 1);
  auto feed = std::make_shared<SourceFeed>(kLen, kChunk);
  Completion done;
  CopyJob job = Job(a_, Direction::kFromPool, 1, 1, 1, done);
  job.feed = feed;
  Submit(std::move(job));
  std::memset(pool_.data() + kLen, 0x21, kChunk);
  feed->Advance(kChunk);
  feed->End(absl::DataLossError("checksum mismatch in chunk 1"));  // pool past chunk 0 is zero
  ASSERT_TRUE(done.Ready(5000));
  absl::Status status = done.future.get();
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_EQ(a_.Done(Direction::kFromPool), 1u);
  EXPECT_EQ(a_.memory[1][0], 0x21);
  EXPECT_EQ(a_.memory[1][kChunk], 0);
  EXPECT_EQ(a_.memory[1][kLen - 1], 0);
  // The lane goes on.
  Completion next;
  a_.SetTicket(Direction::kFromPool, 2);
  Submit(Job(a_, Direction::kFromPool, 1, 1, 2, next));
  ASSERT_TRUE(next.Ready(5000));
  EXPECT_TRUE(next.future.get().ok());
}

TEST_F(StreamEngineTest, AbandonCancelsQueuedAndHeldJobs) {
  Start();
  Completion waiting, held;
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, waiting));  // ticket never written
  Submit(Job(a_, Direction::kToPool, 1, 1, 3, held));     // ticket 2 never arrives
  EXPECT_FALSE(waiting.Ready(50));
  engine_->AbandonSession(a_.session.get());
  ASSERT_TRUE(held.Ready(5000));
  EXPECT_EQ(held.future.get().code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(waiting.Ready(5000));
  EXPECT_EQ(waiting.future.get().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(PoolHolds(0, 0));  // nothing was copied for a client that is gone
  Completion late;
  Submit(Job(a_, Direction::kToPool, 0, 0, 0, late));
  ASSERT_TRUE(late.Ready(1000));
  EXPECT_EQ(late.future.get().code(), absl::StatusCode::kCancelled);
}

TEST_F(StreamEngineTest, TicketWithoutSemaphorePageFails) {
  Start();
  Open(b_, 8, /*semaphores=*/false);
  Completion done;
  Submit(Job(b_, Direction::kToPool, 0, 0, 1, done));
  ASSERT_TRUE(done.Ready(1000));
  EXPECT_EQ(done.future.get().code(), absl::StatusCode::kFailedPrecondition);
}

// The done counters are host words in the session's ticket page (the client releases its own
// streams with a CPU store when tierd dies): the slot carries no memory, names a GPU tierd sees,
// and is bound once per GPU; the page is registered mapped once for the session, and released.
TEST_F(StreamEngineTest, ATicketSlotCarriesNoMemoryAndTheDoneWordsLandInTheTicketPage) {
  Start();
  Open(b_, 8, /*semaphores=*/false);
  {
    BufferImport import;
    import.kind = wire::BufferKind::kCudaSemaphores;
    import.bytes = 4096;  // a protocol-1 client's semaphore page
    EXPECT_EQ(engine_->Import(b_.session.get(), std::move(import)).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(BindSlot(a_).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(BindSlot(b_, 0xFF).status().code(), absl::StatusCode::kFailedPrecondition);
  {
    std::lock_guard lock(observed_.mu);
    EXPECT_EQ(observed_.mapped_hosts.count(reinterpret_cast<char*>(&a_.tickets)), 1u);
  }
  a_.SetTicket(Direction::kToPool, 1);
  a_.SetTicket(Direction::kFromPool, 1);
  Completion offload, reload;
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, offload));
  ASSERT_TRUE(offload.Ready(5000));
  Submit(Job(a_, Direction::kFromPool, 1, 0, 1, reload));
  ASSERT_TRUE(reload.Ready(5000));
  EXPECT_TRUE(offload.future.get().ok());
  EXPECT_TRUE(reload.future.get().ok());
  EXPECT_EQ(a_.tickets.slots[0].offload_done.value.load(), 1u);
  EXPECT_EQ(a_.tickets.slots[0].reload_done.value.load(), 1u);
  // The link meter saw both copies (too few bytes for a rate: engine/link_meter.h).
  std::vector<LinkRate> rates = engine_->LinkRates();
  ASSERT_EQ(rates.size(), 1u);
  EXPECT_EQ(rates[0].device, 0);
  EXPECT_EQ(rates[0].d2h_bytes, kLen);
  EXPECT_EQ(rates[0].h2d_bytes, kLen);
}

// Finding 11 (issue 30): a job without a ticket queued behind one whose ticket the client never
// raises is held by the client, and the engine says so (health leaves such jobs out).
TEST_F(StreamEngineTest, UnticketedJobsBehindAClientsTicketAreCountedAsHeldByTheClient) {
  Start();
  Completion ticketed, plain;
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, ticketed));  // ticket 1 never raised (yet)
  Submit(Job(a_, Direction::kToPool, 1, 1, 0, plain));     // no ticket, behind it
  for (int i = 0; i < 500 && engine_->UnticketedBehindClients() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(engine_->UnticketedBehindClients(), 1u);
  EXPECT_FALSE(plain.Ready(20));
  a_.SetTicket(Direction::kToPool, 1);
  ASSERT_TRUE(ticketed.Ready(5000));
  ASSERT_TRUE(plain.Ready(5000));
  EXPECT_EQ(engine_->UnticketedBehindClients(), 0u);
}

// What tierctl clients shows: a lane waiting for a client's ticket says which, and what the
// client reported so far.
TEST_F(StreamEngineTest, LanesReportWhatTheyWaitFor) {
  Start();
  a_.SetTicket(Direction::kToPool, 4);
  Completion jobs[5];
  for (uint64_t t = 1; t <= 5; ++t) Submit(Job(a_, Direction::kToPool, 0, t % 4, t, jobs[t - 1]));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(jobs[i].Ready(5000));
  LaneStatus d2h;
  for (int i = 0; i < 500; ++i) {
    d2h = engine_->Lanes(a_.session.get())[0];
    if (d2h.waiting_ms >= 20) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(d2h.direction, Direction::kToPool);
  EXPECT_EQ(d2h.queued, 1u);
  EXPECT_EQ(d2h.waiting_ticket, 5u);
  EXPECT_EQ(d2h.client_ticket, 4u);
  EXPECT_GE(d2h.waiting_ms, 20u);
  a_.SetTicket(Direction::kToPool, 5);
  ASSERT_TRUE(jobs[4].Ready(5000));
  EXPECT_EQ(engine_->Lanes(a_.session.get())[0].waiting_ticket, 0u);
}

// Issue 10, on the CPU. Session A has an offload whose ticket comes only after a reload of A
// completed (backward: the producer of the next saved tensor waits for a reloaded activation).
// Meanwhile session B ends and its memory is closed, which waits for every stream of the process
// to go idle while holding the driver lock (as cudaIpcCloseMemHandle does). Before the fix the
// offload waited for its ticket on the GPU, so the streams never went idle; the close held the
// driver lock; the reload could not be issued; the ticket never came: a deadlock. Now the
// offload is issued only once its ticket is here, so the close finds idle streams.
TEST_F(StreamEngineTest, DeadlockModel_ClosingMemoryWhileAClientTicketIsOutstanding) {
  Start();
  Open(b_, 8);
  std::memset(a_.memory[0].data(), 0x61, kLen);
  std::memset(pool_.data() + 2 * kLen, 0x62, kLen);
  std::atomic<bool> finished{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 2000 && !finished.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!finished.load()) {
      std::fprintf(stderr, "DEADLOCK: the offload, the reload and session B's close did not "
                           "finish within 20 s (issue 10's cycle)\n");
      std::fflush(stderr);
      std::_Exit(1);  // the engine's threads are stuck: no orderly teardown is possible
    }
  });
  Completion offload, reload;
  Submit(Job(a_, Direction::kToPool, 0, 0, 1, offload));  // ticket 1 comes after the reload
  // The client: its producer stream runs only once the reload landed, then raises ticket 1.
  std::thread client([&] {
    while (a_.Done(Direction::kFromPool) < 1) std::this_thread::sleep_for(std::chrono::microseconds(50));
    a_.SetTicket(Direction::kToPool, 1);
  });
  // The session reaper drops B's buffers (closing them synchronizes implicitly).
  std::thread reaper([&] { Close(b_); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  a_.SetTicket(Direction::kFromPool, 1);
  Submit(Job(a_, Direction::kFromPool, 1, 2, 1, reload));
  EXPECT_TRUE(reload.Ready(20000));
  EXPECT_TRUE(offload.Ready(20000));
  reaper.join();
  client.join();
  finished = true;
  watchdog.join();
  EXPECT_TRUE(reload.future.get().ok());
  EXPECT_TRUE(offload.future.get().ok());
  EXPECT_EQ(a_.memory[1][0], 0x62);
  EXPECT_TRUE(PoolHolds(0, 0x61));
}

// Closing memory, destroying lanes and unpinning happen on the engine's release thread (the fake
// fails any other thread that tries: see TearDown), and Counts() shows them go.
TEST_F(StreamEngineTest, ReleasesRunOnTheReleaseThreadAndCountsReturnToZero) {
  Start();
  Open(b_, 8);
  EXPECT_EQ(engine_->Counts().buffers, 6u);
  EXPECT_EQ(engine_->Counts().lanes, 4u);
  Close(b_);
  Close(a_);
  EngineCounts counts;
  for (int i = 0; i < 2000; ++i) {
    counts = engine_->Counts();
    if (counts.buffers == 0 && counts.lanes == 0 && counts.pending_releases == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(counts.buffers, 0u);
  EXPECT_EQ(counts.lanes, 0u);
  EXPECT_EQ(counts.pending_releases, 0u);
}

// Many sessions and threads at once, jobs in random order of arrival across lanes, tickets raised
// late by "client" threads, sessions closing while others run: everything completes, in ticket
// order per lane, with the rule checks of TearDown.
TEST_F(StreamEngineTest, ManySessionsAndThreadsNoHang) {
  Start(/*delay_us=*/200);
  constexpr int kClients = 4;
  constexpr uint64_t kJobs = 60;
  std::vector<std::unique_ptr<FakeClient>> clients;
  std::vector<std::vector<char>> pools(kClients, std::vector<char>(kLen));
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<FakeClient>());
    ASSERT_NO_FATAL_FAILURE(Open(*clients.back(), 100 + i));
  }
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      FakeClient& c = *clients[i];
      std::vector<Completion> done(2 * kJobs);
      for (uint64_t t = 1; t <= kJobs; ++t) {
        for (Direction d : {Direction::kToPool, Direction::kFromPool}) {
          CopyJob job;
          job.direction = d;
          job.client = c.memory[t % 3].data();
          job.pool = pools[i].data();
          job.len = kLen / 8;
          job.session = c.session.get();
          job.sync = t;
          job.done = done[2 * (t - 1) + (d == Direction::kToPool ? 0 : 1)].Callback();
          SetThreadRole(ThreadRole::kRingPoller);
          engine_->Submit(std::move(job));
          SetThreadRole(ThreadRole::kOther);
        }
        if (t % 7 == 0) {  // the client's streams catch up now and then
          c.SetTicket(Direction::kToPool, t);
          c.SetTicket(Direction::kFromPool, t);
        }
      }
      c.SetTicket(Direction::kToPool, kJobs);
      c.SetTicket(Direction::kFromPool, kJobs);
      for (Completion& d : done) {
        if (!d.Ready(20000) || !d.future.get().ok()) ++failures;
      }
      if (c.Done(Direction::kToPool) != kJobs || c.Done(Direction::kFromPool) != kJobs) {
        ++failures;
      }
      Close(c);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// As the daemon drives the engine: a ring-poller thread submits offloads and reloads (tickets
// raised by "client" threads a little later, as streams reach them), completion callbacks (on the
// worker) submit reloads of what just filled, as the executor does, and the jobs must all end.
TEST_F(StreamEngineTest, CallbacksThatSubmitAndLateTicketsNeverStrandALane) {
  Start();
  constexpr uint64_t kRounds = 400;
  std::atomic<uint64_t> ended{0};
  std::atomic<uint64_t> offload_tickets{0};
  std::atomic<uint64_t> reload_tickets{0};
  std::atomic<int> helpers{0};  // detached submitters still running (they use this frame)
  std::mutex submit_mu;  // one submitter at a time per lane, as the ring poller
  std::function<void(int, uint64_t)> submit_reload;
  submit_reload = [&](int slot, uint64_t) {
    std::lock_guard lock(submit_mu);
    CopyJob job;
    job.direction = Direction::kFromPool;
    job.client = a_.memory[1].data();
    job.pool = pool_.data() + slot * kLen;
    job.len = kLen / 16;
    job.session = a_.session.get();
    job.sync = ++reload_tickets;
    job.done = [&](absl::Status) { ++ended; };
    engine_->Submit(std::move(job));
  };
  std::atomic<bool> stop{false};
  std::thread client([&] {  // the client's streams reach the tickets, in bursts
    std::mt19937 rng(1);
    while (!stop.load()) {
      a_.SetTicket(Direction::kToPool, offload_tickets.load());
      if (rng() % 3 == 0) a_.SetTicket(Direction::kFromPool, reload_tickets.load());
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
    }
  });
  std::thread poller([&] {
    SetThreadRole(ThreadRole::kRingPoller);
    for (uint64_t i = 0; i < kRounds; ++i) {
      int slot = static_cast<int>(i % 4);
      {
        std::lock_guard lock(submit_mu);
        CopyJob job;
        job.direction = Direction::kToPool;
        job.client = a_.memory[0].data();
        job.pool = pool_.data() + slot * kLen;
        job.len = kLen / 16;
        job.session = a_.session.get();
        job.sync = ++offload_tickets;
        // Its completion submits a reload of what it filled (from the worker thread).
        job.done = [&, slot, i](absl::Status) {
          ++ended;
          ++helpers;
          std::thread([&, slot, i] {
            submit_reload(slot, i);
            --helpers;  // last: this frame may go once every helper is out
          }).detach();
        };
        engine_->Submit(std::move(job));
      }
      if (i % 5 == 0) submit_reload(slot, i);
    }
  });
  poller.join();
  bool all = false;
  for (int i = 0; i < 10000 && !all; ++i) {
    a_.SetTicket(Direction::kFromPool, reload_tickets.load());
    all = ended.load() == kRounds + kRounds + kRounds / 5;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  stop = true;
  client.join();
  for (int i = 0; i < 10000 && helpers.load() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(all) << ended.load() << " of " << kRounds * 2 + kRounds / 5
                   << " jobs ended; lanes: " << engine_->Lanes(a_.session.get())[1].queued
                   << " reloads queued";
}

}  // namespace
}  // namespace tier::engine
