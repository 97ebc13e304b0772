// DeviceRegistry over a fake GPU (fake_device_memory.h): registrations reused while the memory
// under them is the same, registered anew when it changed, and a registration dropped from the
// cache only dropped in tierd once no caller that received it can still name it in a job and
// the jobs that did are complete (RegistrationHolds).
#include "client/device_registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
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
  bool knows_segments = true;
  std::map<uint64_t, uint64_t> segment_bytes;     // segment registrations: their size now
  std::vector<wire::ExtendBuffer> extended;
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
          const bool segment =
              request.kind == static_cast<uint32_t>(wire::BufferKind::kCudaVmmSegment);
          if (segment && !daemon_.knows_segments) {
            return absl::InvalidArgumentError("unknown buffer kind 6");
          }
          EXPECT_LE(fds.size(), wire::kMaxFds);
          daemon_.registered.push_back(request);
          daemon_.fds.push_back(fds.size());
          if (segment) {
            wire::SegmentLayout layout;
            std::memcpy(&layout, request.handle, sizeof(layout));
            EXPECT_EQ(layout.page_count, fds.size());
            EXPECT_EQ(request.bytes, layout.page_bytes * layout.page_count);
            daemon_.segment_bytes[daemon_.next_id] = request.bytes;
          }
          return daemon_.next_id++;
        },
        [this](uint64_t id) {
          std::lock_guard lock(daemon_.mu);
          daemon_.unregistered.push_back(id);
          return absl::OkStatus();
        },
        [this](const wire::ExtendBuffer& request, absl::Span<const int> fds)
            -> absl::StatusOr<uint64_t> {
          std::lock_guard lock(daemon_.mu);
          EXPECT_EQ(request.page_count, fds.size());
          EXPECT_LE(fds.size(), wire::kMaxSegmentPagesPerMessage);
          auto it = daemon_.segment_bytes.find(request.buffer_id);
          if (it == daemon_.segment_bytes.end()) return absl::NotFoundError("no segment");
          if (request.offset != it->second) {
            return absl::FailedPreconditionError("extension not at the segment's end");
          }
          daemon_.extended.push_back(request);
          return it->second += request.page_bytes * request.page_count;
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

  // Pages [from, to) of `page` bytes mapped in the reservation.
  void MapPages(int to, int from = 0, uint64_t page = kPage) {
    for (int i = from; i < to; ++i) {
      gpu_.MapPage(kReservation, kReservationBytes, kReservation + i * page, page);
    }
  }
  static constexpr uint64_t kReservationBytes = uint64_t{1} << 36;

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
  gpu_.Remap(kReservation);
  ASSERT_TRUE(registry_->Register(At(kReservation), 4096).ok());
  daemon_.CompleteAll();
  ASSERT_TRUE(registry_->Register(At(kReservation), 4096).ok());
  EXPECT_FALSE(daemon_.Unregistered().empty()) << "the remapped pages' registrations went";
}

// ---- expandable segments ------------------------------------------------------------------

TEST_F(DeviceRegistryTest, ASegmentIsRegisteredOnceWholeAndServesEveryRangeInside) {
  MapPages(20);
  absl::StatusOr<DeviceRegistry::Registered> a =
      registry_->Register(At(kReservation + 3 * kPage + 64), 4096);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->offset, 3 * kPage + 64);
  EXPECT_EQ(a->bytes, 20 * kPage);
  ASSERT_EQ(daemon_.Registrations(), 1u);
  EXPECT_EQ(daemon_.registered[0].kind, static_cast<uint32_t>(wire::BufferKind::kCudaVmmSegment));
  EXPECT_EQ(daemon_.fds[0], 20u);
  wire::SegmentLayout layout;
  std::memcpy(&layout, daemon_.registered[0].handle, sizeof(layout));
  EXPECT_EQ(layout.page_bytes, kPage);
  EXPECT_EQ(layout.reserve_bytes, kReservationBytes);
  const DeviceRegistry::Counters before = registry_->counters();
  EXPECT_EQ(before.registrations, 1u);
  EXPECT_EQ(before.exports, 20u);
  // Every range inside, of any size, across pages: the same buffer, no export, no message.
  for (auto [at, len] : {std::pair{kReservation, 20 * kPage}, {kReservation + kPage - 8, 16},
                         {kReservation + 5 * kPage, 12 * kPage}}) {
    absl::StatusOr<DeviceRegistry::Registered> r = registry_->Register(At(at), len);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->buffer_id, a->buffer_id);
    EXPECT_EQ(r->offset, at - kReservation);
  }
  const DeviceRegistry::Counters after = registry_->counters();
  EXPECT_EQ(after.registrations, before.registrations);
  EXPECT_EQ(after.extensions, 0u);
  EXPECT_EQ(after.exports, before.exports);
  EXPECT_EQ(gpu_.Exports(), 20);
}

