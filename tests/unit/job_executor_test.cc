// The job executor over a real session (ring segment, completions read back as a client reads
// them), a real host pool, real tiers (with a real spill store where the NVMe tier matters) and a
// scripted copy engine: the test decides when each copy ends and how. What is checked is what a
// client sees (one completion per job, its status) and what a GPU client's streams need (every
// ticket it took reaches the engine, also for jobs that fail before any copy: a ticket that never
// arrives stalls its lane, and the trainer, for good).
#include "daemon/jobs/job_executor.h"

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "common/status.h"
#include "fake_buffer.h"
#include "gtest/gtest.h"
#include "spill_test_util.h"
#include "storage/faulty_io_queue.h"

namespace tier::daemon {
namespace {

constexpr uint64_t kObject = 64 * 1024;
constexpr uint64_t kSlots = 4;

// `device`: the GPU it stands for (the scripted engine copies host memory all the same).
using HostBuffer = FakeBuffer;

// A copy engine whose jobs run when the test says: Step() runs the oldest (a real memcpy, or the
// failure given), so the test can hold a fill while other jobs arrive.
class ScriptedEngine : public engine::CopyEngine {
 public:
  explicit ScriptedEngine(bool orders_pool_reads) : orders_pool_reads_(orders_pool_reads) {}

  absl::string_view name() const override { return "scripted"; }
  bool orders_pool_reads() const override { return orders_pool_reads_; }
  absl::Status RegisterPool(char*, uint64_t) override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<engine::EngineSession>> OpenSession(
      const engine::EngineSessionInfo&) override {
    return std::make_unique<engine::EngineSession>();
  }
  void AbandonSession(engine::EngineSession*) override {}
  absl::StatusOr<std::unique_ptr<engine::ImportedBuffer>> Import(engine::EngineSession*,
                                                              engine::BufferImport) override {
    return absl::UnimplementedError("scripted engine");
  }
  void Submit(engine::CopyJob job) override {
    // (Taken out before it runs: it may submit again.)
    if (auto hook = std::exchange(before_next_submit_, nullptr)) hook(job);
    std::lock_guard lock(mu_);
    tickets_.push_back(job.sync);
    devices_.push_back(job.device);
    jobs_.push_back(std::move(job));
    cv_.notify_all();
  }
  void Shutdown() override {}
  engine::EngineCounts Counts() const override { return {}; }

  // Waits (at most 10 s) until `n` jobs are queued.
  bool WaitQueued(size_t n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return jobs_.size() >= n; });
  }
  size_t queued() {
    std::lock_guard lock(mu_);
    return jobs_.size();
  }
  // Every ticket submitted so far, in order (0 for unticketed jobs), and the GPU each job named.
  std::vector<uint64_t> tickets() {
    std::lock_guard lock(mu_);
    return tickets_;
  }
  std::vector<int> devices() {
    std::lock_guard lock(mu_);
    return devices_;
  }

