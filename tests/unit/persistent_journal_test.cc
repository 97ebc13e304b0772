// PersistentJournal (daemon/persistent/persistent_journal.h): persistent objects on NVMe across restarts, as
// one append-only file compacted now and then. Written, reopened, and damaged on disk the ways a
// crash or a bad device would: nothing damaged is ever handed out as good data, nothing deleted
// comes back, and nothing a crash leaves behind stays.
#include "daemon/persistent/persistent_journal.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "storage/crc32c.h"
#include "storage/faulty_io_queue.h"
#include "journal_io.h"

namespace tier::daemon {
namespace {

class PersistentJournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/tier-journal-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = std::string(pattern) + "/persistent";
    io_ = testing::MakeJournalIo(pattern);
    ASSERT_NE(io_, nullptr);
  }
  void TearDown() override {
    io_.reset();
    std::string cmd = "rm -rf '" + dir_.substr(0, dir_.rfind('/')) + "'";
    (void)!std::system(cmd.c_str());
  }
  std::unique_ptr<PersistentJournal> Open(JournalOptions options = {}) {
    auto journal = PersistentJournal::Open(dir_, *io_, options);
    EXPECT_TRUE(journal.ok()) << journal.status();
    return journal.ok() ? *std::move(journal) : nullptr;
  }
  // The journal files in the directory (journal-N, and .damaged/.new ones).
  std::vector<std::string> Files() const {
    std::vector<std::string> out;
    for (const char* suffix : {"", ".damaged", ".new"}) {
      for (int g = 1; g < 20; ++g) {
        std::string name = absl::StrCat("journal-", g, suffix);
        if (::access((dir_ + "/" + name).c_str(), F_OK) == 0) out.push_back(name);
      }
    }
    return out;
  }
  std::string Current() const {
    for (int g = 19; g >= 1; --g) {
      std::string path = absl::StrCat(dir_, "/journal-", g);
      if (::access(path.c_str(), F_OK) == 0) return path;
    }
    return "";
  }
  static uint64_t SizeOf(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  }
  // Flips one byte of `path` at `offset`.
  static void Flip(const std::string& path, uint64_t offset) {
    int fd = ::open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char c;
    ASSERT_EQ(::pread(fd, &c, 1, static_cast<off_t>(offset)), 1);
    c ^= 0x40;
    ASSERT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(offset)), 1);
    ::close(fd);
  }

  // The journal's writes through a store whose queue injects faults (rules: the returned queue).
  storage::FaultyIoQueue* UseFaultyIo() {
    io_.reset();
    storage::FaultyIoQueue* faulty = nullptr;
    io_ = testing::MakeJournalIo(dir_.substr(0, dir_.rfind('/')),
                                 [&faulty](std::unique_ptr<storage::IoQueue> inner) {
                                   auto q = std::make_unique<storage::FaultyIoQueue>(std::move(inner));
                                   faulty = q.get();
                                   return std::unique_ptr<storage::IoQueue>(std::move(q));
                                 });
    return faulty;
  }

  std::string dir_;
  std::unique_ptr<storage::SpillStore> io_;  // what the journal writes through
};

std::vector<char> Bytes(size_t n, char seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>(seed + i * 7);
  return v;
}

std::vector<char> LoadOf(const PersistentJournal& journal, uid_t uid, const std::string& name,
                         absl::Status* status) {
  std::optional<PersistentJournal::Record> record = journal.Find(uid, name);
  if (!record) {
    *status = absl::NotFoundError(name);
    return {};
  }
  std::vector<char> out(record->len);
  *status = journal.Load(*record, out.data());
  return out;
}

