// DeviceSync, the client's half of the ticket protocol (gpu/ticket_protocol.h), over a scripted
// fake runtime: which stream operations each call enqueues, in which order, on which stream; that
// a failed call takes no ticket; that tickets reach the ticket stream in ticket order from many
// threads; and that ReleaseWaiters frees the waits with plain stores even while another thread is
// stuck in a runtime call behind them (the dead-daemon hang, modelled with a driver lock). The
// same code runs over CUDA and HIP (sync_runtime_*.cc);
// the GPU suites (scripts/gpu-tests) run it on the device.
#include "client/gpu/device_sync.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu/ticket_protocol.h"

namespace tier::client::gpu {
namespace {

using ::tier::gpu::kMaxTicket;
using ::tier::gpu::kReleasedTicket;

// What the fake saw, shared with the test (the runtime itself is owned by the DeviceSync).
struct Script {
  std::mutex mu;
  std::vector<std::string> ops;  // one line per enqueued or blocking operation
  int current_device = 0;
  int device_switches = 0;
  // Failures to inject.
  bool no_stream_mem_ops = false;
  bool fail_record = false;
  bool fail_write = false;
  // The driver as the dead-daemon hang met it: while `stuck_word` is set, RecordEvent stands
  // for a launch into a stream queue that is full behind a wait on that word (a done counter):
  // it holds the driver lock until the word reaches kReleasedTicket, and every other runtime
  // call needs the lock.
  const std::atomic<uint64_t>* stuck_word = nullptr;
  std::promise<void> stuck_entered;
  std::timed_mutex driver_lock;
  std::atomic<bool> released_seen{false};
  // Resources alive.
  int streams = 0;
  int events = 0;

  void Log(std::string op) {
    std::lock_guard lock(mu);
    ops.push_back(std::move(op));
  }
  std::vector<std::string> Ops() {
    std::lock_guard lock(mu);
    return ops;
  }
  void Clear() {
    std::lock_guard lock(mu);
    ops.clear();
  }
};

std::string Name(void* handle) { return absl::StrCat(reinterpret_cast<uintptr_t>(handle)); }

class FakeRuntime final : public SyncRuntime {
 public:
  explicit FakeRuntime(Script* script) : s_(script) {}

  absl::StatusOr<int> SwapDevice(int device) const override {
    std::lock_guard lock(s_->mu);
    if (s_->current_device == device) return -1;
    int previous = s_->current_device;
    s_->current_device = device;
    ++s_->device_switches;
    return previous;
  }
  void RestoreDevice(int previous) const override {
    std::lock_guard lock(s_->mu);
    s_->current_device = previous;
  }
  absl::Status CheckStreamMemOps(int) const override {
    if (s_->no_stream_mem_ops) return absl::FailedPreconditionError("no stream memory operations");
    return absl::OkStatus();
  }
  absl::StatusOr<std::array<uint8_t, 16>> DeviceUuid(int device) const override {
    std::array<uint8_t, 16> uuid{};
    uuid[0] = static_cast<uint8_t>(0xA0 + device);
    return uuid;
  }
  absl::StatusOr<uint64_t> HostDevicePointer(void* host) const override {
    return reinterpret_cast<uint64_t>(host) + kDeviceView;
  }
  absl::StatusOr<Stream> CreateStream() const override {
    Driver driver(s_);
    if (!driver.ok()) return absl::DeadlineExceededError("driver lock");
    std::lock_guard lock(s_->mu);
    ++s_->streams;
    auto stream = reinterpret_cast<Stream>(next_handle_++);
    s_->ops.push_back(absl::StrCat("create stream ", Name(stream)));
    return stream;
  }
  void DestroyStream(Stream) const override {
    std::lock_guard lock(s_->mu);
    --s_->streams;
  }
  absl::StatusOr<Event> CreateEvent() const override {
    ++s_->events;
    return reinterpret_cast<Event>(next_handle_++);
  }
  void DestroyEvent(Event) const override { --s_->events; }
  absl::Status RecordEvent(Event, Stream stream) const override {
    if (const std::atomic<uint64_t>* word = s_->stuck_word) {
      // A launch stuck behind a wait on `word`: holds the driver lock until the wait passes.
      std::lock_guard driver(s_->driver_lock);
      s_->stuck_entered.set_value();
      while (word->load() < kReleasedTicket) std::this_thread::yield();
      s_->released_seen = true;
      return absl::OkStatus();
    }
    Driver driver(s_);
    if (!driver.ok()) return absl::DeadlineExceededError("driver lock");
    if (s_->fail_record) return absl::InvalidArgumentError("cudaErrorInvalidResourceHandle");
    s_->Log(absl::StrCat("record after ", Name(stream)));
    return absl::OkStatus();
  }
  absl::Status StreamWaitEvent(Stream stream, Event) const override {
    s_->Log(absl::StrCat("stream ", Name(stream), " waits event"));
    return absl::OkStatus();
  }
  absl::Status WriteValue64(Stream stream, uint64_t address, uint64_t value) const override {
    Driver driver(s_);
    if (!driver.ok()) return absl::DeadlineExceededError("driver lock");
    if (s_->fail_write) return absl::InternalError("write failed");
    s_->Log(absl::StrCat("stream ", Name(stream), " writes ", Where(address), " = ", value));
    return absl::OkStatus();
  }
  absl::Status WaitValue64(Stream stream, uint64_t address, uint64_t value) const override {
    s_->Log(absl::StrCat("stream ", Name(stream), " waits ", Where(address), " >= ", value));
    return absl::OkStatus();
  }

