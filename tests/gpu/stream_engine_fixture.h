// The stream engine's tests (stream_engine_ordering_test.cc, stream_engine_lifecycle_test.cc) share
// this: the GPU engine's runtime-neutral core (engine/stream_engine.h) over a fake runtime whose
// streams are host threads running stream memory operations and copies on host memory, in order.
// They run everywhere (label unit) and check what does not depend on the GPU: tickets (read from
// the session's ticket page), ticket ordering, completion detection, delay injection,
// reload-after-offload on pool bytes, fed reloads, ticket-only jobs, abandoning a session.
//
// The fake also models what blocks on a real GPU (tests/gpu/cuda_blocking_probe.cc measured it
// on the H100): closing client memory waits until every stream of the process is idle and holds
// the "driver lock" meanwhile, which every other runtime call takes too. With it, the deadlock of
// issue 10 is a CPU test (DeadlockModel), and every runtime call is checked against the thread
// rule of engine/stream_engine.h (which thread may make which call).
#ifndef TIER_TESTS_GPU_STREAM_ENGINE_FIXTURE_H_
#define TIER_TESTS_GPU_STREAM_ENGINE_FIXTURE_H_

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

namespace tier::engine::stream_engine_testing {

// These tests drive the engine as a client would: through the client's GPU layer.
using namespace ::tier::client::gpu;  // NOLINT(build/namespaces)


inline uint64_t Load(uint64_t addr) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(addr)).load();
}
inline void Store(uint64_t addr, uint64_t value) {
  std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(addr)).store(value);
}

// Fake copies and the tests' writes to client memory while jobs run take this, as a stand-in for
// the memory system (the order between them is set by timing, as between a GPU and its host).
inline std::mutex memory_mu;

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

inline FakeMapping::~FakeMapping() { runtime_.ImplicitSync("closing client memory"); }

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

}  // namespace tier::engine::stream_engine_testing

#endif  // TIER_TESTS_GPU_STREAM_ENGINE_FIXTURE_H_