TEST_F(PersistentJournalTest, RecordsSurviveReopenBitIdenticalInWriteOrder) {
  std::vector<char> a = Bytes(10000, 1), b = Bytes(4096, 2), c = Bytes(1, 3);
  {
    auto journal = Open();
    EXPECT_TRUE(journal->open_status().ok());
    ASSERT_TRUE(journal->AppendPut(1000, "ckpt/a", a.data(), a.size()).ok());
    ASSERT_TRUE(journal->AppendPut(0, "b", b.data(), b.size()).ok());
    ASSERT_TRUE(journal->AppendPut(1000, "gone", b.data(), b.size()).ok());
    ASSERT_TRUE(journal->AppendDelete(1000, "gone").ok());
    ASSERT_TRUE(journal->AppendPut(7, "b", c.data(), c.size()).ok());  // another uid's "b"
    ASSERT_TRUE(journal->AppendDelete(7, "never-there").ok());         // (nothing written)
    ASSERT_TRUE(journal->Sync().ok());
  }
  auto journal = Open();
  ASSERT_TRUE(journal->open_status().ok()) << journal->open_status();
  std::vector<PersistentJournal::Record> records = journal->Records();
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].name, "ckpt/a");
  EXPECT_EQ(records[0].uid, 1000u);
  EXPECT_EQ(records[1].name, "b");
  EXPECT_EQ(records[1].uid, 0u);
  EXPECT_EQ(records[2].uid, 7u);
  absl::Status status;
  EXPECT_EQ(LoadOf(*journal, 1000, "ckpt/a", &status), a);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(LoadOf(*journal, 0, "b", &status), b);
  EXPECT_EQ(LoadOf(*journal, 7, "b", &status), c);
  EXPECT_FALSE(journal->Find(1000, "gone").has_value());
}

TEST_F(PersistentJournalTest, APutReplacesAndADeleteEndsAcrossReopen) {
  std::vector<char> a = Bytes(5000, 4), b = Bytes(6000, 5);
  {
    auto journal = Open();
    ASSERT_TRUE(journal->AppendPut(1, "x", a.data(), a.size()).ok());
    ASSERT_TRUE(journal->AppendPut(1, "x", b.data(), b.size()).ok());
    ASSERT_TRUE(journal->AppendPut(1, "y", a.data(), a.size()).ok());
    ASSERT_TRUE(journal->AppendDelete(1, "y").ok());
    ASSERT_TRUE(journal->AppendPut(1, "y", b.data(), b.size()).ok());
    ASSERT_TRUE(journal->AppendDelete(1, "y").ok());
    ASSERT_TRUE(journal->Sync().ok());
  }
  auto journal = Open();
  ASSERT_EQ(journal->Records().size(), 1u);
  absl::Status status;
  EXPECT_EQ(LoadOf(*journal, 1, "x", &status), b);
  EXPECT_FALSE(journal->Find(1, "y").has_value());
}

TEST_F(PersistentJournalTest, DamagedDataIsDataLossNeverData) {
  std::vector<char> a = Bytes(8192, 3), b = Bytes(4096, 4);
  uint64_t data_offset = 0;
  {
    auto journal = Open();
    ASSERT_TRUE(journal->AppendPut(1, "a", a.data(), a.size()).ok());
    ASSERT_TRUE(journal->AppendPut(1, "b", b.data(), b.size()).ok());
    ASSERT_TRUE(journal->Sync().ok());
    data_offset = journal->Find(1, "a")->data_offset();
  }
  Flip(Current(), data_offset + 100);
  auto journal = Open();
  // The header checks out: the record is there, its data is not served, the next one is.
  ASSERT_TRUE(journal->open_status().ok()) << journal->open_status();
  absl::Status status;
  LoadOf(*journal, 1, "a", &status);
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_NE(status.message().find("checksum"), std::string::npos) << status;
  EXPECT_EQ(LoadOf(*journal, 1, "b", &status), b);
  EXPECT_TRUE(status.ok()) << status;
}