  struct Ran {
    engine::Direction direction;
    uint64_t len;
    uint64_t sync;
  };
  // Runs the oldest queued job: copies (after its feed ended, for one fed from NVMe) unless
  // `fail` is given, then calls its callback.
  // `newest`: the most recent job instead (callbacks of two lanes may come in any order).
  // Runs `hook` in the next Submit, before the engine has the job: what another thread may do
  // between the daemon's decision to copy and the engine's knowing of it.
  void BeforeNextSubmit(std::function<void(const engine::CopyJob&)> hook) {
    before_next_submit_ = std::move(hook);
  }
  Ran Step(absl::Status fail = absl::OkStatus(), bool newest = false) {
    engine::CopyJob job;
    {
      std::lock_guard lock(mu_);
      EXPECT_FALSE(jobs_.empty()) << "no job to run";
      if (jobs_.empty()) return {};
      if (newest) {
        job = std::move(jobs_.back());
        jobs_.pop_back();
      } else {
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
    }
    absl::Status status = std::move(fail);
    if (status.ok() && job.feed != nullptr) {
      std::promise<absl::Status> ended;
      bool once = false;
      job.feed->Subscribe([&](uint64_t, bool end, const absl::Status& s) {
        if (end && !once) {
          once = true;
          ended.set_value(s);
        }
      });
      status = ended.get_future().get();
      job.feed->Unsubscribe();
    }
    if (status.ok() && job.len > 0) {
      if (job.direction == engine::Direction::kToPool) {
        std::memcpy(job.pool, job.client, job.len);
      } else {
        std::memcpy(job.client, job.pool, job.len);
      }
    }
    Ran ran{job.direction, job.len, job.sync};
    std::move(job.done)(status);
    return ran;
  }

 private:
  const bool orders_pool_reads_;
  std::function<void(const engine::CopyJob&)> before_next_submit_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<engine::CopyJob> jobs_;
  std::vector<uint64_t> tickets_;
  std::vector<int> devices_;
};

class JobExecutorTest : public ::testing::Test {
 protected:
  // `nvme`: with an NVMe tier (spill above `high`% of the pool, down to `low`%).
  void Build(bool orders_pool_reads, bool nvme = false, uint32_t high = 100, uint32_t low = 100,
             const std::string& faults = "") {
    storage::HostPoolOptions pool_options;
    pool_options.bytes = kObject * kSlots;
    pool_options.lock = storage::LockMode::kOff;
    auto pool = storage::HostPool::Create(pool_options);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    if (nvme) {
      storage::SpillStoreOptions store;
      store.directories = {dir_.path()};
      store.file_bytes = 16 << 20;
      store.io_bytes = 16 * 1024;
      store.queue_depth = 8;
      store.registered_buffers = {storage::IoBuffer{pool_->base(), pool_->bytes()}};
      if (!faults.empty()) {
        absl::StatusOr<std::vector<storage::FaultRule>> rules = storage::ParseFaultRules(faults);
        ASSERT_TRUE(rules.ok()) << rules.status();
        store.wrap_io_queue = [rules = *rules](std::unique_ptr<storage::IoQueue> inner) {
          auto faulty = std::make_unique<storage::FaultyIoQueue>(std::move(inner));
          for (const storage::FaultRule& rule : rules) faulty->AddRule(rule);
          return std::unique_ptr<storage::IoQueue>(std::move(faulty));
        };
      }
      auto created = storage::SpillStore::Create(std::move(store));
      ASSERT_TRUE(created.ok()) << created.status();
      store_ = *std::move(created);
    }
    SpillerOptions spiller;
    spiller.watermarks = Watermarks{high, low};
    spiller.max_prefetches = 0;
    spiller.stall_ms = 200;
    tiers_ = std::make_unique<TierManager>(*pool_, store_.get(), spiller);
    tiers_->Start();
    engine_ = std::make_unique<ScriptedEngine>(orders_pool_reads);
    executor_ = std::make_unique<JobExecutor>(*tiers_, *engine_, metrics_);
    AttachToken token{};
    session_ = std::make_shared<Session>(7, "test", token, ~uint64_t{0}, 64);
    ASSERT_TRUE(session_
                    ->Attach(PeerCredentials{::getpid(), ::getuid(), ::getgid()},
                             [&](const engine::EngineSessionInfo& info) {
                               return engine_->OpenSession(info);
                             })
                    .ok());
    ring_ = ::mmap(nullptr, session_->ring_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED,
                   session_->ring_fd(), 0);
    ASSERT_NE(ring_, MAP_FAILED);
    std::optional<ring::SegmentView> view = ring::ViewSegment(ring_, session_->ring_bytes());
    ASSERT_TRUE(view.has_value());
    completions_ = ring::Consumer<ring::CompletionEntry>(&view->header->cq, view->cq,
                                                         view->header->cq_entries);
    buffer_ = std::make_shared<HostBuffer>(8 * kObject);
    std::iota(reinterpret_cast<unsigned char*>(buffer_->base()),
              reinterpret_cast<unsigned char*>(buffer_->base() + buffer_->bytes()), 0);
    buffer_id_ = session_->AddBuffer(buffer_);
  }

