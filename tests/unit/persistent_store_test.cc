// PersistentStore alone (daemon/persistent/persistent_store.h): names per uid, reservations, quotas and
// limits per uid and per node, the end of a session, and (with a journal) durability: objects
// written through without being pinned meanwhile, deletes answered once durable. Objects are
// created and filled through their table's transitions, as the job executor would.
#include "daemon/persistent/persistent_store.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "storage/host_pool.h"
#include "gated_io_queue.h"
#include "journal_io.h"

namespace tier::daemon {
namespace {

constexpr uint64_t kQuota = 64 << 10;

PersistentLimits Limits(uint64_t quota = kQuota, uint64_t node = 1 << 20,
                        uint32_t per_uid = 1000, uint32_t all = 10000) {
  return PersistentLimits{quota, node, per_uid, all};
}

class PersistentStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    storage::HostPoolOptions options;
    options.bytes = 4 << 20;
    options.lock = storage::LockMode::kOff;
    auto pool = storage::HostPool::Create(options);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    tiers_ = std::make_unique<TierManager>(*pool_, nullptr, SpillerOptions{});
    tiers_->Start();
    store_ = std::make_unique<PersistentStore>(*tiers_, Limits());
  }
  void TearDown() override {
    store_.reset();
    journal_.reset();
    io_.reset();
    if (!dir_.empty()) (void)!std::system(("rm -rf '" + dir_ + "'").c_str());
  }
  // A store that writes through to a journal in a fresh directory.
  void UseJournal(PersistentLimits limits = Limits()) {
    char pattern[] = "/tmp/tier-store-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    store_.reset();
    if (io_ == nullptr) io_ = testing::MakeJournalIo(dir_, wrap_io_);
    ASSERT_NE(io_, nullptr);
    auto journal = PersistentJournal::Open(dir_ + "/persistent", *io_);
    ASSERT_TRUE(journal.ok()) << journal.status();
    journal_ = *std::move(journal);
    store_ = std::make_unique<PersistentStore>(*tiers_, limits, journal_.get());
  }

  // UseJournal, the journal's I/O through a GatedIoQueue (returned).
  testing::GatedIoQueue* UseGatedJournal(PersistentLimits limits = Limits()) {
    testing::GatedIoQueue* gate = nullptr;
    wrap_io_ = [&gate](std::unique_ptr<storage::IoQueue> inner) {
      // File 0 is the store's spill file; the journal's files are attached after it.
      auto gated = std::make_unique<testing::GatedIoQueue>(std::move(inner), 1);
      gate = gated.get();
      return std::unique_ptr<storage::IoQueue>(std::move(gated));
    };
    UseJournal(limits);
    wrap_io_ = nullptr;  // (it points at this frame's `gate`)
    return gate;
  }

  // What an offload into the slot does: create the object, admit it, fill it, tell the store.
  std::shared_ptr<Object> Fill(const ObjectSlot& slot, uint64_t len, char byte = 0x11) {
    auto object = slot.table->Create(slot.id, len, 0, 1, tiers_->Charge(len));
    EXPECT_TRUE(object.ok()) << object.status();
    if (!object.ok()) return nullptr;
    std::optional<storage::Extent> extent = pool_->Allocate(tiers_->Charge(len));
    EXPECT_TRUE(extent.has_value());
    EXPECT_TRUE(slot.table->Admit(**object, *extent, tiers_->home()).ok());
    std::memset(pool_->At(*extent), byte, len);
    std::vector<ObjectWaiter> waiters;
    slot.table->EndFill(**object, absl::OkStatus(), &waiters);
    store_->Filled(slot.table, *object);
    return *object;
  }
  // Until the store says `name` of `uid` is durable (or 10 s).
  bool AwaitDurable(uid_t uid, const std::string& name) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      absl::StatusOr<PersistentObjectState> state = store_->Stat(uid, name);
      if (state.ok() && state->durable) return true;
      std::this_thread::yield();
    }
    return false;
  }

  std::unique_ptr<storage::HostPool> pool_;
  std::unique_ptr<TierManager> tiers_;
  std::string dir_;
  // What the journal writes through (wrapped by wrap_io_ when set before UseJournal).
  std::function<std::unique_ptr<storage::IoQueue>(std::unique_ptr<storage::IoQueue>)> wrap_io_;
  std::unique_ptr<storage::SpillStore> io_;
  std::unique_ptr<PersistentJournal> journal_;
  std::unique_ptr<PersistentStore> store_;
};

