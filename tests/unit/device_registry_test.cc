// DeviceRegistry over a fake GPU (fake_device_memory.h): registrations reused while the memory
// under them is the same, registered anew when it changed, and a registration dropped from the
// cache only dropped in tierd once no caller that received it can still name it in a job and
// the jobs that did are complete (RegistrationHolds).
#include "client/device_registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "client/registration_holds.h"
#include "fake_device_memory.h"

namespace tier::client {
namespace {

using gpu::FakeDeviceMemory;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kPage = 2 * kMiB;
constexpr uint64_t kReservation = uint64_t{1} << 40;  // a VA reservation (an expandable segment)

const void* At(uint64_t address) { return reinterpret_cast<const void*>(address); }

// What the daemon would see: registrations (kind, pages, bytes) and unregistrations, and the
// session's jobs as the registry's JobMarks read them.
struct Daemon {
  std::mutex mu;
  uint64_t next_id = 1;
  std::vector<wire::RegisterBuffer> registered;  // in order; [id - 1]
  std::vector<size_t> fds;                       // descriptors of each registration
  std::vector<uint64_t> unregistered;
  uint64_t last_pushed = 0;
  uint64_t oldest_pending = 1;  // next job id when none is pending

  std::vector<uint64_t> Unregistered() {
    std::lock_guard lock(mu);
    return unregistered;
  }
  size_t Registrations() {
    std::lock_guard lock(mu);
    return registered.size();
  }
  // A job pushed (pending until Complete).
  uint64_t Push() {
    std::lock_guard lock(mu);
    return ++last_pushed;
  }
  void CompleteAll() {
    std::lock_guard lock(mu);
    oldest_pending = last_pushed + 1;
  }
};

class DeviceRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_ = std::make_unique<DeviceRegistry>(
        [this](const wire::RegisterBuffer& request, absl::Span<const int> fds)
            -> absl::StatusOr<uint64_t> {
          std::lock_guard lock(daemon_.mu);
          if (request.kind == static_cast<uint32_t>(wire::BufferKind::kCudaSemaphores)) {
            return 1000;  // the semaphore page: not counted
          }
          daemon_.registered.push_back(request);
          daemon_.fds.push_back(fds.size());
          return daemon_.next_id++;
        },
        [this](uint64_t id) {
          std::lock_guard lock(daemon_.mu);
          daemon_.unregistered.push_back(id);
          return absl::OkStatus();
        },
        tickets_.get(),
        DeviceRegistry::JobMarks{[this] {
                                   std::lock_guard lock(daemon_.mu);
                                   return daemon_.last_pushed;
                                 },
                                 [this] {
                                   std::lock_guard lock(daemon_.mu);
                                   return daemon_.oldest_pending;
                                 }},
        std::make_unique<FakeDeviceMemory>(&gpu_));
  }

  // `count` pages of kPage mapped from the reservation's start.
  void MapPages(int count) {
    for (int i = 0; i < count; ++i) {
      gpu_.MapPage(kReservation, uint64_t{1} << 32, kReservation + i * kPage, kPage);
    }
  }

  std::unique_ptr<ring::TicketPage> tickets_ = std::make_unique<ring::TicketPage>();
  FakeDeviceMemory::State gpu_;
  Daemon daemon_;
  std::unique_ptr<DeviceRegistry> registry_;
};

TEST_F(DeviceRegistryTest, AnAllocationIsRegisteredOnceAndReusedWithoutAnExport) {
  gpu_.Malloc(0x10000000, 64 * kMiB);
  absl::StatusOr<DeviceRegistry::Registered> a = registry_->Register(At(0x10000000 + 4096), 8192);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->offset, 4096u);
  EXPECT_EQ(a->bytes, 64 * kMiB);
  const int exports = gpu_.Exports();
  absl::StatusOr<DeviceRegistry::Registered> b = registry_->Register(At(0x10000000 + kMiB), kMiB);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->buffer_id, a->buffer_id);
  EXPECT_EQ(b->offset, kMiB);
  EXPECT_EQ(gpu_.Exports(), exports);  // the cache answered
  EXPECT_EQ(daemon_.Registrations(), 1u);
  EXPECT_EQ(registry_->DeviceOf(a->buffer_id), 0);
}