TEST_F(PersistentJournalTest, ATornTailIsCutOffAndWhatPrecedesItServed) {
  std::vector<char> a = Bytes(4096, 5), b = Bytes(100000, 6);
  uint64_t end_of_a = 0;
  {
    auto journal = Open();
    ASSERT_TRUE(journal->AppendPut(1, "a", a.data(), a.size()).ok());
    end_of_a = journal->Find(1, "a")->data_offset() + a.size();
    ASSERT_TRUE(journal->AppendPut(1, "b", b.data(), b.size()).ok());
    ASSERT_TRUE(journal->Sync().ok());
  }
  // A crash while "b" was appended: half of it reached the disk.
  const std::string path = Current();
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(end_of_a + 50000)), 0);
  {
    auto journal = Open();
    EXPECT_TRUE(journal->open_status().ok()) << journal->open_status();
    ASSERT_EQ(journal->Records().size(), 1u);
    EXPECT_EQ(journal->Records()[0].name, "a");
    EXPECT_FALSE(journal->open_notes().empty());
    EXPECT_EQ(SizeOf(path), end_of_a);  // cut where "a" ends
    // Appends go on after "a".
    ASSERT_TRUE(journal->AppendPut(1, "c", a.data(), a.size()).ok());
    ASSERT_TRUE(journal->Sync().ok());
  }
  auto journal = Open();
  EXPECT_EQ(journal->Records().size(), 2u);
  absl::Status status;
  EXPECT_EQ(LoadOf(*journal, 1, "c", &status), a);
}

TEST_F(PersistentJournalTest, DamageInTheMiddleServesWhatPrecedesAndKeepsTheFileAside) {
  std::vector<char> a = Bytes(4096, 7);
  uint64_t head_of_b = 0;
  {
    auto journal = Open();
    ASSERT_TRUE(journal->AppendPut(1, "a", a.data(), a.size()).ok());
    ASSERT_TRUE(journal->AppendPut(1, "b", a.data(), a.size()).ok());
    head_of_b = journal->Find(1, "b")->offset;
    ASSERT_TRUE(journal->AppendPut(1, "c", a.data(), a.size()).ok());
    ASSERT_TRUE(journal->AppendDelete(1, "a").ok());
    ASSERT_TRUE(journal->Sync().ok());
  }
  const std::string damaged = Current();
  Flip(damaged, head_of_b + 10);  // in b's header: its lengths can no longer be trusted
  auto journal = Open();
  // What follows the damage is not served: a delete in it (of "a" here) could be lost.
  EXPECT_TRUE(absl::IsDataLoss(journal->open_status())) << journal->open_status();
  ASSERT_EQ(journal->Records().size(), 1u);
  EXPECT_EQ(journal->Records()[0].name, "a");
  EXPECT_EQ(::access((damaged + ".damaged").c_str(), F_OK), 0);
  EXPECT_NE(Current(), damaged);  // its live records moved to a new generation
  absl::Status status;
  EXPECT_EQ(LoadOf(*journal, 1, "a", &status), a);
}

TEST_F(PersistentJournalTest, ADamagedFileHeaderIsSetAsideAndNothingOfItServed) {
  std::vector<char> a = Bytes(4096, 8);
  {
    auto journal = Open();
    ASSERT_TRUE(journal->AppendPut(1, "a", a.data(), a.size()).ok());
    ASSERT_TRUE(journal->Sync().ok());
  }
  const std::string path = Current();
  Flip(path, 3);
  {
    auto journal = Open();
    EXPECT_TRUE(absl::IsDataLoss(journal->open_status())) << journal->open_status();
    EXPECT_TRUE(journal->Records().empty());
    EXPECT_EQ(::access((path + ".damaged").c_str(), F_OK), 0);
    // New objects are kept again, in a new generation.
    ASSERT_TRUE(journal->AppendPut(1, "b", a.data(), a.size()).ok());
    ASSERT_TRUE(journal->Sync().ok());
  }
  auto journal = Open();
  EXPECT_TRUE(journal->open_status().ok()) << journal->open_status();
  ASSERT_EQ(journal->Records().size(), 1u);
  EXPECT_EQ(journal->Records()[0].name, "b");
}