TEST_F(PersistentStoreTest, CreatedObjectIsFoundByItsOwnerOnly) {
  auto slot = store_->Create(1000, "w0", /*session=*/7, 8192);
  ASSERT_TRUE(slot.ok()) << slot.status();
  uint64_t len = 0;
  // Reserved, not filled yet: not there.
  EXPECT_TRUE(absl::IsNotFound(store_->Open(1000, "w0", &len).status()));
  EXPECT_TRUE(store_->List().empty());
  Fill(*slot, 8192);

  auto opened = store_->Open(1000, "w0", &len);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(len, 8192u);
  EXPECT_EQ(opened->table, slot->table);
  EXPECT_EQ(opened->id, slot->id);
  std::vector<PersistentObjectInfo> list = store_->List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].uid, 1000u);
  EXPECT_EQ(list[0].name, "w0");
  EXPECT_EQ(list[0].bytes, 8192u);
  EXPECT_EQ(list[0].tier, "host");

  // Another uid: not found, in the words a missing name gets.
  absl::Status foreign = store_->Open(1001, "w0", &len).status();
  absl::Status missing = store_->Open(1000, "w1", &len).status();
  EXPECT_TRUE(absl::IsNotFound(foreign)) << foreign;
  EXPECT_EQ(foreign.message(), "no persistent object named \"w0\"");
  EXPECT_EQ(missing.message(), "no persistent object named \"w1\"");
  EXPECT_TRUE(absl::IsNotFound(store_->DeleteAndWait(1001, "w0")));
  // The other uid's namespace is its own.
  EXPECT_TRUE(store_->Create(1001, "w0", 8, 4096).ok());

  // The session ends; the object stays. Deleting returns its quota.
  store_->SessionEnded(7);
  EXPECT_TRUE(store_->Open(1000, "w0", &len).ok());
  EXPECT_EQ(slot->table->used_bytes(), 8192u);
  EXPECT_TRUE(store_->DeleteAndWait(1000, "w0").ok());
  EXPECT_EQ(slot->table->used_bytes(), 0u);
  EXPECT_TRUE(absl::IsNotFound(store_->Open(1000, "w0", &len).status()));
  EXPECT_TRUE(absl::IsNotFound(store_->DeleteAndWait(1000, "w0")));
}

TEST_F(PersistentStoreTest, NamesAreUniqueWhileTakenOrReserved) {
  auto slot = store_->Create(5, "n", 1, 4096);
  ASSERT_TRUE(slot.ok());
  // Another session may not take a name a live session is filling.
  EXPECT_TRUE(absl::IsAlreadyExists(store_->Create(5, "n", 2, 4096).status()));
  Fill(*slot, 4096);
  EXPECT_TRUE(absl::IsAlreadyExists(store_->Create(5, "n", 1, 4096).status()));
  EXPECT_TRUE(absl::IsAlreadyExists(store_->Create(5, "n", 2, 4096).status()));

  // A reservation never filled goes with its session.
  ASSERT_TRUE(store_->Create(5, "unfilled", 3, 4096).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(store_->Create(5, "unfilled", 4, 4096).status()));
  store_->SessionEnded(3);
  EXPECT_TRUE(store_->Create(5, "unfilled", 4, 4096).ok());
}

TEST_F(PersistentStoreTest, QuotaIsCheckedAtCreateAndByTheTable) {
  auto first = store_->Create(9, "a", 1, 48 << 10);
  ASSERT_TRUE(first.ok());
  Fill(*first, 48 << 10);
  absl::Status over = store_->Create(9, "b", 1, 32 << 10).status();
  EXPECT_TRUE(absl::IsResourceExhausted(over)) << over;
  EXPECT_NE(over.message().find("persistent_quota_bytes_per_uid"), std::string::npos) << over;
  // Too large for the quota even when empty.
  EXPECT_TRUE(absl::IsResourceExhausted(store_->Create(10, "big", 1, kQuota + 1).status()));
  // The table enforces it too (a create raced past the first check).
  auto raced = store_->Create(9, "c", 1, 8 << 10);
  ASSERT_TRUE(raced.ok());
  absl::Status table = raced->table->Create(raced->id, 32 << 10, 0, 1, 32 << 10).status();
  EXPECT_TRUE(absl::IsResourceExhausted(table)) << table;
  EXPECT_NE(table.message().find("persistent_quota_bytes_per_uid"), std::string::npos) << table;
}

