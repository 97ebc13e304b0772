// The object table alone: each transition, what it gives back (extent, spill record), the quota,
// and the transitions that do not apply in an object's state. No pool and no store: extents and
// records are plain values here, so a leak or a double release shows as a wrong Release; the
// home they go back to counts what came back.
#include "daemon/tiers/object_table.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tier::daemon {
namespace {

constexpr uint64_t kLen = 1000;
constexpr uint64_t kCharge = 4096;  // what the pool would hand out for kLen
const storage::Extent kExtent{8192, 4096};
const storage::SpillRecord kRecord{42, 0, storage::Extent{0, 4096}, kLen};

// Where the objects' memory goes back: counted.
class CountingHome : public MemoryHome {
 public:
  void Return(std::optional<storage::Extent> extent,
              std::optional<storage::SpillRecord> record) override {
    if (extent) extents.push_back(*extent);
    if (record) records.push_back(*record);
  }
  std::vector<storage::Extent> extents;
  std::vector<storage::SpillRecord> records;
};

class ObjectTableTest : public ::testing::Test {
 protected:
  // A filled object `id`, in host memory at kExtent, nothing using it.
  std::shared_ptr<Object> Ready(uint64_t id) {
    absl::StatusOr<std::shared_ptr<Object>> object = table_.Create(id, kLen, 0, id, kCharge);
    EXPECT_TRUE(object.ok()) << object.status();
    EXPECT_TRUE(table_.Admit(**object, kExtent, home_).ok());
    std::vector<ObjectWaiter> waiters;
    EXPECT_TRUE(table_.EndFill(**object, absl::OkStatus(), &waiters).empty());
    return *object;
  }
  // `object` written to NVMe (kRecord) and its extent gone.
  void Spill(Object& object) {
    storage::Extent extent;
    ASSERT_EQ(table_.BeginSpill(object, &extent), ObjectTable::SpillStart::kBegan);
    bool spilled = false;
    Release release = table_.EndSpill(object, kRecord, &spilled);
    ASSERT_TRUE(spilled);
    ASSERT_EQ(release.extent(), kExtent);
    ASSERT_FALSE(release.record());
  }