  void TearDown() override {
    if (executor_ != nullptr) {
      while (engine_->queued() > 0) engine_->Step();
      session_->MarkClosing();
      session_->WaitIdle();
      executor_->ReleaseAll(*session_);
      tiers_->Stop();
      EXPECT_EQ(pool_->Usage().used_bytes, 0u) << "host memory left behind";
      EXPECT_EQ(session_->objects()->used_bytes(), 0u) << "quota left charged";
      EXPECT_EQ(metrics_.jobs_in_flight.value(), 0u);
    }
    if (ring_ != nullptr && ring_ != MAP_FAILED) ::munmap(ring_, session_->ring_bytes());
  }

  ring::SubmissionEntry Entry(ring::Opcode op, uint64_t object, uint64_t offset = 0,
                              uint64_t sync = 0) {
    ring::SubmissionEntry e{};
    e.job_id = next_job_++;
    e.opcode = static_cast<uint32_t>(op);
    e.object_id = object;
    e.buffer_id = buffer_id_;
    e.offset = offset;
    e.len = kObject;
    e.sync = sync;
    return e;
  }
  uint64_t Submit(const ring::SubmissionEntry& e) {
    executor_->Start(session_, e);
    return e.job_id;
  }
  // The completions posted so far, by job id.
  std::map<uint64_t, absl::StatusCode> Reap() {
    ring::CompletionEntry c;
    while (completions_.TryPop(&c) == ring::Consumer<ring::CompletionEntry>::Result::kEntry) {
      done_[c.job_id] = static_cast<absl::StatusCode>(c.status);
    }
    return done_;
  }
  // Waits (at most 10 s) for job `id`'s completion.
  std::optional<absl::StatusCode> Await(uint64_t id) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      auto done = Reap();
      if (auto it = done.find(id); it != done.end()) return it->second;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return std::nullopt;
  }
  bool Completed(uint64_t id) { return Reap().contains(id); }
  bool SameBytes(uint64_t offset_a, uint64_t offset_b) {
    return std::memcmp(buffer_->base() + offset_a, buffer_->base() + offset_b, kObject) == 0;
  }

  storage::testing::TempDir dir_;
  DaemonMetrics metrics_;
  std::unique_ptr<storage::HostPool> pool_;
  std::unique_ptr<storage::SpillStore> store_;
  std::unique_ptr<TierManager> tiers_;
  std::unique_ptr<ScriptedEngine> engine_;
  std::unique_ptr<JobExecutor> executor_;
  std::shared_ptr<Session> session_;
  void* ring_ = nullptr;
  ring::Consumer<ring::CompletionEntry> completions_;
  std::shared_ptr<HostBuffer> buffer_;
  uint64_t buffer_id_ = 0;
  uint64_t next_job_ = 1;
  std::map<uint64_t, absl::StatusCode> done_;
};

TEST_F(JobExecutorTest, OffloadReloadFreeRoundTrip) {
  Build(/*orders_pool_reads=*/false);
  uint64_t offload = Submit(Entry(ring::Opcode::kOffload, 1, 0));
  EXPECT_EQ(engine_->Step().direction, engine::Direction::kToPool);
  EXPECT_EQ(Await(offload), absl::StatusCode::kOk);
  uint64_t reload = Submit(Entry(ring::Opcode::kReload, 1, 4 * kObject));
  EXPECT_EQ(engine_->Step().direction, engine::Direction::kFromPool);
  EXPECT_EQ(Await(reload), absl::StatusCode::kOk);
  EXPECT_TRUE(SameBytes(0, 4 * kObject));
  EXPECT_EQ(pool_->Usage().used_bytes, kObject);
  EXPECT_EQ(Await(Submit(Entry(ring::Opcode::kFree, 1))), absl::StatusCode::kOk);
  EXPECT_EQ(pool_->Usage().used_bytes, 0u);
  EXPECT_EQ(Await(Submit(Entry(ring::Opcode::kFree, 1))), absl::StatusCode::kNotFound);
}