// Finding 18: a length near 2^64 must not wrap the quota check into a reservation.
TEST_F(PersistentStoreTest, AHugeLengthIsRefusedNotWrapped) {
  for (uint64_t len : {std::numeric_limits<uint64_t>::max(),
                       std::numeric_limits<uint64_t>::max() - 100,
                       std::numeric_limits<uint64_t>::max() - 4095}) {
    absl::Status huge = store_->Create(9, "huge", 1, len).status();
    EXPECT_TRUE(absl::IsResourceExhausted(huge)) << len << ": " << huge;
  }
}

// Finding 2 / N5: the persistent objects of every uid together are bounded, whatever each uid's
// own quota leaves.
TEST_F(PersistentStoreTest, TheNodeCapBoundsEveryUidTogether) {
  store_ = std::make_unique<PersistentStore>(*tiers_, Limits(64 << 10, 96 << 10));
  auto a = store_->Create(1, "a", 1, 60 << 10);
  ASSERT_TRUE(a.ok());
  Fill(*a, 60 << 10);
  absl::Status b = store_->Create(2, "b", 2, 60 << 10).status();
  EXPECT_TRUE(absl::IsResourceExhausted(b)) << b;
  EXPECT_NE(b.message().find("persistent_max_bytes"), std::string::npos) << b;
  // The tables check it too: an offload into a reservation made while there was room.
  auto c = store_->Create(2, "c", 2, 32 << 10);
  ASSERT_TRUE(c.ok());
  absl::Status table = c->table->Create(c->id, 40 << 10, 0, 1, 40 << 10).status();
  EXPECT_TRUE(absl::IsResourceExhausted(table)) << table;
  EXPECT_NE(table.message().find("persistent_max_bytes"), std::string::npos) << table;
  EXPECT_EQ(store_->usage().bytes, 60u << 10);
  EXPECT_TRUE(store_->DeleteAndWait(1, "a").ok());
  EXPECT_EQ(store_->usage().bytes, 0u);
  EXPECT_TRUE(store_->Create(2, "b", 2, 60 << 10).ok());
}

// N5 / finding 4: names (reservations included) are bounded per uid and per node.
TEST_F(PersistentStoreTest, NamesAreBoundedPerUidAndPerNode) {
  store_ = std::make_unique<PersistentStore>(*tiers_, Limits(1 << 30, 1 << 30, 3, 5));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store_->Create(1, absl::StrCat("n", i), 1, 1).ok());
  absl::Status more = store_->Create(1, "n3", 1, 1).status();
  EXPECT_TRUE(absl::IsResourceExhausted(more)) << more;
  EXPECT_NE(more.message().find("persistent_max_objects_per_uid"), std::string::npos) << more;
  // Re-reserving one of its own names takes no new one.
  EXPECT_TRUE(store_->Create(1, "n0", 1, 1).ok());
  ASSERT_TRUE(store_->Create(2, "m0", 2, 1).ok());
  ASSERT_TRUE(store_->Create(2, "m1", 2, 1).ok());
  absl::Status node = store_->Create(3, "k", 3, 1).status();
  EXPECT_TRUE(absl::IsResourceExhausted(node)) << node;
  EXPECT_NE(node.message().find("persistent_max_objects"), std::string::npos) << node;
  store_->SessionEnded(1);
  EXPECT_EQ(store_->usage().objects, 2u);
  EXPECT_TRUE(store_->Create(3, "k", 3, 1).ok());
}

// Finding 4: a create followed by a release (no offload) used to keep the name reserved until
// the session ended: 300k of them from one session.
TEST_F(PersistentStoreTest, AReleasedReservationGoesAtOnce) {
  for (int i = 0; i < 5000; ++i) {
    auto slot = store_->Create(4, absl::StrCat("r", i), 1, 4096);
    ASSERT_TRUE(slot.ok()) << i << ": " << slot.status();
    store_->Released(1, *slot);
  }
  EXPECT_EQ(store_->usage().objects, 0u);
  // One whose offload landed stays when its id is given back.
  auto kept = store_->Create(4, "kept", 1, 4096);
  ASSERT_TRUE(kept.ok());
  Fill(*kept, 4096);
  store_->Released(1, *kept);
  uint64_t len = 0;
  EXPECT_TRUE(store_->Open(4, "kept", &len).ok());
  EXPECT_EQ(store_->usage().objects, 1u);
}