// Finding 15: a damaged journal must not make new objects take the file names of data on disk.
TEST_F(PersistentJournalTest, GenerationsNeverReuseTheNameOfAFileOnDisk) {
  ASSERT_EQ(::mkdir(dir_.c_str(), 0700), 0);
  std::ofstream(dir_ + "/journal-7.damaged") << "kept for a person";
  auto journal = Open();
  EXPECT_EQ(Current(), dir_ + "/journal-8");
  std::ifstream kept(dir_ + "/journal-7.damaged");
  std::string text;
  std::getline(kept, text);
  EXPECT_EQ(text, "kept for a person");
}

TEST_F(PersistentJournalTest, CompactionKeepsTheLiveRecordsAndDropsTheDead) {
  std::vector<char> big = Bytes(1 << 20, 9), small = Bytes(4096, 10);
  JournalOptions options;
  options.compact_min_dead_bytes = 1 << 20;
  std::string before;
  {
    auto journal = Open(options);
    ASSERT_TRUE(journal->AppendPut(1, "keep", small.data(), small.size()).ok());
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(journal->AppendPut(2, "churn", big.data(), big.size()).ok());
      ASSERT_TRUE(journal->AppendDelete(2, "churn").ok());
    }
    ASSERT_TRUE(journal->Sync().ok());
    before = Current();
    EXPECT_GT(journal->usage().file_bytes, 4u << 20);
    ASSERT_TRUE(journal->CompactIfDue().ok());
    EXPECT_EQ(journal->usage().compactions, 1u);
    EXPECT_LT(journal->usage().file_bytes, 8192u + 512);
    EXPECT_NE(Current(), before);
    EXPECT_EQ(::access(before.c_str(), F_OK), -1);  // the old generation is gone
    // Appends go to the new file; loads read it.
    ASSERT_TRUE(journal->AppendPut(3, "after", small.data(), small.size()).ok());
    ASSERT_TRUE(journal->Sync().ok());
    absl::Status status;
    EXPECT_EQ(LoadOf(*journal, 1, "keep", &status), small);
    EXPECT_TRUE(status.ok()) << status;
    // Not due again: few dead bytes.
    ASSERT_TRUE(journal->CompactIfDue().ok());
    EXPECT_EQ(journal->usage().compactions, 1u);
  }
  auto journal = Open(options);
  EXPECT_EQ(Files(), std::vector<std::string>{Current().substr(dir_.size() + 1)});
  ASSERT_EQ(journal->Records().size(), 2u);
  absl::Status status;
  EXPECT_EQ(LoadOf(*journal, 1, "keep", &status), small);
  EXPECT_EQ(LoadOf(*journal, 3, "after", &status), small);
}

TEST_F(PersistentJournalTest, LeftoversOfACrashAreRemovedAtOpen) {
  std::vector<char> a = Bytes(4096, 11);
  std::string first;
  {
    auto journal = Open();
    ASSERT_TRUE(journal->AppendPut(1, "a", a.data(), a.size()).ok());
    ASSERT_TRUE(journal->Sync().ok());
    first = Current();
  }
  // A compaction that wrote journal-2 and renamed it, then died before removing journal-1; and
  // one cut short while writing journal-3.new; and data files of the issue-17 layout whose
  // manifest never came.
  ASSERT_EQ(std::system(("cp '" + first + "' '" + dir_ + "/journal-2'").c_str()), 0);
  std::ofstream(dir_ + "/journal-3.new") << "half a compaction";
  std::ofstream(dir_ + "/obj-12") << "a write cut short";
  auto journal = Open();
  EXPECT_TRUE(journal->open_status().ok()) << journal->open_status();
  EXPECT_EQ(Files(), std::vector<std::string>{"journal-2"});
  EXPECT_EQ(::access((dir_ + "/obj-12").c_str(), F_OK), -1);
  ASSERT_EQ(journal->Records().size(), 1u);
  // The next generation is past every number seen, the removed .new one included.
  ASSERT_TRUE(journal->CompactIfDue(/*force=*/true).ok());
  EXPECT_EQ(Current(), dir_ + "/journal-4");
}