TEST_F(JobExecutorTest, EachBadEntryFailsAloneWithItsCode) {
  Build(false);
  ring::SubmissionEntry no_buffer = Entry(ring::Opcode::kOffload, 1);
  no_buffer.buffer_id = 99;
  EXPECT_EQ(Await(Submit(no_buffer)), absl::StatusCode::kNotFound);
  EXPECT_EQ(Await(Submit(Entry(ring::Opcode::kOffload, 2, 8 * kObject))),
            absl::StatusCode::kOutOfRange);
  ring::SubmissionEntry too_big = Entry(ring::Opcode::kOffload, 3);
  too_big.len = (kSlots + 1) * kObject;
  buffer_id_ = session_->AddBuffer(std::make_shared<HostBuffer>(too_big.len));
  too_big.buffer_id = buffer_id_;
  EXPECT_EQ(Await(Submit(too_big)), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Await(Submit(Entry(ring::Opcode::kReload, 4))), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_->queued(), 0u) << "nothing bad reached the engine";
  // The session still serves.
  uint64_t ok = Submit(Entry(ring::Opcode::kOffload, 5));
  engine_->Step();
  EXPECT_EQ(Await(ok), absl::StatusCode::kOk);
  EXPECT_EQ(Await(Submit(Entry(ring::Opcode::kOffload, 5))), absl::StatusCode::kAlreadyExists);
  ring::SubmissionEntry wrong_len = Entry(ring::Opcode::kReload, 5);
  wrong_len.len = kObject / 2;
  EXPECT_EQ(Await(Submit(wrong_len)), absl::StatusCode::kInvalidArgument);
}

// A GPU client's streams wait for every ticket it took; a job refused before any copy must still
// hand its ticket to the engine (a ticket-only job), and completes only once that ran.
TEST_F(JobExecutorTest, ARefusedTicketedJobStillPassesItsTicket) {
  Build(/*orders_pool_reads=*/true);
  ring::SubmissionEntry bad = Entry(ring::Opcode::kReload, 42, 0, /*sync=*/5);
  uint64_t id = Submit(bad);
  ASSERT_TRUE(engine_->WaitQueued(1));
  EXPECT_FALSE(Completed(id)) << "completed before its ticket reached the GPU lane";
  ScriptedEngine::Ran ran = engine_->Step();
  EXPECT_EQ(ran.sync, 5u);
  EXPECT_EQ(ran.len, 0u);
  EXPECT_EQ(Await(id), absl::StatusCode::kNotFound);
}

TEST_F(JobExecutorTest, AReloadHeldBehindAFillThatFailsReportsItAndPassesItsTicket) {
  Build(/*orders_pool_reads=*/false);
  uint64_t offload = Submit(Entry(ring::Opcode::kOffload, 1, 0, /*sync=*/1));
  uint64_t reload = Submit(Entry(ring::Opcode::kReload, 1, kObject, /*sync=*/1));
  EXPECT_EQ(engine_->queued(), 1u) << "the reload waits for the fill on the host";
  engine_->Step(absl::DataLossError("the copy failed"));
  EXPECT_EQ(Await(offload), absl::StatusCode::kDataLoss);
  ASSERT_TRUE(engine_->WaitQueued(1)) << "the reload's ticket never reached the engine";
  ScriptedEngine::Ran ran = engine_->Step();
  EXPECT_EQ(ran.direction, engine::Direction::kFromPool);
  EXPECT_EQ(ran.len, 0u);
  EXPECT_EQ(ran.sync, 1u);
  EXPECT_EQ(Await(reload), absl::StatusCode::kAborted);
  EXPECT_EQ(Await(Submit(Entry(ring::Opcode::kReload, 1))), absl::StatusCode::kNotFound)
      << "a failed offload leaves no object";
}