TEST_F(DeviceRegistryTest, ALeaseHoldsARegistrationUntilReleased) {
  gpu_.Malloc(0x10000000, 64 * kMiB);
  absl::StatusOr<DeviceRegistry::Registered> a = registry_->Register(At(0x10000000), 4096);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(registry_->holders(a->buffer_id), 1u);
  {
    absl::StatusOr<DeviceRegistry::Registered> b = registry_->Register(At(0x10000000), 4096);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(registry_->holders(a->buffer_id), 2u);
  }
  EXPECT_EQ(registry_->holders(a->buffer_id), 1u);
  a->lease.Release();
  EXPECT_EQ(registry_->holders(a->buffer_id), 0u);
}

// The stress test's INVALID_ARGUMENT: caller A got registration X for a page that is still the
// same memory; caller B, registering another range of X, finds one of X's pages remapped. X
// leaves the cache, but stays registered in tierd until A has pushed its job and that job is
// complete.
TEST_F(DeviceRegistryTest, AStaleRegistrationStaysInTierdWhileACallerHoldsIt) {
  MapPages(4);
  absl::StatusOr<DeviceRegistry::Registered> a =
      registry_->Register(At(kReservation + kPage - 4096), 8192);  // over pages 0 and 1
  ASSERT_TRUE(a.ok()) << a.status();
  const uint64_t x = a->buffer_id;
  registry_->Owe(std::move(a->lease));  // handed out through the C ABI
  gpu_.Remap(kReservation + kPage);     // page 1 freed and mapped anew
  absl::StatusOr<DeviceRegistry::Registered> b =
      registry_->Register(At(kReservation + kPage), 4096);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(b->buffer_id, x);
  EXPECT_TRUE(daemon_.Unregistered().empty()) << "dropped under caller A";
  EXPECT_EQ(registry_->DeviceOf(x), 0) << "A's job must still find its GPU";

  // A pushes its job; until it completes, X stays.
  const uint64_t job = daemon_.Push();
  registry_->Paid(x, job);
  b->lease.Release();
  ASSERT_TRUE(registry_->Register(At(kReservation + 2 * kPage), 4096).ok());
  EXPECT_TRUE(daemon_.Unregistered().empty()) << "dropped before A's job completed";

  daemon_.CompleteAll();
  ASSERT_TRUE(registry_->Register(At(kReservation + 2 * kPage), 4096).ok());
  EXPECT_EQ(daemon_.Unregistered(), std::vector<uint64_t>{x});
  EXPECT_EQ(registry_->DeviceOf(x), -1);
  // Once only.
  ASSERT_TRUE(registry_->Register(At(kReservation + 2 * kPage), 4096).ok());
  EXPECT_EQ(daemon_.Unregistered().size(), 1u);
}

TEST_F(DeviceRegistryTest, AStaleRegistrationNobodyHoldsGoesOnceItsJobsAreComplete) {
  MapPages(2);
  absl::StatusOr<DeviceRegistry::Registered> a = registry_->Register(At(kReservation), 4096);
  ASSERT_TRUE(a.ok());
  const uint64_t x = a->buffer_id;
  a->lease.Release();
  const uint64_t job = daemon_.Push();  // a job on X, in the ring, not yet taken by tierd
  registry_->Paid(x, job);
  gpu_.Remap(kReservation);
  ASSERT_TRUE(registry_->Register(At(kReservation), 4096).ok());
  ASSERT_TRUE(registry_->Register(At(kReservation), 4096).ok());
  EXPECT_TRUE(daemon_.Unregistered().empty());
  daemon_.CompleteAll();
  ASSERT_TRUE(registry_->Register(At(kReservation), 4096).ok());
  EXPECT_EQ(daemon_.Unregistered(), std::vector<uint64_t>{x});
}

TEST_F(DeviceRegistryTest, ABatchWhoseLaterRangeFindsAnEarlierOnesRegistrationStaleKeepsItsIds) {
  MapPages(4);
  // Cached: X over pages 0 and 1.
  absl::StatusOr<DeviceRegistry::Registered> warm =
      registry_->Register(At(kReservation + kPage - 4096), 8192);
  ASSERT_TRUE(warm.ok());
  const uint64_t x = warm->buffer_id;
  warm->lease.Release();
  gpu_.Remap(kReservation + kPage);
  // The batch: range 0 on page 0 (still X's memory), range 1 on page 1 (remapped).
  std::vector<DeviceRegistry::Registered> batch;
  for (uint64_t at : {kReservation, kReservation + kPage}) {
    absl::StatusOr<DeviceRegistry::Registered> r = registry_->Register(At(at), 4096);
    ASSERT_TRUE(r.ok());
    batch.push_back(*std::move(r));
  }
  EXPECT_EQ(batch[0].buffer_id, x);
  EXPECT_NE(batch[1].buffer_id, x);
  for (auto& r : batch) registry_->Owe(std::move(r.lease));
  EXPECT_TRUE(daemon_.Unregistered().empty());
  daemon_.Push();
  const uint64_t last = daemon_.Push();  // the batch's two jobs
  for (auto& r : batch) registry_->Paid(r.buffer_id, last);
  daemon_.CompleteAll();
  ASSERT_TRUE(registry_->Register(At(kReservation + 3 * kPage), 4096).ok());
  EXPECT_EQ(daemon_.Unregistered(), std::vector<uint64_t>{x});
}