TEST_F(PersistentJournalTest, MaxBytesBoundsTheFileCompactingFirst) {
  std::vector<char> a = Bytes(300 << 10, 12);  // three fit in the bound, four do not
  JournalOptions options;
  options.max_bytes = 1 << 20;
  auto journal = Open(options);
  // Replacing one object again and again: each put that would pass the bound compacts first.
  for (int i = 0; i < 20; ++i) {
    absl::Status s = journal->AppendPut(1, "again", a.data(), a.size());
    ASSERT_TRUE(s.ok()) << i << ": " << s;
    EXPECT_LE(journal->usage().file_bytes, options.max_bytes);
    EXPECT_LE(SizeOf(Current()), options.max_bytes);  // its padded last block too
  }
  EXPECT_GT(journal->usage().compactions, 0u);
  // Live objects that do not fit are refused, naming the setting.
  ASSERT_TRUE(journal->AppendPut(1, "two", a.data(), a.size()).ok());
  ASSERT_TRUE(journal->AppendPut(1, "three", a.data(), a.size()).ok());
  absl::Status full = journal->AppendPut(1, "four", a.data(), a.size());
  EXPECT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_NE(full.message().find("persistent_journal_max_bytes"), std::string::npos) << full;
  EXPECT_LE(journal->usage().file_bytes, options.max_bytes);
}

// Finding 15: an append that fails part way (ENOSPC; here the file size limit) leaves nothing
// behind, and the journal goes on.
TEST_F(PersistentJournalTest, AFailedAppendLeavesNothingPartial) {
  std::vector<char> a = Bytes(4096, 13), big = Bytes(1 << 20, 14);
  auto journal = Open();
  ASSERT_TRUE(journal->AppendPut(1, "a", a.data(), a.size()).ok());
  const uint64_t size = SizeOf(Current());
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  ::signal(SIGXFSZ, SIG_IGN);
  rlimit small{size + 100000, old.rlim_max};
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  absl::Status failed = journal->AppendPut(1, "big", big.data(), big.size());
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(SizeOf(Current()), size);
  EXPECT_EQ(journal->usage().errors, 1u);
  EXPECT_FALSE(journal->Find(1, "big").has_value());
  ASSERT_TRUE(journal->AppendPut(1, "b", a.data(), a.size()).ok());
  ASSERT_TRUE(journal->Sync().ok());
  journal.reset();
  journal = Open();
  EXPECT_TRUE(journal->open_status().ok()) << journal->open_status();
  EXPECT_EQ(journal->Records().size(), 2u);
}

// Appends go out O_DIRECT (here: /tmp is a real filesystem) in whole blocks: the file ends on a
// block boundary, the zero bytes after the last record are read as the clean end (not a torn
// tail), and the next append writes the last block again with its old bytes in front.
TEST_F(PersistentJournalTest, AppendsAreWholeBlocksAndThePaddingIsACleanEnd) {
  std::vector<char> a = Bytes(1000, 16), b = Bytes(9000, 17);
  {
    auto journal = Open();
    EXPECT_TRUE(journal->direct_io());
    ASSERT_TRUE(journal->AppendPut(1, "a", a.data(), a.size()).ok());
    ASSERT_TRUE(journal->Sync().ok());
    EXPECT_EQ(SizeOf(Current()) % 4096, 0u);
    EXPECT_LT(journal->usage().file_bytes, SizeOf(Current()));
  }
  {
    auto journal = Open();
    EXPECT_TRUE(journal->open_status().ok()) << journal->open_status();
    EXPECT_TRUE(journal->open_notes().empty()) << journal->open_notes().front();
    ASSERT_TRUE(journal->AppendPut(1, "b", b.data(), b.size()).ok());
    ASSERT_TRUE(journal->Sync().ok());
    EXPECT_EQ(SizeOf(Current()) % 4096, 0u);
  }
  auto journal = Open();
  EXPECT_TRUE(journal->open_notes().empty()) << journal->open_notes().front();
  absl::Status status;
  EXPECT_EQ(LoadOf(*journal, 1, "a", &status), a);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(LoadOf(*journal, 1, "b", &status), b);
  EXPECT_TRUE(status.ok()) << status;
}