// The ticket of a reload that ends before its copy goes to the GPU of the buffer the reload was
// accepted for, also when the client unregistered that buffer meanwhile (a ticket-only job that
// names no GPU is refused on a multi-GPU session, and the lane waiting for the ticket stalls).
TEST_F(JobExecutorTest, AnAbandonedReloadPassesItsTicketToItsBuffersGpu) {
  Build(/*orders_pool_reads=*/false);
  auto gpu1 = std::make_shared<HostBuffer>(kObject, /*device=*/1);
  const uint64_t gpu1_id = session_->AddBuffer(gpu1);
  uint64_t offload = Submit(Entry(ring::Opcode::kOffload, 1, 0, /*sync=*/1));
  ring::SubmissionEntry into_gpu1 = Entry(ring::Opcode::kReload, 1, 0, /*sync=*/1);
  into_gpu1.buffer_id = gpu1_id;
  uint64_t reload = Submit(into_gpu1);
  ASSERT_TRUE(session_->RemoveBuffer(gpu1_id)) << "the client unregisters it meanwhile";
  engine_->Step(absl::DataLossError("the copy failed"));  // the fill: the reload is abandoned
  EXPECT_EQ(Await(offload), absl::StatusCode::kDataLoss);
  ASSERT_TRUE(engine_->WaitQueued(1)) << "the reload's ticket never reached the engine";
  EXPECT_EQ(engine_->tickets().back(), 1u);
  EXPECT_EQ(engine_->devices().back(), 1) << "the ticket went to another GPU's lane";
  engine_->Step();
  EXPECT_EQ(Await(reload), absl::StatusCode::kAborted);
}

// GPU engines order a reload after the fill on the GPU: it is submitted at once, and its result
// stands only if the fill succeeded.
TEST_F(JobExecutorTest, AReloadBesideAFillThatFailsIsAborted) {
  Build(/*orders_pool_reads=*/true);
  uint64_t offload = Submit(Entry(ring::Opcode::kOffload, 1, 0, 1));
  uint64_t reload = Submit(Entry(ring::Opcode::kReload, 1, kObject, 1));
  ASSERT_EQ(engine_->queued(), 2u) << "submitted at once";
  engine_->Step(absl::DataLossError("the copy failed"));
  EXPECT_EQ(engine_->Step().len, kObject);  // the reload's copy itself "worked"
  EXPECT_EQ(Await(offload), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Await(reload), absl::StatusCode::kAborted);
}

TEST_F(JobExecutorTest, AReloadBesideAFillCompletesOnlyAfterTheFill) {
  Build(/*orders_pool_reads=*/true);
  uint64_t offload = Submit(Entry(ring::Opcode::kOffload, 1, 0, 1));
  uint64_t reload = Submit(Entry(ring::Opcode::kReload, 1, kObject, 1));
  ASSERT_EQ(engine_->queued(), 2u);
  // The two directions are two lanes: the reload's callback may come before the fill's.
  ScriptedEngine::Ran first = engine_->Step(absl::OkStatus(), /*newest=*/true);
  ASSERT_EQ(first.direction, engine::Direction::kFromPool);
  EXPECT_FALSE(Completed(reload)) << "its result stands only once the fill is known good";
  engine_->Step();
  EXPECT_EQ(Await(offload), absl::StatusCode::kOk);
  EXPECT_EQ(Await(reload), absl::StatusCode::kOk);
  // (Bytes are not compared: this script ran the reload's copy first, which the GPU would not.)
}