TEST_F(DeviceRegistryTest, AnUnregisteredBufferIsForgotten) {
  MapPages(1);
  absl::StatusOr<DeviceRegistry::Registered> a = registry_->Register(At(kReservation), 4096);
  ASSERT_TRUE(a.ok());
  const uint64_t x = a->buffer_id;
  registry_->Owe(std::move(a->lease));
  gpu_.Remap(kReservation);
  ASSERT_TRUE(registry_->Register(At(kReservation), 4096).ok());
  registry_->Forget(x);  // the application unregistered it itself
  daemon_.CompleteAll();
  ASSERT_TRUE(registry_->Register(At(kReservation), 4096).ok());
  EXPECT_TRUE(daemon_.Unregistered().empty()) << "unregistered twice";
  EXPECT_EQ(registry_->DeviceOf(x), -1);
}

// Many threads registering ranges of pages that keep being remapped: no registration a thread
// got is dropped before that thread paid for it.
TEST_F(DeviceRegistryTest, NoThreadSeesItsRegistrationDroppedBeforeItsJob) {
  MapPages(8);
  std::atomic<bool> stop{false};
  std::atomic<int> violations{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) {
        uint64_t at = kReservation + ((t + i) % 8) * kPage;
        absl::StatusOr<DeviceRegistry::Registered> r = registry_->Register(At(at), 4096);
        if (!r.ok()) continue;
        uint64_t id = r->buffer_id;
        registry_->Owe(std::move(r->lease));
        std::vector<uint64_t> gone = daemon_.Unregistered();
        if (std::find(gone.begin(), gone.end(), id) != gone.end()) ++violations;
        registry_->Paid(id, daemon_.Push());
      }
    });
  }
  std::thread remapper([&] {
    for (int i = 0; !stop.load(); ++i) {
      gpu_.Remap(kReservation + (i % 8) * kPage);
      daemon_.CompleteAll();
      std::this_thread::yield();
    }
  });
  for (auto& t : threads) t.join();
  stop = true;
  remapper.join();
  EXPECT_EQ(violations.load(), 0);
  daemon_.CompleteAll();
  ASSERT_TRUE(registry_->Register(At(kReservation), 4096).ok());
  EXPECT_FALSE(daemon_.Unregistered().empty()) << "the remapped pages' registrations went";
}

TEST(RegistrationHolds, AFreeRetiredIdIsDueOnlyAfterItsFence) {
  RegistrationHolds holds;
  holds.Hold(7);
  holds.Owe(7);
  holds.Retire(7, /*last_job=*/3);
  EXPECT_TRUE(holds.TakeDue(100).empty()) << "owed";
  holds.Paid(7, 5);
  EXPECT_TRUE(holds.TakeDue(5).empty()) << "job 5 pending";
  EXPECT_EQ(holds.TakeDue(6), std::vector<uint64_t>{7});
  EXPECT_EQ(holds.retired(), 0u);
  EXPECT_TRUE(holds.TakeDue(100).empty());
}

TEST(RegistrationHolds, APaymentWithoutADebtStillRaisesTheFence) {
  RegistrationHolds holds;
  holds.Retire(9, 1);
  holds.Paid(9, 8);  // a job naming 9 from a caller that kept the id
  EXPECT_TRUE(holds.TakeDue(8).empty());
  EXPECT_EQ(holds.TakeDue(9), std::vector<uint64_t>{9});
}

TEST(RegistrationHolds, ACachedIdNobodyHoldsIsNotRemembered) {
  RegistrationHolds holds;
  holds.Hold(3);
  holds.Release(3, 0);
  EXPECT_EQ(holds.holders(3), 0u);
  holds.Paid(3, 4);
  EXPECT_EQ(holds.retired(), 0u);
}

}  // namespace
}  // namespace tier::client
