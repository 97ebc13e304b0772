// DeviceSync, the client's half of the ticket protocol (gpu/ticket_protocol.h), over a scripted
// fake runtime: which stream operations each call enqueues, in which order, on which stream; that
// a failed call takes no ticket; that tickets reach the ticket stream in ticket order from many
// threads; and ReleaseWaiters' retries. The same code runs over CUDA and HIP (sync_runtime_*.cc);
// the GPU suites (scripts/gpu-tests) run it on the device.
#include "client/gpu/device_sync.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu/ticket_protocol.h"

namespace tier::client::gpu {
namespace {

using ::tier::gpu::kMaxTicket;
using ::tier::gpu::kOffloadDoneOffset;
using ::tier::gpu::kReleasedTicket;
using ::tier::gpu::kReloadDoneOffset;
using ::tier::gpu::kSemaphoreAllocBytes;
using ::tier::gpu::kSemaphorePageBytes;

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
  int release_streams_blocked = 0;  // the first N release streams never finish
  // Resources alive.
  int streams = 0;
  int events = 0;
  int allocations = 0;
  alignas(64) char page[kSemaphoreAllocBytes / 1024] = {};  // stands in for device memory

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
  absl::StatusOr<void*> Malloc(uint64_t bytes) const override {
    EXPECT_EQ(bytes, kSemaphoreAllocBytes);
    ++s_->allocations;
    return static_cast<void*>(s_->page);
  }
  void Free(void* ptr) const override {
    EXPECT_EQ(ptr, s_->page);
    --s_->allocations;
  }
  absl::StatusOr<std::array<uint8_t, 64>> IpcHandle(void* ptr) const override {
    std::array<uint8_t, 64> handle{};
    std::memcpy(handle.data(), &ptr, sizeof(ptr));
    return handle;
  }
  absl::StatusOr<uint64_t> HostDevicePointer(void* host) const override {
    return reinterpret_cast<uint64_t>(host) + kDeviceView;
  }
  absl::StatusOr<Stream> CreateStream(bool highest_priority) const override {
    std::lock_guard lock(s_->mu);
    ++s_->streams;
    auto stream = reinterpret_cast<Stream>(next_handle_++);
    s_->ops.push_back(absl::StrCat("create stream ", Name(stream),
                                   highest_priority ? " highest" : ""));
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
    if (s_->fail_record) return absl::InvalidArgumentError("cudaErrorInvalidResourceHandle");
    s_->Log(absl::StrCat("record after ", Name(stream)));
    return absl::OkStatus();
  }
  absl::Status StreamWaitEvent(Stream stream, Event) const override {
    s_->Log(absl::StrCat("stream ", Name(stream), " waits event"));
    return absl::OkStatus();
  }
  absl::Status MemsetAsync(void* ptr, uint64_t bytes, Stream stream) const override {
    std::memset(ptr, 0, std::min<uint64_t>(bytes, sizeof(s_->page)));
    s_->Log(absl::StrCat("zero ", bytes, " on ", Name(stream)));
    return absl::OkStatus();
  }
  absl::Status CopyToHostAsync(void* host, const void* ptr, uint64_t bytes,
                               Stream stream) const override {
    std::memcpy(host, ptr, bytes);
    s_->Log(absl::StrCat("read ", bytes, " on ", Name(stream)));
    return absl::OkStatus();
  }
  absl::Status StreamSynchronize(Stream stream) const override {
    s_->Log(absl::StrCat("synchronize ", Name(stream)));
    return absl::OkStatus();
  }
  absl::StatusOr<bool> StreamDone(Stream stream) const override {
    // Release streams are numbered in creation order; the first N stay blocked.
    std::lock_guard lock(s_->mu);
    return reinterpret_cast<uintptr_t>(stream) - kFirstHandle >=
           static_cast<uintptr_t>(3 + s_->release_streams_blocked);  // 2 streams + 1 event first
  }
  absl::Status WriteValue64(Stream stream, uint64_t address, uint64_t value) const override {
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
  // Names the page's words so the expectations read as the protocol does.
  std::string Where(uint64_t address) const {
    auto page = reinterpret_cast<uint64_t>(s_->page);
    if (address == page + kOffloadDoneOffset) return "offload_done";
    if (address == page + kReloadDoneOffset) return "reload_done";
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
    // Handles: 1000 ticket stream, 1001 read stream, 1002 event.
    ticket_ = "1000";
    produced_ = absl::StrCat("host word @",
                             reinterpret_cast<uintptr_t>(&page_.slots[1].produced.value));
    reload_ready_ = absl::StrCat("host word @",
                                 reinterpret_cast<uintptr_t>(&page_.slots[1].reload_ready.value));
    script_.Clear();
  }

  Script script_;
  ring::TicketPage page_{};
  std::unique_ptr<DeviceSync> sync_;
  std::string ticket_, produced_, reload_ready_;
};

TEST(DeviceSyncCreate, ZeroesThePageOnTheTicketStreamAndWaitsForIt) {
  Script script;
  std::memset(script.page, 0x5A, sizeof(script.page));
  ring::TicketPage page{};
  absl::StatusOr<std::unique_ptr<DeviceSync>> sync =
      DeviceSync::Create(std::make_unique<FakeRuntime>(&script), 0, &page.slots[0]);
  ASSERT_TRUE(sync.ok()) << sync.status();
  EXPECT_EQ(script.Ops(), (std::vector<std::string>{
                              "create stream 1000", "create stream 1001",
                              absl::StrCat("zero ", kSemaphorePageBytes, " on 1000"),
                              "synchronize 1000"}));
  EXPECT_EQ(std::count(script.page, script.page + sizeof(script.page), 0),
            static_cast<long>(sizeof(script.page)));
  EXPECT_EQ(script.allocations, 1);
  sync->reset();
  EXPECT_EQ(script.allocations, 0);
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
  EXPECT_EQ(script.allocations, 0);
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
                "stream " + Name(&consumer) + " waits reload_done >= 1",
                "stream " + Name(&consumer) + " waits offload_done >= 7"}));
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
  ASSERT_TRUE(sync_->Export().ok());
  ASSERT_TRUE(sync_->ReadCounters().ok());
  EXPECT_EQ(script_.device_switches - switches, 5);
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