// Where O_DIRECT is refused (tmpfs before Linux 6.6; here: not wanted) the journal writes
// buffered through the same queue, and all of it holds: reopen, replace, delete, compaction.
TEST_F(PersistentJournalTest, BufferedWhereDirectIoIsNotWanted) {
  JournalOptions options;
  options.direct_io = storage::DirectIo::kOff;
  options.compact_min_dead_bytes = 0;
  std::vector<char> a = Bytes(10000, 19), b = Bytes(70000, 20);
  {
    auto journal = Open(options);
    EXPECT_FALSE(journal->direct_io());
    ASSERT_TRUE(journal->AppendPut(1, "a", a.data(), a.size()).ok());
    ASSERT_TRUE(journal->AppendPut(1, "b", a.data(), a.size()).ok());
    ASSERT_TRUE(journal->AppendPut(1, "b", b.data(), b.size()).ok());
    ASSERT_TRUE(journal->AppendDelete(1, "a").ok());
    ASSERT_TRUE(journal->Sync().ok());
    ASSERT_TRUE(journal->CompactIfDue(/*force=*/true).ok());
    EXPECT_EQ(journal->usage().compactions, 1u);
  }
  auto journal = Open(options);
  EXPECT_TRUE(journal->open_status().ok()) << journal->open_status();
  EXPECT_TRUE(journal->open_notes().empty()) << journal->open_notes().front();
  EXPECT_FALSE(journal->Find(1, "a").has_value());
  absl::Status status;
  EXPECT_EQ(LoadOf(*journal, 1, "b", &status), b);
  EXPECT_TRUE(status.ok()) << status;
}

// A group of puts goes all or none: a write the device fails leaves none of them live and the
// file as it was; a group that does not fit is refused without counting an error.
TEST_F(PersistentJournalTest, AGroupOfPutsGoesAllOrNone) {
  storage::FaultyIoQueue* faulty = UseFaultyIo();
  ASSERT_NE(faulty, nullptr);
  JournalOptions options;
  options.max_bytes = 16 << 20;
  auto journal = Open(options);
  std::vector<char> a = Bytes(3000, 21), b = Bytes(200000, 22), c = Bytes(5000, 23);
  using Put = PersistentJournal::Put;
  const std::vector<Put> group = {{1, "a", a.data(), a.size()}, {1, "b", b.data(), b.size()},
                                  {2, "c", c.data(), c.size()}};
  ASSERT_TRUE(journal->AppendPuts(group).ok());
  ASSERT_TRUE(journal->Sync().ok());
  const uint64_t size = SizeOf(Current());
  const uint64_t end = journal->usage().file_bytes;
  // The second of the group's writes fails: nothing of the group stays.
  storage::FaultRule rule;
  rule.op = storage::IoOp::kWrite;
  rule.file = 1;  // the journal's file (the store's spill file is 0)
  rule.skip = 1;
  faulty->AddRule(rule);
  std::vector<char> big = Bytes(6 << 20, 24);  // more than one staging chunk: several writes
  const std::vector<Put> failing = {{3, "x", a.data(), a.size()}, {3, "y", big.data(), big.size()}};
  EXPECT_FALSE(journal->AppendPuts(failing).ok());
  EXPECT_EQ(journal->usage().errors, 1u);
  EXPECT_EQ(journal->usage().file_bytes, end);
  EXPECT_EQ(SizeOf(Current()), size);
  EXPECT_FALSE(journal->Find(3, "x").has_value());
  // Too big for max_bytes together: refused, no error counted.
  faulty->ClearRules();
  const std::vector<Put> too_big = {{4, "p", big.data(), big.size()},
                                    {4, "q", big.data(), big.size()},
                                    {4, "r", big.data(), big.size()}};
  absl::Status full = journal->AppendPuts(too_big);
  EXPECT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_EQ(journal->usage().errors, 1u);
  journal.reset();
  journal = Open();
  EXPECT_TRUE(journal->open_notes().empty()) << journal->open_notes().front();
  absl::Status status;
  EXPECT_EQ(LoadOf(*journal, 1, "a", &status), a);
  EXPECT_EQ(LoadOf(*journal, 1, "b", &status), b);
  EXPECT_EQ(LoadOf(*journal, 2, "c", &status), c);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(journal->Records().size(), 3u);
}

