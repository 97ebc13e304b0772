// The GPU engine's runtime-neutral core (gpu/stream_engine.h) over a fake runtime whose streams
// are host threads running stream memory operations and copies on host memory, in order. This
// runs everywhere (label unit) and checks what does not depend on the GPU: ticket waits and
// signals, ticket ordering, completion detection, delay injection, reload-after-offload on pool
// bytes, ticket-only jobs, abandoning a session.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/client_gpu.h"
#include "gpu/copy_engine.h"
#include "gpu/stream_engine.h"

namespace tier::gpu {
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

class FakeMapping final : public DeviceMapping {
 public:
  FakeMapping(char* base, uint64_t bytes) : base_(base), bytes_(bytes) {}
  char* base() const override { return base_; }
  uint64_t bytes() const override { return bytes_; }
  int device() const override { return 0; }

 private:
  char* base_;
  uint64_t bytes_;
};

// "Device" memory is host memory; an IPC handle carries the pointer.
class FakeRuntime final : public GpuRuntime {
 public:
  absl::string_view name() const override { return "fake"; }
  absl::Status SetDevice(int) override { return absl::OkStatus(); }
  absl::StatusOr<GpuStream> CreateStream(int, bool) override { return new FakeStream(); }
  void DestroyStream(int, GpuStream stream) override { delete static_cast<FakeStream*>(stream); }
  absl::StatusOr<bool> StreamDone(int, GpuStream stream) override {
    return static_cast<FakeStream*>(stream)->Idle();
  }
  absl::Status WaitValue64(GpuStream stream, uint64_t addr, uint64_t value) override {
    static_cast<FakeStream*>(stream)->Push([addr, value] { return Load(addr) >= value; });
    return absl::OkStatus();
  }
  absl::Status WriteValue64(GpuStream stream, uint64_t addr, uint64_t value) override {
    static_cast<FakeStream*>(stream)->Push([addr, value] {
      Store(addr, value);
      return true;
    });
    return absl::OkStatus();
  }
  absl::Status CopyAsync(GpuStream stream, Direction direction, char* client, char* pool,
                         uint64_t len) override {
    static_cast<FakeStream*>(stream)->Push([=] {
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
  absl::Status HostCopyAsync(GpuStream stream, char* dst, const char* src, uint64_t len) override {
    static_cast<FakeStream*>(stream)->Push([=] {
      std::lock_guard lock(memory_mu);
      std::memcpy(dst, src, len);
      return true;
    });
    return absl::OkStatus();
  }
  absl::StatusOr<MappedHost> AllocMappedHost(uint64_t bytes) override {
    void* p = std::aligned_alloc(4096, bytes);
    std::memset(p, 0, bytes);
    return MappedHost{p, reinterpret_cast<uint64_t>(p)};
  }
  void FreeMappedHost(void* host) override { std::free(host); }
  absl::Status RegisterHost(char*, uint64_t) override { return absl::OkStatus(); }
  void UnregisterHost(char*) override {}
  absl::StatusOr<std::unique_ptr<DeviceMapping>> Open(BufferImport& import) override {
    char* base = nullptr;
    std::memcpy(&base, import.ipc_handle.data(), sizeof(base));
    if (base == nullptr) return absl::InvalidArgumentError("bad fake handle");
    return std::make_unique<FakeMapping>(base, import.bytes);
  }
};

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

class StreamEngineTest : public ::testing::Test {
 protected:
  void Start(uint64_t delay_us = 0) {
    GpuEngineOptions options;
    options.copy_delay_us = delay_us;
    options.shutdown_grace_ms = 2000;
    engine_ = MakeStreamEngine(std::make_unique<FakeRuntime>(), options);
    session_ = *engine_->OpenSession(7);
    page_.assign(kSemaphorePageBytes / 8, 0);
    ASSERT_TRUE(Import(wire::BufferKind::kCudaSemaphores, reinterpret_cast<char*>(page_.data()),
                       kSemaphorePageBytes)
                    .ok());
    for (auto& b : client_) b.assign(kLen, 0);
    for (auto& b : client_) {
      absl::StatusOr<std::unique_ptr<ImportedBuffer>> imported =
          Import(wire::BufferKind::kCudaIpc, b.data(), kLen);
      ASSERT_TRUE(imported.ok()) << imported.status();
      buffers_.push_back(*std::move(imported));
    }
    pool_.assign(4 * kLen, 0);
  }

  void TearDown() override {
    if (session_) engine_->AbandonSession(session_.get());
    buffers_.clear();
    semaphores_.reset();
    session_.reset();
    engine_.reset();
  }

  absl::StatusOr<std::unique_ptr<ImportedBuffer>> Import(wire::BufferKind kind, char* base,
                                                         uint64_t bytes) {
    BufferImport import;
    import.kind = kind;
    import.device = 0;
    import.bytes = bytes;
    std::memcpy(import.ipc_handle.data(), &base, sizeof(base));
    absl::StatusOr<std::unique_ptr<ImportedBuffer>> b =
        engine_->Import(session_.get(), std::move(import));
    if (b.ok() && kind == wire::BufferKind::kCudaSemaphores) {
      semaphores_ = *std::move(b);
      return std::unique_ptr<ImportedBuffer>();
    }
    return b;
  }

  uint64_t Counter(uint64_t offset) { return Load(reinterpret_cast<uint64_t>(page_.data()) + offset); }
  void SetCounter(uint64_t offset, uint64_t v) {
    Store(reinterpret_cast<uint64_t>(page_.data()) + offset, v);
  }

  CopyJob Job(Direction d, int buffer, int slot, uint64_t sync, Completion& done) {
    CopyJob job;
    job.direction = d;
    job.client = client_[buffer].data();
    job.pool = pool_.data() + slot * kLen;
    job.len = kLen;
    job.session = session_.get();
    job.sync = sync;
    job.done = done.Callback();
    return job;
  }

  bool PoolHolds(int slot, char byte) {
    for (uint64_t i = 0; i < kLen; ++i) {
      if (pool_[slot * kLen + i] != byte) return false;
    }
    return true;
  }

  std::unique_ptr<CopyEngine> engine_;
  std::unique_ptr<EngineSession> session_;
  std::vector<uint64_t> page_;
  std::vector<char> client_[3];
  std::vector<char> pool_;
  std::unique_ptr<ImportedBuffer> semaphores_;
  std::vector<std::unique_ptr<ImportedBuffer>> buffers_;
};

TEST_F(StreamEngineTest, OffloadWaitsForTicketAndSignalsDone) {
  Start();
  std::memset(client_[0].data(), 0x11, kLen);
  Completion done;
  engine_->Submit(Job(Direction::kToPool, 0, 0, 1, done));
  EXPECT_FALSE(done.Ready(50));  // produced is still 0
  {
    std::lock_guard lock(memory_mu);
    std::memset(client_[0].data(), 0x77, kLen);  // the producer finishes...
  }
  SetCounter(kProducedOffset, 1);               // ...and its ticket lands
  ASSERT_TRUE(done.Ready(5000));
  EXPECT_TRUE(done.future.get().ok());
  EXPECT_TRUE(PoolHolds(0, 0x77));
  EXPECT_EQ(Counter(kOffloadDoneOffset), 1u);
}

TEST_F(StreamEngineTest, ReloadSignalsReloadDone) {
  Start();
  std::memset(pool_.data(), 0x5C, kLen);
  SetCounter(kReloadReadyOffset, 1);
  Completion done;
  engine_->Submit(Job(Direction::kFromPool, 1, 0, 1, done));
  ASSERT_TRUE(done.Ready(5000));
  EXPECT_TRUE(done.future.get().ok());
  EXPECT_EQ(Counter(kReloadDoneOffset), 1u);
  EXPECT_EQ(client_[1][kLen - 1], 0x5C);
}

TEST_F(StreamEngineTest, LaterTicketIsHeldUntilEarlierArrives) {
  Start();
  SetCounter(kProducedOffset, 2);
  std::memset(client_[0].data(), 0x01, kLen);
  std::memset(client_[1].data(), 0x02, kLen);
  Completion first, second;
  engine_->Submit(Job(Direction::kToPool, 1, 1, 2, second));
  EXPECT_FALSE(second.Ready(50));
  EXPECT_EQ(Counter(kOffloadDoneOffset), 0u);  // done = 2 would claim ticket 1 done too
  engine_->Submit(Job(Direction::kToPool, 0, 0, 1, first));
  ASSERT_TRUE(first.Ready(5000));
  ASSERT_TRUE(second.Ready(5000));
  EXPECT_TRUE(PoolHolds(0, 0x01));
  EXPECT_TRUE(PoolHolds(1, 0x02));
  EXPECT_EQ(Counter(kOffloadDoneOffset), 2u);

  Completion again;
  engine_->Submit(Job(Direction::kToPool, 0, 2, 2, again));  // a ticket used twice
  ASSERT_TRUE(again.Ready(1000));
  EXPECT_EQ(again.future.get().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(StreamEngineTest, TicketOnlyJobSignals) {
  Start();
  SetCounter(kReloadReadyOffset, 1);
  Completion done;
  CopyJob job;
  job.direction = Direction::kFromPool;
  job.len = 0;
  job.session = session_.get();
  job.sync = 1;
  job.done = done.Callback();
  engine_->Submit(std::move(job));
  ASSERT_TRUE(done.Ready(5000));
  EXPECT_TRUE(done.future.get().ok());
  EXPECT_EQ(Counter(kReloadDoneOffset), 1u);
}

// A reload of pool bytes an offload is still filling waits for that offload, on the "GPU".
TEST_F(StreamEngineTest, ReloadWaitsForOffloadIntoSamePoolBytes) {
  Start();
  std::memset(client_[0].data(), 0x42, kLen);
  Completion offload, reload;
  engine_->Submit(Job(Direction::kToPool, 0, 0, 1, offload));  // blocked: produced = 0
  engine_->Submit(Job(Direction::kFromPool, 1, 0, 0, reload));
  EXPECT_FALSE(reload.Ready(50));
  SetCounter(kProducedOffset, 1);
  ASSERT_TRUE(offload.Ready(5000));
  ASSERT_TRUE(reload.Ready(5000));
  EXPECT_EQ(client_[1][0], 0x42);
  EXPECT_EQ(client_[1][kLen - 1], 0x42);
}

// Delay injection: the copy starts copy_delay_us after its ticket passed, so a client that
// overwrites the source without waiting for offload_done deterministically changes the result.
TEST_F(StreamEngineTest, DelayStartsCopyLate) {
  Start(/*delay_us=*/100000);
  std::memset(client_[0].data(), 0x10, kLen);
  SetCounter(kProducedOffset, 1);
  Completion done;
  auto start = std::chrono::steady_clock::now();
  engine_->Submit(Job(Direction::kToPool, 0, 0, 1, done));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // well inside the delay
  {
    std::lock_guard lock(memory_mu);
    std::memset(client_[0].data(), 0x20, kLen);  // the early reuse a missing wait would allow
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
  SetCounter(kReloadReadyOffset, 1);
  auto feed = std::make_shared<SourceFeed>(kLen, kChunk);
  Completion done;
  CopyJob job = Job(Direction::kFromPool, 0, 0, 1, done);
  job.feed = feed;
  engine_->Submit(std::move(job));
  EXPECT_FALSE(done.Ready(30));
  for (uint64_t i = 0; i < 3; ++i) {
    std::memset(pool_.data() + i * kChunk, 0x40 + static_cast<int>(i), kChunk);
    feed->Advance((i + 1) * kChunk);
    ASSERT_TRUE(Eventually([&] { return client_[0][i * kChunk + kChunk - 1] == 0x40 + int(i); }))
        << "chunk " << i << " was not copied on arrival";
    EXPECT_EQ(client_[0][(i + 1) * kChunk], 0) << "chunk " << i + 1 << " copied before it arrived";
    EXPECT_FALSE(done.Ready(0));
  }
  std::memset(pool_.data() + 3 * kChunk, 0x43, kChunk);
  feed->End(absl::OkStatus());
  ASSERT_TRUE(done.Ready(5000));
  EXPECT_TRUE(done.future.get().ok());
  EXPECT_EQ(client_[0][kLen - 1], 0x43);
  EXPECT_EQ(Counter(kReloadDoneOffset), 1u);
}

// The feed ends in an error half way: the job fails with it, the client's stream is still
// released (done written), and past the verified chunks the client gets the zeros the producer
// left, never other bytes.
TEST_F(StreamEngineTest, FedReloadEndingInAnErrorFailsButReleasesTheTicket) {
  Start();
  constexpr uint64_t kChunk = kLen / 4;
  std::memset(client_[1].data(), 0x7F, kLen);
  SetCounter(kReloadReadyOffset, 1);
  auto feed = std::make_shared<SourceFeed>(kLen, kChunk);
  Completion done;
  CopyJob job = Job(Direction::kFromPool, 1, 1, 1, done);
  job.feed = feed;
  engine_->Submit(std::move(job));
  std::memset(pool_.data() + kLen, 0x21, kChunk);
  feed->Advance(kChunk);
  feed->End(absl::DataLossError("checksum mismatch in chunk 1"));  // pool past chunk 0 is zero
  ASSERT_TRUE(done.Ready(5000));
  absl::Status status = done.future.get();
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_EQ(Counter(kReloadDoneOffset), 1u);
  EXPECT_EQ(client_[1][0], 0x21);
  EXPECT_EQ(client_[1][kChunk], 0);
  EXPECT_EQ(client_[1][kLen - 1], 0);
  // The lane goes on.
  Completion next;
  SetCounter(kReloadReadyOffset, 2);
  engine_->Submit(Job(Direction::kFromPool, 1, 1, 2, next));
  ASSERT_TRUE(next.Ready(5000));
  EXPECT_TRUE(next.future.get().ok());
}

TEST_F(StreamEngineTest, AbandonReleasesWaitsAndCancelsHeldJobs) {
  Start();
  Completion waiting, held;
  engine_->Submit(Job(Direction::kToPool, 0, 0, 1, waiting));  // ticket never written
  engine_->Submit(Job(Direction::kToPool, 1, 1, 3, held));     // ticket 2 never arrives
  EXPECT_FALSE(waiting.Ready(50));
  engine_->AbandonSession(session_.get());
  ASSERT_TRUE(held.Ready(5000));
  EXPECT_EQ(held.future.get().code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(waiting.Ready(5000));
  EXPECT_EQ(Counter(kProducedOffset), kReleasedTicket);
  EXPECT_EQ(Counter(kReloadReadyOffset), kReleasedTicket);
  Completion late;
  engine_->Submit(Job(Direction::kToPool, 0, 0, 0, late));
  ASSERT_TRUE(late.Ready(1000));
  EXPECT_EQ(late.future.get().code(), absl::StatusCode::kCancelled);
}

TEST_F(StreamEngineTest, TicketWithoutSemaphorePageFails) {
  engine_ = MakeStreamEngine(std::make_unique<FakeRuntime>(), GpuEngineOptions{});
  session_ = *engine_->OpenSession(8);
  client_[0].assign(kLen, 0);
  pool_.assign(kLen, 0);
  absl::StatusOr<std::unique_ptr<ImportedBuffer>> b =
      Import(wire::BufferKind::kCudaIpc, client_[0].data(), kLen);
  ASSERT_TRUE(b.ok());
  buffers_.push_back(*std::move(b));
  Completion done;
  engine_->Submit(Job(Direction::kToPool, 0, 0, 1, done));
  ASSERT_TRUE(done.Ready(1000));
  EXPECT_EQ(done.future.get().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tier::gpu