// A GPU engine orders a reload after a fill only once it has the fill's copy. A reload started
// after the fill was admitted but before its copy reached the engine (admission on the spiller's
// thread, the reload on the ring poller's: the stress run's multi mismatch) waits for the fill.
// Before the fix it was submitted first, and read the pool bytes before the fill wrote them.
TEST_F(JobExecutorTest, AReloadBetweenAFillsAdmissionAndItsSubmissionWaitsForTheFill) {
  Build(/*orders_pool_reads=*/true);
  uint64_t reload = 0;
  engine_->BeforeNextSubmit([&](const engine::CopyJob& fill) {
    EXPECT_EQ(fill.direction, engine::Direction::kToPool);
    reload = Submit(Entry(ring::Opcode::kReload, 1, 4 * kObject));
  });
  uint64_t offload = Submit(Entry(ring::Opcode::kOffload, 1, 0));
  ASSERT_NE(reload, 0u);
  ASSERT_EQ(engine_->queued(), 1u) << "the reload reached the engine before the fill's copy";
  EXPECT_EQ(engine_->Step().direction, engine::Direction::kToPool);
  EXPECT_EQ(Await(offload), absl::StatusCode::kOk);
  ASSERT_TRUE(engine_->WaitQueued(1));
  EXPECT_EQ(engine_->Step().direction, engine::Direction::kFromPool);
  EXPECT_EQ(Await(reload), absl::StatusCode::kOk);
  EXPECT_TRUE(SameBytes(0, 4 * kObject));
}

TEST_F(JobExecutorTest, AFullPoolWithoutNvmeRefusesAndLeavesNothingBehind) {
  Build(false);
  for (uint64_t i = 1; i <= kSlots; ++i) {
    uint64_t id = Submit(Entry(ring::Opcode::kOffload, i, (i - 1) * kObject));
    engine_->Step();
    ASSERT_EQ(Await(id), absl::StatusCode::kOk);
  }
  uint64_t full = Submit(Entry(ring::Opcode::kOffload, 99, 0, /*sync=*/9));
  ASSERT_TRUE(engine_->WaitQueued(1));
  EXPECT_EQ(engine_->Step().sync, 9u) << "its ticket";
  EXPECT_EQ(Await(full), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Await(Submit(Entry(ring::Opcode::kReload, 99))), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->objects()->used_bytes(), kSlots * kObject) << "its charge refunded";
}

TEST_F(JobExecutorTest, FreeAfterReloadDropsTheObjectOnlyWhenTheCopyWorked) {
  Build(false);
  uint64_t offload = Submit(Entry(ring::Opcode::kOffload, 1));
  engine_->Step();
  ASSERT_EQ(Await(offload), absl::StatusCode::kOk);
  ring::SubmissionEntry reload = Entry(ring::Opcode::kReload, 1, kObject);
  reload.flags = ring::kFlagFreeAfterReload;
  uint64_t failed = Submit(reload);
  engine_->Step(absl::InternalError("copy failed"));
  EXPECT_EQ(Await(failed), absl::StatusCode::kInternal);
  reload.job_id = next_job_++;
  uint64_t worked = Submit(reload);
  engine_->Step();
  EXPECT_EQ(Await(worked), absl::StatusCode::kOk);
  EXPECT_EQ(pool_->Usage().used_bytes, 0u);
  EXPECT_EQ(Await(Submit(Entry(ring::Opcode::kReload, 1))), absl::StatusCode::kNotFound);
}

TEST_F(JobExecutorTest, AFreedObjectsMemoryStaysUntilItsReloadEnds) {
  Build(false);
  uint64_t offload = Submit(Entry(ring::Opcode::kOffload, 1));
  engine_->Step();
  ASSERT_EQ(Await(offload), absl::StatusCode::kOk);
  uint64_t reload = Submit(Entry(ring::Opcode::kReload, 1, kObject));
  EXPECT_EQ(Await(Submit(Entry(ring::Opcode::kFree, 1))), absl::StatusCode::kOk);
  EXPECT_EQ(pool_->Usage().used_bytes, kObject) << "the reload still reads it";
  engine_->Step();
  EXPECT_EQ(Await(reload), absl::StatusCode::kOk);
  EXPECT_TRUE(SameBytes(0, kObject));
  EXPECT_EQ(pool_->Usage().used_bytes, 0u);
}