TEST_F(PersistentStoreTest, AnObjectNoNameReachesIsFreed) {
  // One session reserves a name twice and fills both ids: only the second stays named, and the
  // first goes as soon as it is filled (it would hold quota for ever).
  auto one = store_->Create(3, "twice", 1, 4096);
  ASSERT_TRUE(one.ok());
  auto two = store_->Create(3, "twice", 1, 4096);
  ASSERT_TRUE(two.ok());
  Fill(*one, 4096);
  Fill(*two, 4096);
  EXPECT_EQ(one->table->size(), 1u);
  uint64_t len = 0;
  auto opened = store_->Open(3, "twice", &len);
  ASSERT_TRUE(opened.ok());
  EXPECT_EQ(opened->id, two->id);
  // An orphan still filling when its session ends goes then.
  auto three = store_->Create(3, "thrice", 2, 4096);
  ASSERT_TRUE(three.ok());
  ASSERT_TRUE(store_->Create(3, "thrice", 2, 4096).ok());
  ASSERT_TRUE(three->table->Create(three->id, 4096, 0, 1, 4096).ok());
  EXPECT_EQ(one->table->size(), 2u);
  store_->SessionEnded(2);
  EXPECT_EQ(one->table->size(), 1u);
}

TEST_F(PersistentStoreTest, NamesAreChecked) {
  EXPECT_TRUE(PersistentStore::CheckName("ckpt/step-100/layer.0").ok());
  EXPECT_TRUE(absl::IsInvalidArgument(PersistentStore::CheckName("")));
  EXPECT_TRUE(absl::IsInvalidArgument(PersistentStore::CheckName("a b")));
  EXPECT_TRUE(absl::IsInvalidArgument(PersistentStore::CheckName("tab\there")));
  EXPECT_TRUE(absl::IsInvalidArgument(PersistentStore::CheckName("\xc3\xa9")));
  EXPECT_TRUE(absl::IsInvalidArgument(PersistentStore::CheckName(std::string(128, 'x'))));
  EXPECT_TRUE(PersistentStore::CheckName(std::string(127, 'x')).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Create(1, "a b", 1, 4096).status()));
  uint64_t len = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Open(1, "", &len).status()));
}

TEST_F(PersistentStoreTest, DropAllAtShutdownEmptiesEveryNamespace) {
  auto a = store_->Create(1, "a", 1, 4096);
  auto b = store_->Create(2, "b", 2, 4096);
  ASSERT_TRUE(a.ok() && b.ok());
  Fill(*a, 4096);
  Fill(*b, 4096);
  EXPECT_EQ(store_->size(), 2u);
  store_->DropAll();
  EXPECT_EQ(store_->size(), 0u);
  EXPECT_TRUE(store_->List().empty());
  EXPECT_EQ(pool_->Usage().used_bytes, 0u);
}

// Finding 5: a store operation costs the same whatever another uid (or the same uid) holds: no
// scan of names under the store's lock, which every completion, free and session end takes.
TEST_F(PersistentStoreTest, OperationsDoNotScanNames) {
  store_ = std::make_unique<PersistentStore>(*tiers_, Limits(1ull << 40, 1ull << 40, 1 << 20,
                                                             1 << 20));
  constexpr int kMany = 200000;
  for (int i = 0; i < kMany; ++i) {
    ASSERT_TRUE(store_->Create(1, absl::StrCat("many/", i), /*session=*/1000 + (i % 4), 1).ok());
  }
  // The few operations another session and uid do, each timed with the other's names present.
  auto start = std::chrono::steady_clock::now();
  constexpr int kOps = 500;
  for (int i = 0; i < kOps; ++i) {
    auto slot = store_->Create(2, absl::StrCat("few/", i), /*session=*/7, 4096);
    ASSERT_TRUE(slot.ok()) << slot.status();
    std::shared_ptr<Object> object = Fill(*slot, 4096);    // Filled
    ASSERT_TRUE(store_->Forget(slot->table, slot->id, [] {}) == false);  // a job's free
    (void)slot->table->Free(slot->id);
    store_->SessionEnded(8 + i);                            // a session with nothing reserved
  }
  // And uid 1's own: a fill and a free of one of its 200k names.
  for (int i = 0; i < kOps; ++i) {
    auto slot = store_->Create(1, absl::StrCat("many/", i), 1000 + (i % 4), 4096);
    ASSERT_TRUE(slot.ok()) << slot.status();
    Fill(*slot, 4096);
    ASSERT_FALSE(store_->Forget(slot->table, slot->id, [] {}));
    (void)slot->table->Free(slot->id);
  }
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start).count();
  // A scan of 200k names per operation takes milliseconds each (seconds in all); a lookup, micro.
  std::printf("[ figures ] finding 5: %.1f us per round (create, fill, free, session end) beside "
              "200k names\n", 1000 * ms / (2 * kOps));
  EXPECT_LT(ms / (2 * kOps), 0.5) << ms << " ms for " << 2 * kOps << " rounds";
}