TEST_F(DeviceRegistryTest, ASegmentPastOneMessagesDescriptorsIsContinuedByExtensions) {
  MapPages(150);
  absl::StatusOr<DeviceRegistry::Registered> a = registry_->Register(At(kReservation), 4096);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->bytes, 150 * kPage);
  ASSERT_EQ(daemon_.Registrations(), 1u);
  EXPECT_EQ(daemon_.fds[0], wire::kMaxSegmentPagesPerMessage);
  ASSERT_EQ(daemon_.extended.size(), 2u);
  EXPECT_EQ(daemon_.extended[0].offset, 64 * kPage);
  EXPECT_EQ(daemon_.extended[0].page_count, 64u);
  EXPECT_EQ(daemon_.extended[1].offset, 128 * kPage);
  EXPECT_EQ(daemon_.extended[1].page_count, 22u);
  EXPECT_EQ(daemon_.segment_bytes[a->buffer_id], 150 * kPage);
  EXPECT_EQ(registry_->counters().extensions, 2u);
}

// PyTorch's large pages (20 MiB): a 512 MiB tensor spans 26 of them, past the 8 a kCudaVmmPages
// registration holds; inside a segment it is one (buffer, offset).
TEST_F(DeviceRegistryTest, ATensorOverManyLargePagesIsOneRange) {
  constexpr uint64_t kLarge = 20 * kMiB;
  MapPages(30, 0, kLarge);
  absl::StatusOr<DeviceRegistry::Registered> a =
      registry_->Register(At(kReservation + kLarge / 2), 512 * kMiB);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->offset, kLarge / 2);
  EXPECT_EQ(a->bytes, 30 * kLarge);
}

// The H100's driver reports a VMM page's own mapping as its address range, not the reservation:
// the run is still every page mapped side by side, and it grows within the GPU's memory.
TEST_F(DeviceRegistryTest, ASegmentIsFoundWhenTheDriverReportsOnlyAPagesRange) {
  {
    std::lock_guard lock(gpu_.mu);
    gpu_.range_is_the_page = true;
    gpu_.device_memory_bytes = 80 * 1024 * kMiB;
  }
  constexpr uint64_t kLarge = 20 * kMiB;
  MapPages(30, 0, kLarge);
  absl::StatusOr<DeviceRegistry::Registered> a =
      registry_->Register(At(kReservation + 3 * kLarge + 4096), 512 * kMiB);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->offset, 3 * kLarge + 4096);
  EXPECT_EQ(a->bytes, 30 * kLarge);
  MapPages(40, 30, kLarge);  // the allocator grows the segment
  absl::StatusOr<DeviceRegistry::Registered> b =
      registry_->Register(At(kReservation + 28 * kLarge), 8 * kLarge);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->buffer_id, a->buffer_id) << "grown in place, not registered anew";
}

TEST_F(DeviceRegistryTest, PagesMappedAfterASegmentExtendItInPlace) {
  MapPages(4);
  absl::StatusOr<DeviceRegistry::Registered> a = registry_->Register(At(kReservation), 4096);
  ASSERT_TRUE(a.ok());
  const uint64_t x = a->buffer_id;
  MapPages(9, 4);  // the allocator grows the segment
  absl::StatusOr<DeviceRegistry::Registered> b =
      registry_->Register(At(kReservation + 3 * kPage), 3 * kPage);  // pages 3 to 5
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->buffer_id, x);
  EXPECT_EQ(b->offset, 3 * kPage);
  EXPECT_EQ(b->bytes, 9 * kPage);  // every page mapped since, not only those the range needs
  ASSERT_EQ(daemon_.extended.size(), 1u);
  EXPECT_EQ(daemon_.extended[0].offset, 4 * kPage);
  EXPECT_EQ(daemon_.extended[0].page_count, 5u);
  EXPECT_EQ(daemon_.Registrations(), 1u);
  EXPECT_EQ(registry_->counters().exports, 9u);
  // And the new pages are served from the cache.
  absl::StatusOr<DeviceRegistry::Registered> c =
      registry_->Register(At(kReservation + 8 * kPage), kPage);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->buffer_id, x);
  EXPECT_EQ(daemon_.extended.size(), 1u);
  EXPECT_TRUE(daemon_.Unregistered().empty());
}

TEST_F(DeviceRegistryTest, ARemappedPageOfASegmentMakesANewRegistrationAndRetiresTheOld) {
  MapPages(6);
  absl::StatusOr<DeviceRegistry::Registered> a = registry_->Register(At(kReservation), 4096);
  ASSERT_TRUE(a.ok());
  const uint64_t x = a->buffer_id;
  registry_->Owe(std::move(a->lease));  // a caller still about to use page 0 through X
  gpu_.Remap(kReservation + 2 * kPage);  // empty_cache, then a new page at the same address
  absl::StatusOr<DeviceRegistry::Registered> b =
      registry_->Register(At(kReservation + 2 * kPage), 4096);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(b->buffer_id, x);
  EXPECT_EQ(b->bytes, 6 * kPage);
  EXPECT_TRUE(daemon_.Unregistered().empty());
  registry_->Paid(x, daemon_.Push());
  daemon_.CompleteAll();
  b->lease.Release();
  ASSERT_TRUE(registry_->Register(At(kReservation), 4096).ok());
  EXPECT_EQ(daemon_.Unregistered(), std::vector<uint64_t>{x});
  // Pages not touched by a range are not checked: a range on an unchanged page of the new
  // registration reuses it.
  absl::StatusOr<DeviceRegistry::Registered> c = registry_->Register(At(kReservation + kPage), 8);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->buffer_id, b->buffer_id);
}