// A flush the device fails is reported (the records before it are not durable), counted, and
// the journal goes on.
TEST_F(PersistentJournalTest, AFailedFlushIsReported) {
  storage::FaultyIoQueue* faulty = UseFaultyIo();
  ASSERT_NE(faulty, nullptr);
  auto journal = Open();
  std::vector<char> a = Bytes(5000, 18);
  ASSERT_TRUE(journal->AppendPut(1, "a", a.data(), a.size()).ok());
  storage::FaultRule rule;
  rule.op = storage::IoOp::kSync;
  faulty->AddRule(rule);
  absl::Status synced = journal->Sync();
  EXPECT_FALSE(synced.ok());
  EXPECT_NE(synced.message().find("fdatasync"), std::string::npos) << synced;
  EXPECT_EQ(journal->usage().errors, 1u);
  EXPECT_TRUE(journal->Sync().ok());
}

TEST_F(PersistentJournalTest, TheIssue17LayoutIsImportedOnce) {
  ASSERT_EQ(::mkdir(dir_.c_str(), 0700), 0);
  std::vector<char> a = Bytes(5000, 15);
  {
    std::ofstream data(dir_ + "/obj-4", std::ios::binary);
    data.write(a.data(), static_cast<std::streamsize>(a.size()));
  }
  std::ofstream(dir_ + "/obj-9") << "not named by the manifest";
  std::string text = absl::StrCat("tierd-persistent 1\n1000 ", a.size(), " ",
                                  absl::Hex(storage::Crc32c(a.data(), a.size())),
                                  " obj-4 ckpt/old\n");
  absl::StrAppend(&text, "crc ", absl::Hex(storage::Crc32c(text.data(), text.size())), "\n");
  std::ofstream(dir_ + "/manifest") << text;
  {
    auto journal = Open();
    EXPECT_TRUE(journal->open_status().ok()) << journal->open_status();
    absl::Status status;
    EXPECT_EQ(LoadOf(*journal, 1000, "ckpt/old", &status), a);
    EXPECT_TRUE(status.ok()) << status;
  }
  EXPECT_EQ(::access((dir_ + "/manifest").c_str(), F_OK), -1);
  EXPECT_EQ(::access((dir_ + "/obj-4").c_str(), F_OK), -1);
  EXPECT_EQ(::access((dir_ + "/obj-9").c_str(), F_OK), -1);
  auto journal = Open();
  EXPECT_EQ(journal->Records().size(), 1u);
}

TEST_F(PersistentJournalTest, ADamagedIssue17ManifestIsSetAsideAndReported) {
  ASSERT_EQ(::mkdir(dir_.c_str(), 0700), 0);
  std::ofstream(dir_ + "/manifest") << "tierd-persistent 1\n1 2 3 obj-1 x\ncrc 0\n";
  auto journal = Open();
  EXPECT_TRUE(absl::IsDataLoss(journal->open_status())) << journal->open_status();
  EXPECT_TRUE(journal->Records().empty());
  EXPECT_EQ(::access((dir_ + "/manifest.damaged").c_str(), F_OK), 0);
}

}  // namespace
}  // namespace tier::daemon