// ---- with a journal ---------------------------------------------------------------------------

TEST_F(PersistentStoreTest, FilledObjectsBecomeDurableAndAreNotPinnedWhileQueued) {
  UseJournal();
  auto slot = store_->Create(1, "d", 1, 8192);
  ASSERT_TRUE(slot.ok());
  std::shared_ptr<Object> object = Fill(*slot, 8192, 0x5c);
  ASSERT_TRUE(AwaitDurable(1, "d"));
  // Written, and pinned by nothing now: it may be spilled like any object.
  EXPECT_EQ(slot->table->Look(*object).pins, 0u);
  std::optional<PersistentJournal::Record> record = journal_->Find(1, "d");
  ASSERT_TRUE(record.has_value());
  std::vector<char> bytes(record->len);
  ASSERT_TRUE(journal_->Load(*record, bytes.data()).ok());
  EXPECT_EQ(bytes, std::vector<char>(8192, 0x5c));
}

// An object is reported durable only once its record's writes completed and, after them, the
// flush did: while the device holds its write back, it is not durable and no flush was asked for
// (one asked for then would not cover the write: io_uring does not order requests); while the
// flush is held back, it is not durable either.
TEST_F(PersistentStoreTest, NotDurableBeforeItsWriteAndFlushCompleted) {
  testing::GatedIoQueue* gate = UseGatedJournal();
  ASSERT_NE(gate, nullptr);
  EXPECT_TRUE(journal_->direct_io());  // /tmp: a real filesystem here, not tmpfs
  const size_t opened = gate->log().size();  // the new generation's header, written and synced
  gate->Close();
  auto slot = store_->Create(1, "held", 1, 64 << 10);
  ASSERT_TRUE(slot.ok());
  Fill(*slot, 64 << 10, 0x3d);
  // Held for a while (once it came): in all that time nothing may call it durable.
  auto not_durable_while_held = [&](const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (gate->held() == 0) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << what << " never came";
      std::this_thread::yield();
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    while (std::chrono::steady_clock::now() < until) {
      ASSERT_FALSE(store_->Stat(1, "held")->durable) << "durable while its " << what << " is held";
      std::this_thread::yield();
    }
  };
  not_durable_while_held("write");
  std::vector<std::string> log = gate->log();
  EXPECT_EQ(std::count(log.begin() + opened, log.end(), "sync"), 0) << "flush before the write";
  gate->OpenWrites();
  not_durable_while_held("flush");
  gate->Open();
  ASSERT_TRUE(AwaitDurable(1, "held"));
  // In order: every write of the record completed, then the flush was asked for and completed.
  log = gate->log();
  std::vector<std::string> after(log.begin() + opened, log.end());
  std::vector<std::string> want(std::count(after.begin(), after.end(), "write"), "write");
  want.insert(want.end(), want.size(), "written");
  want.insert(want.end(), {"sync", "synced"});
  std::vector<std::string> got = after;
  std::stable_partition(got.begin(), got.end(), [](const std::string& e) { return e == "write"; });
  EXPECT_EQ(got, want);
  EXPECT_EQ(after.end()[-2], "sync");
  std::optional<PersistentJournal::Record> record = journal_->Find(1, "held");
  ASSERT_TRUE(record.has_value());
  std::vector<char> bytes(record->len);
  ASSERT_TRUE(journal_->Load(*record, bytes.data()).ok());
  EXPECT_EQ(bytes, std::vector<char>(64 << 10, 0x3d));
}