TEST_F(DeviceRegistryTest, ARangePastTheMappedPagesIsOutOfRange) {
  MapPages(2);
  absl::StatusOr<DeviceRegistry::Registered> a = registry_->Register(At(kReservation), 4096);
  ASSERT_TRUE(a.ok());
  absl::StatusOr<DeviceRegistry::Registered> b =
      registry_->Register(At(kReservation + kPage), 2 * kPage);
  EXPECT_TRUE(absl::IsOutOfRange(b.status())) << b.status();
}

TEST_F(DeviceRegistryTest, ATierdWithoutSegmentsGetsPagesAsBefore) {
  daemon_.knows_segments = false;
  MapPages(12);
  absl::StatusOr<DeviceRegistry::Registered> a =
      registry_->Register(At(kReservation + kPage - 8), 16);  // pages 0 and 1
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(daemon_.Registrations(), 1u);
  EXPECT_EQ(daemon_.registered[0].kind, static_cast<uint32_t>(wire::BufferKind::kCudaVmmPages));
  EXPECT_EQ(a->bytes, 2 * kPage);
  absl::StatusOr<DeviceRegistry::Registered> b = registry_->Register(At(kReservation), 10 * kPage);
  EXPECT_TRUE(absl::IsOutOfRange(b.status())) << b.status();
}

TEST_F(DeviceRegistryTest, ASegmentOfOtherSizedPagesEndsAtTheSizeChange) {
  MapPages(4);
  gpu_.MapPage(kReservation, kReservationBytes, kReservation + 4 * kPage, 2 * kPage);
  absl::StatusOr<DeviceRegistry::Registered> a = registry_->Register(At(kReservation), 4096);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->bytes, 4 * kPage);
  // A range over the size change: pages, as before segments.
  absl::StatusOr<DeviceRegistry::Registered> b =
      registry_->Register(At(kReservation + 4 * kPage - 8), 16);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(b->buffer_id, a->buffer_id);
  EXPECT_EQ(daemon_.registered.back().kind,
            static_cast<uint32_t>(wire::BufferKind::kCudaVmmPages));
}

TEST(RegistrationHolds, AFreeRetiredIdIsDueOnlyAfterItsFence) {
  RegistrationHolds holds;
  holds.Hold(7);
  holds.Owe(7, 0);
  holds.Retire(7, /*last_job=*/3);
  EXPECT_TRUE(holds.TakeDue(100, 0).empty()) << "owed";
  holds.Paid(7, 5);
  EXPECT_TRUE(holds.TakeDue(5, 0).empty()) << "job 5 pending";
  EXPECT_EQ(holds.TakeDue(6, 0), std::vector<uint64_t>{7});
  EXPECT_EQ(holds.retired(), 0u);
  EXPECT_TRUE(holds.TakeDue(100, 0).empty());
}

// Finding 19 (issue 30): an id handed out through the C ABI and never used kept a retired
// registration (and the client memory it maps) in tierd until the session ended. An owed use
// lapses once the session has pushed kOwedJobs more jobs.
TEST(RegistrationHolds, AnOwedUseNeverPaidLapsesAfterKOwedJobs) {
  RegistrationHolds holds;
  holds.Hold(3);
  holds.Owe(3, 10);  // handed out when job 10 was the newest
  holds.Retire(3, 10);
  const uint64_t lapse = 10 + RegistrationHolds::kOwedJobs;
  EXPECT_TRUE(holds.TakeDue(11, lapse - 1).empty()) << "still owed";
  EXPECT_EQ(holds.holders(3), 1u);
  // Lapsed at `lapse`; due once every job up to then is complete.
  EXPECT_TRUE(holds.TakeDue(lapse, lapse).empty()) << "job `lapse` pending";
  EXPECT_EQ(holds.holders(3), 0u);
  EXPECT_EQ(holds.TakeDue(lapse + 1, lapse), std::vector<uint64_t>{3});
}

TEST(RegistrationHolds, APaymentWithoutADebtStillRaisesTheFence) {
  RegistrationHolds holds;
  holds.Retire(9, 1);
  holds.Paid(9, 8);  // a job naming 9 from a caller that kept the id
  EXPECT_TRUE(holds.TakeDue(8, 0).empty());
  EXPECT_EQ(holds.TakeDue(9, 0), std::vector<uint64_t>{9});
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