  static constexpr uint64_t kDeviceView = uint64_t{1} << 40;  // host word as streams see it
  static constexpr uintptr_t kFirstHandle = 1000;

 private:
  // The driver lock for one call; not taken within 2 s: a deadlock (the call fails instead of
  // hanging the test).
  class Driver {
   public:
    explicit Driver(Script* s) : s_(s), ok_(s->driver_lock.try_lock_for(std::chrono::seconds(2))) {}
    ~Driver() {
      if (ok_) s_->driver_lock.unlock();
    }
    bool ok() const { return ok_; }

   private:
    Script* s_;
    bool ok_;
  };

  std::string Where(uint64_t address) const {
    return absl::StrCat("host word @", address - kDeviceView);
  }

  Script* s_;
  mutable uintptr_t next_handle_ = kFirstHandle;
};

class DeviceSyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<DeviceSync>> sync =
        DeviceSync::Create(std::make_unique<FakeRuntime>(&script_), 1, &page_.slots[1]);
    ASSERT_TRUE(sync.ok()) << sync.status();
    sync_ = *std::move(sync);
    // Handles: 1000 ticket stream, 1001 event.
    ticket_ = "1000";
    produced_ = absl::StrCat("host word @",
                             reinterpret_cast<uintptr_t>(&page_.slots[1].produced.value));
    reload_ready_ = absl::StrCat("host word @",
                                 reinterpret_cast<uintptr_t>(&page_.slots[1].reload_ready.value));
    offload_done_ = absl::StrCat("host word @",
                                 reinterpret_cast<uintptr_t>(&page_.slots[1].offload_done.value));
    reload_done_ = absl::StrCat("host word @",
                                reinterpret_cast<uintptr_t>(&page_.slots[1].reload_done.value));
    script_.Clear();
  }

  Script script_;
  ring::TicketPage page_{};
  std::unique_ptr<DeviceSync> sync_;
  std::string ticket_, produced_, reload_ready_, offload_done_, reload_done_;
};

TEST(DeviceSyncCreate, MakesTheTicketStreamAndAllocatesNoDeviceMemory) {
  Script script;
  ring::TicketPage page{};
  absl::StatusOr<std::unique_ptr<DeviceSync>> sync =
      DeviceSync::Create(std::make_unique<FakeRuntime>(&script), 0, &page.slots[0]);
  ASSERT_TRUE(sync.ok()) << sync.status();
  EXPECT_EQ(script.Ops(), (std::vector<std::string>{"create stream 1000"}));
  EXPECT_EQ(script.streams, 1);
  EXPECT_EQ(script.events, 1);
  sync->reset();
  EXPECT_EQ(script.streams, 0);
  EXPECT_EQ(script.events, 0);
}