TEST_F(DeviceSyncTest, ReleaseWaitersRetriesFromFreshStreamsUntilAWriteLands) {
  script_.release_streams_blocked = 2;
  ASSERT_TRUE(sync_->ReleaseWaiters().ok());
  int released = 0;
  for (const std::string& op : script_.Ops()) {
    if (op.find(absl::StrCat("= ", kReleasedTicket)) != std::string::npos) ++released;
  }
  EXPECT_EQ(released, 6);  // both done words, from each of three streams
  EXPECT_EQ(script_.Ops()[0], "create stream 1003 highest");
  EXPECT_EQ(sync_->TicketOffload({}).status().code(), absl::StatusCode::kUnavailable);
  int stream = 0;
  EXPECT_EQ(sync_->TicketReload(&stream).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(DeviceSyncTest, ReleaseWaitersGivesUpWhenEveryStreamStaysBlocked) {
  script_.release_streams_blocked = 100;
  EXPECT_EQ(sync_->ReleaseWaiters().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(script_.streams, 2);  // the release streams were handed back
}

TEST_F(DeviceSyncTest, ExportNamesTheWholePageAllocation) {
  absl::StatusOr<DeviceAllocation> exported = sync_->Export();
  ASSERT_TRUE(exported.ok());
  EXPECT_EQ(exported->kind, wire::BufferKind::kCudaSemaphores);
  EXPECT_EQ(exported->device, 1);
  EXPECT_EQ(exported->device_uuid[0], 0xA1);
  EXPECT_EQ(exported->base, reinterpret_cast<uint64_t>(script_.page));
  EXPECT_EQ(exported->bytes, kSemaphoreAllocBytes);
  void* named = nullptr;
  std::memcpy(&named, exported->ipc_handle.data(), sizeof(named));
  EXPECT_EQ(named, script_.page);
}

TEST_F(DeviceSyncTest, ReadCountersReadsBothSides) {
  page_.slots[1].produced.value = 4;
  page_.slots[1].reload_ready.value = 3;
  uint64_t offload_done = 2, reload_done = 1;
  std::memcpy(script_.page + kOffloadDoneOffset, &offload_done, 8);
  std::memcpy(script_.page + kReloadDoneOffset, &reload_done, 8);
  absl::StatusOr<std::array<uint64_t, 4>> counters = sync_->ReadCounters();
  ASSERT_TRUE(counters.ok());
  EXPECT_EQ(*counters, (std::array<uint64_t, 4>{4, 2, 3, 1}));
}

}  // namespace
}  // namespace tier::client::gpu