  CountingHome home_;  // (declared first: it outlives every Release of the test)
  ObjectTable table_{3 * kCharge};
};

TEST_F(ObjectTableTest, CreateChargesTheQuotaAndRefusesDuplicatesAndOverruns) {
  ASSERT_TRUE(table_.Create(1, kLen, 0, 1, kCharge).ok());
  EXPECT_EQ(table_.used_bytes(), kCharge);
  EXPECT_EQ(table_.Create(1, kLen, 0, 2, kCharge).status().code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(table_.Create(2, kLen, 0, 3, 2 * kCharge).ok());
  absl::Status over = table_.Create(3, kLen, 0, 4, 1).status();
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(over.message()).find("quota"), std::string::npos) << over;
  EXPECT_EQ(table_.size(), 2u);
  EXPECT_EQ(table_.used_bytes(), 3 * kCharge);
}

TEST_F(ObjectTableTest, AdmissionChargesTheExtentAndHappensOnce) {
  std::shared_ptr<Object> object = *table_.Create(1, kLen, 0, 1, kCharge);
  ASSERT_TRUE(table_.Admit(*object, storage::Extent{0, 2 * kCharge}, home_).ok());
  EXPECT_EQ(table_.used_bytes(), 2 * kCharge);  // the extent as handed out
  EXPECT_EQ(table_.Admit(*object, kExtent, home_).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(table_.Look(*object).extent, (storage::Extent{0, 2 * kCharge}));
}

TEST_F(ObjectTableTest, AFailedFillLeavesNoObjectAndGivesEverythingBack) {
  std::shared_ptr<Object> object = *table_.Create(1, kLen, 0, 1, kCharge);
  ASSERT_TRUE(table_.Admit(*object, kExtent, home_).ok());
  // A reload accepted during the fill, before its copy reached the engine, waits for it.
  absl::StatusOr<ObjectTable::Pinned> reload = table_.PinForReload(1, kLen);
  ASSERT_TRUE(reload.ok());
  EXPECT_TRUE(reload->filling);
  EXPECT_FALSE(reload->fill_submitted) << "admitted, but its copy is not in the engine yet";
  table_.FillSubmitted(*object);
  absl::StatusOr<ObjectTable::Pinned> after = table_.PinForReload(1, kLen);
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(after->fill_submitted);
  table_.Unpin(*object);
  std::vector<std::string> heard;
  EXPECT_EQ(table_.AwaitFill(*object, [&](absl::Status s) { heard.push_back(s.ToString()); }),
            ObjectTable::Fill::kRunning);
  std::vector<ObjectWaiter> waiters;
  Release fill = table_.EndFill(*object, absl::DataLossError("copy failed"), &waiters);
  EXPECT_TRUE(fill.empty()) << "the reload still pins it";
  ASSERT_EQ(waiters.size(), 1u);
  waiters[0](absl::DataLossError("copy failed"));
  EXPECT_EQ(heard.size(), 1u);
  EXPECT_EQ(table_.AwaitFill(*object, [](absl::Status) { ADD_FAILURE(); }),
            ObjectTable::Fill::kFailed);
  EXPECT_EQ(table_.PinForReload(1, kLen).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table_.Free(1).status().code(), absl::StatusCode::kNotFound);
  Release last = table_.Unpin(*object);
  EXPECT_EQ(last.extent(), kExtent);
  EXPECT_EQ(table_.used_bytes(), 0u);
  EXPECT_EQ(table_.size(), 0u);
}

TEST_F(ObjectTableTest, AnObjectWaitingForAdmissionFailsWithNothingToGiveBack) {
  std::shared_ptr<Object> object = *table_.Create(1, kLen, 0, 1, kCharge);
  absl::StatusOr<ObjectTable::Pinned> reload = table_.PinForReload(1, kLen);
  ASSERT_TRUE(reload.ok());
  EXPECT_FALSE(reload->fill_submitted);
  std::vector<ObjectWaiter> waiters;
  EXPECT_TRUE(table_.EndFill(*object, absl::ResourceExhaustedError("no room"), &waiters).empty());
  EXPECT_TRUE(table_.Unpin(*object).empty());
  EXPECT_EQ(table_.used_bytes(), 0u) << "the charge of an unadmitted object is refunded too";
}

TEST_F(ObjectTableTest, ReloadChecksTheObjectAndItsLength) {
  Ready(1);
  EXPECT_EQ(table_.PinForReload(2, kLen).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table_.PinForReload(1, kLen + 1).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<ObjectTable::Pinned> pinned = table_.PinForReload(1, kLen);
  ASSERT_TRUE(pinned.ok());
  EXPECT_FALSE(pinned->filling);
  EXPECT_FALSE(pinned->on_nvme);
  EXPECT_EQ(pinned->prefetch, ObjectTable::Prefetch::kNone);
  EXPECT_EQ(table_.Look(*pinned->object).pins, 1u);
  EXPECT_EQ(table_.extent(*pinned->object), kExtent);
}

TEST_F(ObjectTableTest, AFreedObjectsMemoryGoesWithTheLastPin) {
  std::shared_ptr<Object> object = Ready(1);
  ASSERT_TRUE(table_.PinForReload(1, kLen).ok());
  ASSERT_TRUE(table_.PinForReload(1, kLen).ok());
  absl::StatusOr<Release> freed = table_.Free(1);
  ASSERT_TRUE(freed.ok());
  EXPECT_TRUE(freed->empty()) << "two reloads still read it";
  EXPECT_EQ(table_.size(), 0u);
  EXPECT_EQ(table_.used_bytes(), kCharge) << "charged until the memory goes";
  EXPECT_TRUE(table_.Unpin(*object).empty());
  Release last = table_.Unpin(*object);
  EXPECT_EQ(last.extent(), kExtent);
  EXPECT_EQ(table_.used_bytes(), 0u);
  EXPECT_TRUE(table_.Unpin(*object).empty()) << "an extra unpin must not give it back twice";
}

TEST_F(ObjectTableTest, DropAfterReloadRemovesOnlyThatObject) {
  std::shared_ptr<Object> old = Ready(1);
  ASSERT_TRUE(table_.PinForReload(1, kLen).ok());
  ASSERT_TRUE(table_.Free(1).ok());
  std::shared_ptr<Object> reused = Ready(1);  // the client reused the id meanwhile
  table_.DropAfterReload(*old);
  EXPECT_EQ(table_.size(), 1u) << "the new object of the same id must stay";
  EXPECT_EQ(table_.Unpin(*old).extent(), kExtent);
  EXPECT_TRUE(table_.PinForReload(1, kLen).ok());
}

TEST_F(ObjectTableTest, DropAllGivesBackWhatNoJobUses) {
  std::shared_ptr<Object> idle = Ready(1);
  std::shared_ptr<Object> busy = Ready(2);
  std::shared_ptr<Object> spilled = Ready(3);
  Spill(*spilled);
  ASSERT_TRUE(table_.PinForReload(2, kLen).ok());
  std::vector<Release> released = table_.DropAll();
  ASSERT_EQ(released.size(), 2u);
  int extents = 0, records = 0;
  for (const Release& r : released) {
    extents += r.extent().has_value();
    records += r.record().has_value();
  }
  EXPECT_EQ(extents, 1);
  EXPECT_EQ(records, 1);
  EXPECT_EQ(table_.size(), 0u);
  EXPECT_EQ(table_.Unpin(*busy).extent(), kExtent);
  EXPECT_EQ(table_.used_bytes(), 0u);
}

TEST_F(ObjectTableTest, OnlyAReadyUnusedHostObjectIsSpilled) {
  std::shared_ptr<Object> filling = *table_.Create(1, kLen, 0, 1, kCharge);
  ASSERT_TRUE(table_.Admit(*filling, kExtent, home_).ok());
  storage::Extent extent;
  EXPECT_EQ(table_.BeginSpill(*filling, &extent), ObjectTable::SpillStart::kNot);
  std::shared_ptr<Object> used = Ready(2);
  ASSERT_TRUE(table_.PinForReload(2, kLen).ok());
  EXPECT_EQ(table_.BeginSpill(*used, &extent), ObjectTable::SpillStart::kBusy);
  std::shared_ptr<Object> ready = Ready(3);
  ASSERT_EQ(table_.BeginSpill(*ready, &extent), ObjectTable::SpillStart::kBegan);
  EXPECT_EQ(extent, kExtent);
  EXPECT_EQ(table_.Look(*ready).where, Object::Where::kSpilling);
  EXPECT_EQ(table_.BeginSpill(*ready, &extent), ObjectTable::SpillStart::kNot);
  ASSERT_TRUE(table_.Free(3).ok());
  EXPECT_EQ(table_.BeginSpill(*ready, &extent), ObjectTable::SpillStart::kNot);
}

TEST_F(ObjectTableTest, AWriteThatLandsWhileAReloadReadsKeepsTheHostCopy) {
  std::shared_ptr<Object> object = Ready(1);
  storage::Extent extent;
  ASSERT_EQ(table_.BeginSpill(*object, &extent), ObjectTable::SpillStart::kBegan);
  absl::StatusOr<ObjectTable::Pinned> reload = table_.PinForReload(1, kLen);
  ASSERT_TRUE(reload.ok());
  EXPECT_FALSE(reload->on_nvme) << "the host copy is whole while the write runs";
  bool spilled = true;
  Release release = table_.EndSpill(*object, kRecord, &spilled);
  EXPECT_FALSE(spilled);
  EXPECT_EQ(release.record(), kRecord) << "the record is not needed";
  EXPECT_FALSE(release.extent());
  EXPECT_EQ(table_.Look(*object).where, Object::Where::kHost);
  EXPECT_TRUE(table_.Unpin(*object).empty());
}

TEST_F(ObjectTableTest, AFailedWriteLeavesTheObjectInHostMemory) {
  std::shared_ptr<Object> object = Ready(1);
  storage::Extent extent;
  ASSERT_EQ(table_.BeginSpill(*object, &extent), ObjectTable::SpillStart::kBegan);
  bool spilled = true;
  EXPECT_TRUE(table_.EndSpill(*object, absl::DataLossError("EIO"), &spilled).empty());
  EXPECT_FALSE(spilled);
  EXPECT_EQ(table_.Look(*object).where, Object::Where::kHost);
  EXPECT_EQ(table_.Look(*object).pins, 0u);
  bool again = true;
  EXPECT_TRUE(table_.EndSpill(*object, kRecord, &again).empty()) << "no spill began";
  EXPECT_FALSE(again);
}

TEST_F(ObjectTableTest, AnObjectFreedDuringItsWriteGivesBackBoth) {
  std::shared_ptr<Object> object = Ready(1);
  storage::Extent extent;
  ASSERT_EQ(table_.BeginSpill(*object, &extent), ObjectTable::SpillStart::kBegan);
  ASSERT_TRUE(table_.Free(1).ok());
  bool spilled = true;
  Release release = table_.EndSpill(*object, kRecord, &spilled);
  EXPECT_FALSE(spilled);
  EXPECT_EQ(release.extent(), kExtent);
  EXPECT_EQ(release.record(), kRecord);
  EXPECT_EQ(table_.used_bytes(), 0u);
}

TEST_F(ObjectTableTest, AReadBringsTheBytesBackAndLaterReadersJoinIt) {
  std::shared_ptr<Object> object = Ready(1);
  Spill(*object);
  absl::StatusOr<ObjectTable::Pinned> first = table_.PinForReload(1, kLen);
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(first->on_nvme);
  EXPECT_EQ(first->prefetch, ObjectTable::Prefetch::kMiss);
  EXPECT_EQ(table_.BeginFetch(*object, ObjectTable::Reader::kPipelined, nullptr).fetch,
            ObjectTable::Fetch::kNoRoom);
  EXPECT_EQ(table_.Look(*object).where, Object::Where::kNvme);
  const storage::Extent fresh{65536, 4096};
  auto allocate = [&]() -> std::optional<storage::Extent> { return fresh; };
  ObjectTable::FetchBegun begun =
      table_.BeginFetch(*object, ObjectTable::Reader::kPipelined, allocate);
  ASSERT_EQ(begun.fetch, ObjectTable::Fetch::kStarted);
  EXPECT_EQ(begun.extent, fresh);
  EXPECT_EQ(begun.record, kRecord);
  ASSERT_TRUE(table_.PinForReload(1, kLen).ok());
  // A second reload finds the running read: it joins that one, and no second read starts; the
  // table holds it until the read ended.
  int woken = 0;
  ObjectTable::FetchBegun joined =
      table_.BeginFetch(*object, ObjectTable::Reader::kPipelined, allocate,
                        [&](const absl::Status& status) {
                          EXPECT_TRUE(status.ok());
                          ++woken;
                        });
  EXPECT_EQ(joined.fetch, ObjectTable::Fetch::kJoined);
  EXPECT_EQ(woken, 0);
  bool spillable = false;
  std::vector<ObjectWaiter> waiters;
  {
    Release release =
        table_.EndFetch(*object, absl::OkStatus(), /*prefetch=*/false, &spillable, &waiters);
    EXPECT_EQ(release.record(), kRecord);
    EXPECT_FALSE(release.extent());
  }
  ASSERT_EQ(waiters.size(), 1u) << "the joined reload is handed over with the read's end";
  waiters[0](absl::OkStatus());
  EXPECT_EQ(woken, 1);
  EXPECT_EQ(home_.records.size(), 1u) << "the record went back once, when the Release went";
  EXPECT_TRUE(spillable);
  EXPECT_EQ(table_.Look(*object).where, Object::Where::kHost);
  EXPECT_EQ(table_.extent(*object), fresh);
  EXPECT_EQ(table_.BeginFetch(*object, ObjectTable::Reader::kPipelined, allocate).fetch,
            ObjectTable::Fetch::kInHost);
}

TEST_F(ObjectTableTest, AFailedReadLeavesTheObjectOnNvme) {
  std::shared_ptr<Object> object = Ready(1);
  Spill(*object);
  ASSERT_TRUE(table_.PinForReload(1, kLen).ok());
  const storage::Extent fresh{65536, 4096};
  ASSERT_EQ(table_
                .BeginFetch(*object, ObjectTable::Reader::kPipelined,
                            [&]() -> std::optional<storage::Extent> { return fresh; })
                .fetch,
            ObjectTable::Fetch::kStarted);
  bool spillable = true;
  // The new extent is in the Release (a reader whose copy may still read it keeps it).
  std::vector<ObjectWaiter> waiters;
  Release release =
      table_.EndFetch(*object, absl::DataLossError("checksum"), false, &spillable, &waiters);
  EXPECT_EQ(release.extent(), fresh);
  EXPECT_FALSE(release.record());
  EXPECT_FALSE(spillable);
  EXPECT_EQ(table_.Look(*object).where, Object::Where::kNvme);
  // The client frees it: its record goes back.
  ASSERT_TRUE(table_.Free(1).ok());
  EXPECT_EQ(table_.Unpin(*object).record(), kRecord);
  EXPECT_EQ(table_.used_bytes(), 0u);
}

TEST_F(ObjectTableTest, APrefetchMarksTheObjectAndAReloadCountsTheHit) {
  std::shared_ptr<Object> object = Ready(1);
  Spill(*object);
  ASSERT_TRUE(table_.PinIfOnNvme(*object));
  const storage::Extent fresh{65536, 4096};
  ASSERT_EQ(table_
                .BeginFetch(*object, ObjectTable::Reader::kPrefetch,
                            [&]() -> std::optional<storage::Extent> { return fresh; })
                .fetch,
            ObjectTable::Fetch::kStarted);
  EXPECT_FALSE(table_.PinIfOnNvme(*object)) << "being read: not on NVMe any more";
  bool spillable = false;
  std::vector<ObjectWaiter> waiters;
  Release release =
      table_.EndFetch(*object, absl::OkStatus(), /*prefetch=*/true, &spillable, &waiters);
  EXPECT_EQ(release.record(), kRecord);
  EXPECT_EQ(table_.Look(*object).pins, 0u) << "the prefetch's pin goes with its read";
  EXPECT_TRUE(table_.Look(*object).prefetched);
  absl::StatusOr<ObjectTable::Pinned> hit = table_.PinForReload(1, kLen);
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit->prefetch, ObjectTable::Prefetch::kHit);
  EXPECT_EQ(table_.PinForReload(1, kLen)->prefetch, ObjectTable::Prefetch::kNone);
}

TEST_F(ObjectTableTest, APrefetchOfAFreedObjectDoesNothing) {
  std::shared_ptr<Object> object = Ready(1);
  Spill(*object);
  ASSERT_TRUE(table_.PinIfOnNvme(*object));
  ASSERT_TRUE(table_.Free(1).ok());
  ObjectTable::FetchBegun begun =
      table_.BeginFetch(*object, ObjectTable::Reader::kPrefetch,
                        [&]() -> std::optional<storage::Extent> {
                          ADD_FAILURE() << "allocated for a freed object";
                          return std::nullopt;
                        });
  EXPECT_EQ(begun.fetch, ObjectTable::Fetch::kGone);
  // The prefetch's pin was the last: the record goes back with it.
  EXPECT_EQ(begun.released.record(), kRecord);
  EXPECT_EQ(table_.Look(*object).pins, 0u);
  EXPECT_FALSE(table_.PinIfOnNvme(*object));
}

TEST_F(ObjectTableTest, APrefetchWithNothingToReadDropsItsPin) {
  std::shared_ptr<Object> object = Ready(1);
  ASSERT_TRUE(table_.PinForReload(1, kLen).ok());  // (the pin a prefetch would hold)
  ObjectTable::FetchBegun begun =
      table_.BeginFetch(*object, ObjectTable::Reader::kPrefetch, nullptr);
  EXPECT_EQ(begun.fetch, ObjectTable::Fetch::kInHost);
  EXPECT_TRUE(begun.released.empty()) << "still in the table: its memory stays";
  EXPECT_EQ(table_.Look(*object).pins, 0u);
  // A reload in the same case keeps its pin: its copy reads the extent.
  ASSERT_TRUE(table_.PinForReload(1, kLen).ok());
  EXPECT_EQ(table_.BeginFetch(*object, ObjectTable::Reader::kPipelined, nullptr).fetch,
            ObjectTable::Fetch::kInHost);
  EXPECT_EQ(table_.Look(*object).pins, 1u);
}

TEST_F(ObjectTableTest, AReleaseGoesBackOnceWhenItGoesOutOfScope) {
  std::shared_ptr<Object> object = Ready(1);
  ASSERT_TRUE(table_.Free(1).ok());  // the extent went back with the free's Release
  ASSERT_EQ(home_.extents.size(), 1u);
  EXPECT_EQ(home_.extents[0], kExtent);
  EXPECT_TRUE(table_.Unpin(*object).empty()) << "nothing more to give back";
  Release moved;
  {
    std::shared_ptr<Object> other = Ready(2);
    Release held = *table_.Free(2);
    EXPECT_EQ(home_.extents.size(), 1u) << "held: not back yet";
    moved = std::move(held);
  }
  EXPECT_EQ(home_.extents.size(), 1u) << "a moved-from Release gives nothing back";
  moved = Release();
  EXPECT_EQ(home_.extents.size(), 2u) << "replaced: the old memory went back, once";
}

}  // namespace
}  // namespace tier::daemon