// Small objects in host memory go to the journal in groups (one wait for the device per group,
// not per object): far fewer writes than objects, and every one durable and bit-identical.
TEST_F(PersistentStoreTest, SmallObjectsAreAppendedInGroups) {
  testing::GatedIoQueue* gate = UseGatedJournal(Limits(1 << 20, 1 << 20));
  ASSERT_NE(gate, nullptr);
  const size_t opened = gate->log().size();
  constexpr int kObjects = 40;
  // Held back until all are queued, so that they meet in one batch.
  gate->Close();
  for (int i = 0; i < kObjects; ++i) {
    auto slot = store_->Create(1, absl::StrCat("small/", i), 1, 8192);
    ASSERT_TRUE(slot.ok()) << slot.status();
    Fill(*slot, 8192, static_cast<char>(i));
  }
  gate->Open();
  for (int i = 0; i < kObjects; ++i) ASSERT_TRUE(AwaitDurable(1, absl::StrCat("small/", i)));
  std::vector<std::string> log = gate->log();
  const auto writes = std::count(log.begin() + opened, log.end(), "write");
  EXPECT_LT(writes, kObjects / 4) << "one write per object: not grouped";
  for (int i = 0; i < kObjects; ++i) {
    std::optional<PersistentJournal::Record> record = journal_->Find(1, absl::StrCat("small/", i));
    ASSERT_TRUE(record.has_value());
    std::vector<char> bytes(record->len);
    ASSERT_TRUE(journal_->Load(*record, bytes.data()).ok());
    EXPECT_EQ(bytes, std::vector<char>(8192, static_cast<char>(i)));
  }
}

TEST_F(PersistentStoreTest, ADeleteIsAnsweredOnceItsRecordIsGone) {
  UseJournal();
  auto slot = store_->Create(1, "x", 1, 4096);
  ASSERT_TRUE(slot.ok());
  Fill(*slot, 4096);
  ASSERT_TRUE(AwaitDurable(1, "x"));
  // Its record is in the journal: the answer comes from the writer, after the delete is synced.
  Mutex mu;
  std::optional<absl::Status> answer;
  std::optional<absl::Status> now = store_->Delete(1, "x", [&](absl::Status s) {
    MutexLock lock(&mu);
    answer = s;
  });
  EXPECT_FALSE(now.has_value());
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    {
      MutexLock lock(&mu);
      if (answer.has_value()) break;
    }
    ASSERT_LT(std::chrono::steady_clock::now(), deadline);
    std::this_thread::yield();
  }
  EXPECT_TRUE(answer->ok()) << *answer;
  EXPECT_FALSE(journal_->Find(1, "x").has_value());
  // A missing name is answered at once.
  std::optional<absl::Status> missing = store_->Delete(1, "x", [](absl::Status) {});
  ASSERT_TRUE(missing.has_value());
  EXPECT_TRUE(absl::IsNotFound(*missing));
  // A reservation never written needs no record: answered at once.
  auto fresh = store_->Create(1, "fresh", 1, 4096);
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE(absl::IsNotFound(*store_->Delete(1, "fresh", [](absl::Status) {})));
}

TEST_F(PersistentStoreTest, RestoreBringsBackWhatTheJournalHolds) {
  UseJournal();
  for (int i = 0; i < 3; ++i) {
    auto slot = store_->Create(100 + i, "obj", 1, 8192);
    ASSERT_TRUE(slot.ok());
    Fill(*slot, 8192, static_cast<char>(0x20 + i));
    ASSERT_TRUE(AwaitDurable(100 + i, "obj"));
  }
  ASSERT_TRUE(store_->DeleteAndWait(101, "obj").ok());
  store_.reset();
  journal_.reset();
  auto journal = PersistentJournal::Open(dir_ + "/persistent", *io_);
  ASSERT_TRUE(journal.ok());
  journal_ = *std::move(journal);
  store_ = std::make_unique<PersistentStore>(*tiers_, Limits(), journal_.get());
  EXPECT_EQ(store_->Restore(), 2u);
  uint64_t len = 0;
  EXPECT_TRUE(store_->Open(100, "obj", &len).ok());
  EXPECT_TRUE(absl::IsNotFound(store_->Open(101, "obj", &len).status()));
  auto slot = store_->Open(102, "obj", &len);
  ASSERT_TRUE(slot.ok());
  std::shared_ptr<Object> object = slot->table->Find(slot->id);
  ASSERT_NE(object, nullptr);
  EXPECT_EQ(pool_->At(slot->table->extent(*object))[100], 0x22);
  EXPECT_TRUE(store_->Stat(102, "obj")->durable);
  // Restored objects count against the quotas like any.
  EXPECT_EQ(store_->usage().bytes, 2u * 8192);
}

}  // namespace
}  // namespace tier::daemon