TEST(DeviceSyncCreate, AGpuWithoutStreamMemoryOperationsIsRefusedAndLeavesNothing) {
  Script script;
  script.no_stream_mem_ops = true;
  ring::TicketPage page{};
  absl::StatusOr<std::unique_ptr<DeviceSync>> sync =
      DeviceSync::Create(std::make_unique<FakeRuntime>(&script), 0, &page.slots[0]);
  EXPECT_EQ(sync.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(script.streams, 0);
}

TEST_F(DeviceSyncTest, AnOffloadTicketFollowsEveryProducerThenRaisesProduced) {
  int a = 0, b = 0;
  void* producers[] = {&a, &b};
  absl::StatusOr<uint64_t> ticket = sync_->TicketOffload(producers);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  EXPECT_EQ(*ticket, 1u);
  EXPECT_EQ(script_.Ops(), (std::vector<std::string>{
                               "record after " + Name(&a), "stream " + ticket_ + " waits event",
                               "record after " + Name(&b), "stream " + ticket_ + " waits event",
                               "stream " + ticket_ + " writes " + produced_ + " = 1"}));
  script_.Clear();
  // No producer named: the legacy default stream.
  ticket = sync_->TicketOffload({});
  ASSERT_TRUE(ticket.ok());
  EXPECT_EQ(*ticket, 2u);
  EXPECT_EQ(script_.Ops(), (std::vector<std::string>{
                               "record after 0", "stream " + ticket_ + " waits event",
                               "stream " + ticket_ + " writes " + produced_ + " = 2"}));
}

TEST_F(DeviceSyncTest, AReloadTicketFollowsTheConsumerAndItsStreamWaitsForTheCopy) {
  int consumer = 0;
  absl::StatusOr<uint64_t> ticket = sync_->TicketReload(&consumer);
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE(sync_->WaitReloadDone(&consumer, *ticket).ok());
  ASSERT_TRUE(sync_->WaitOffloadDone(&consumer, 7).ok());
  EXPECT_EQ(script_.Ops(),
            (std::vector<std::string>{
                "record after " + Name(&consumer), "stream " + ticket_ + " waits event",
                "stream " + ticket_ + " writes " + reload_ready_ + " = 1",
                "stream " + Name(&consumer) + " waits " + reload_done_ + " >= 1",
                "stream " + Name(&consumer) + " waits " + offload_done_ + " >= 7"}));
}

TEST_F(DeviceSyncTest, AFailedTicketCallTakesNoTicket) {
  int stream = 0;
  script_.fail_record = true;
  absl::StatusOr<uint64_t> ticket = sync_->TicketOffload({});
  EXPECT_EQ(ticket.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ticket.status().message().find("live stream of GPU 1"), std::string::npos)
      << ticket.status();
  EXPECT_EQ(sync_->TicketReload(&stream).status().code(), absl::StatusCode::kInvalidArgument);
  script_.fail_record = false;
  script_.fail_write = true;
  EXPECT_FALSE(sync_->TicketOffload({}).ok());
  EXPECT_FALSE(sync_->TicketReload(&stream).ok());
  script_.fail_write = false;
  EXPECT_EQ(*sync_->TicketOffload({}), 1u);  // no gap: the daemon waits for ticket 1 first
  EXPECT_EQ(*sync_->TicketReload(&stream), 1u);
}

TEST_F(DeviceSyncTest, WaitsOnTicketsOutOfRangeAreRefused) {
  int stream = 0;
  EXPECT_EQ(sync_->WaitReloadDone(&stream, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sync_->WaitOffloadDone(&stream, kMaxTicket).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(script_.Ops().empty());
}

TEST_F(DeviceSyncTest, EveryCallRunsOnThePagesGpuAndGivesTheCallersBack) {
  script_.current_device = 0;
  int switches = script_.device_switches;
  int stream = 0;
  ASSERT_TRUE(sync_->TicketOffload({}).ok());
  ASSERT_TRUE(sync_->TicketReload(&stream).ok());
  ASSERT_TRUE(sync_->WaitReloadDone(&stream, 1).ok());
  EXPECT_EQ(script_.device_switches - switches, 3);
  EXPECT_EQ(script_.current_device, 0);
}

TEST_F(DeviceSyncTest, TicketsReachTheTicketStreamInTicketOrderFromManyThreads) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 500;
  std::vector<std::thread> threads;
  std::vector<std::vector<uint64_t>> taken(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      int stream = t;
      for (int i = 0; i < kPerThread; ++i) {
        absl::StatusOr<uint64_t> ticket =
            i % 2 == 0 ? sync_->TicketOffload({}) : sync_->TicketReload(&stream);
        ASSERT_TRUE(ticket.ok());
        taken[t].push_back(*ticket);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  // On the ticket stream each counter's writes are 1, 2, 3, ... with no gap and no reordering.
  uint64_t produced = 0, ready = 0;
  for (const std::string& op : script_.Ops()) {
    if (op.rfind("stream " + ticket_ + " writes ", 0) != 0) continue;
    uint64_t value = std::stoull(op.substr(op.rfind(' ') + 1));
    if (op.find(produced_) != std::string::npos) {
      EXPECT_EQ(value, ++produced);
    } else {
      EXPECT_EQ(value, ++ready);
    }
  }
  EXPECT_EQ(produced + ready, static_cast<uint64_t>(kThreads * kPerThread));
}

TEST_F(DeviceSyncTest, ReleaseWaitersStoresTheReleaseIntoBothDoneWordsAndStopsTickets) {
  sync_->ReleaseWaiters();
  EXPECT_EQ(page_.slots[1].offload_done.value.load(), kReleasedTicket);
  EXPECT_EQ(page_.slots[1].reload_done.value.load(), kReleasedTicket);
  EXPECT_EQ(page_.slots[0].reload_done.value.load(), 0u);  // another GPU's slot: untouched
  EXPECT_TRUE(script_.Ops().empty()) << "the release made a runtime call";
  EXPECT_EQ(sync_->TicketOffload({}).status().code(), absl::StatusCode::kUnavailable);
  int stream = 0;
  EXPECT_EQ(sync_->TicketReload(&stream).status().code(), absl::StatusCode::kUnavailable);
  // A stale done write of the dead daemon lands after the release; releasing again heals it.
  page_.slots[1].reload_done.value = 5;
  sync_->ReleaseWaiters();
  EXPECT_EQ(page_.slots[1].reload_done.value.load(), kReleasedTicket);
}

// The dead-daemon hang (issue 30): one thread is inside a ticket call, stuck in a runtime call
// that holds the driver lock until a wait on reload_done passes; the release must not need that
// lock, nor the DeviceSync's own lock that the stuck thread holds. (The release used to create a
// fresh stream to write the words from: blocked on the driver lock for good.)
TEST_F(DeviceSyncTest, ReleaseWaitersFreesAThreadStuckInTheRuntimeBehindTheWait) {
  script_.stuck_word = &page_.slots[1].reload_done.value;
  std::future<absl::StatusOr<uint64_t>> stuck = std::async(std::launch::async, [&] {
    int consumer = 0;
    return sync_->TicketReload(&consumer);
  });
  script_.stuck_entered.get_future().wait();
  std::future<void> release =
      std::async(std::launch::async, [&] { sync_->ReleaseWaiters(); });
  ASSERT_EQ(release.wait_for(std::chrono::seconds(5)), std::future_status::ready)
      << "ReleaseWaiters is blocked behind the thread it must free";
  ASSERT_EQ(stuck.wait_for(std::chrono::seconds(5)), std::future_status::ready)
      << "the stuck runtime call was not freed";
  script_.stuck_word = nullptr;
  EXPECT_TRUE(script_.released_seen);
}

TEST_F(DeviceSyncTest, ExportBindsTheSlotWithoutMemory) {
  absl::StatusOr<DeviceAllocation> exported = sync_->Export();
  ASSERT_TRUE(exported.ok());
  EXPECT_EQ(exported->kind, wire::BufferKind::kCudaSemaphores);
  EXPECT_EQ(exported->device, 1);
  EXPECT_EQ(exported->device_uuid[0], 0xA1);
  EXPECT_EQ(exported->base, 0u);
  EXPECT_EQ(exported->bytes, 0u);
}

TEST_F(DeviceSyncTest, ReadCountersReadsBothSides) {
  page_.slots[1].produced.value = 4;
  page_.slots[1].reload_ready.value = 3;
  page_.slots[1].offload_done.value = 2;
  page_.slots[1].reload_done.value = 1;
  EXPECT_EQ(sync_->ReadCounters(), (std::array<uint64_t, 4>{4, 2, 3, 1}));
}

}  // namespace
}  // namespace tier::client::gpu