TEST_F(JobExecutorTest, ReleaseAllGivesBackEveryObject) {
  Build(false);
  for (uint64_t i = 1; i <= 3; ++i) {
    uint64_t id = Submit(Entry(ring::Opcode::kOffload, i));
    engine_->Step();
    ASSERT_EQ(Await(id), absl::StatusCode::kOk);
  }
  EXPECT_EQ(pool_->Usage().used_bytes, 3 * kObject);
  // (TearDown releases them and checks the pool and the quota are empty.)
}

// With an NVMe tier: a reload of a spilled object that cannot get host room gives up after the
// stall time, and still passes its ticket (it used to complete without: its lane waited for good).
TEST_F(JobExecutorTest, ASpilledReloadThatGetsNoRoomPassesItsTicket) {
  Build(/*orders_pool_reads=*/true, /*nvme=*/true, /*high=*/75, /*low=*/25);
  for (uint64_t i = 1; i <= kSlots; ++i) {
    uint64_t id = Submit(Entry(ring::Opcode::kOffload, i, (i - 1) * kObject));
    engine_->Step();
    ASSERT_EQ(Await(id), absl::StatusCode::kOk);
  }
  // At 100% (over 75%) the pool goes down to 25%: three objects on NVMe, object 4 in memory.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (tiers_->nvme()->counters().spills.load() < 3 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(tiers_->nvme()->counters().spills.load(), 3u);
  // Fill the pool with what cannot be spilled: object 4 pinned by a reload held in the engine,
  // and three fills held there too.
  Submit(Entry(ring::Opcode::kReload, 4, 5 * kObject, 1));
  for (uint64_t i = 5; i <= 7; ++i) Submit(Entry(ring::Opcode::kOffload, i, 4 * kObject, 1));
  ASSERT_TRUE(engine_->WaitQueued(4));
  EXPECT_EQ(pool_->Usage().free_bytes, 0u);
  uint64_t starved = Submit(Entry(ring::Opcode::kReload, 1, 6 * kObject, /*sync=*/2));
  // Its ticket arrives (as a ticket-only job) once it gave up: after the stall time.
  ASSERT_TRUE(engine_->WaitQueued(5));
  EXPECT_EQ(engine_->tickets().back(), 2u);
  EXPECT_FALSE(Completed(starved));
  for (int i = 0; i < 5; ++i) engine_->Step();
  EXPECT_EQ(Await(starved), absl::StatusCode::kResourceExhausted);
}

// A spilled object comes back through the pipelined read, bytes intact; one whose read fails
// reports DATA_LOSS and stays on NVMe for a later try.
TEST_F(JobExecutorTest, SpilledObjectsComeBackOrReportTheirReadError) {
  Build(/*orders_pool_reads=*/true, /*nvme=*/true, /*high=*/75, /*low=*/25,
        /*faults=*/"read:eio:0:1");
  for (uint64_t i = 1; i <= kSlots; ++i) {
    uint64_t id = Submit(Entry(ring::Opcode::kOffload, i, (i - 1) * kObject));
    engine_->Step();
    ASSERT_EQ(Await(id), absl::StatusCode::kOk);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (tiers_->nvme()->counters().spills.load() < 3 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(tiers_->nvme()->counters().spills.load(), 3u);
  uint64_t first = Submit(Entry(ring::Opcode::kReload, 1, 4 * kObject, 1));
  engine_->Step();
  EXPECT_EQ(Await(first), absl::StatusCode::kDataLoss);
  uint64_t again = Submit(Entry(ring::Opcode::kReload, 1, 4 * kObject, 2));
  engine_->Step();
  EXPECT_EQ(Await(again), absl::StatusCode::kOk);
  EXPECT_TRUE(SameBytes(0, 4 * kObject));
}

}  // namespace
}  // namespace tier::daemon
