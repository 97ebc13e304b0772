// PersistentJournal (daemon/persistent_journal.h): persistent objects on NVMe across restarts.
// Written, reopened, and damaged on disk the ways a crash or a bad device would: nothing damaged
// is ever handed out as good data.
#include "daemon/persistent_journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tier::daemon {
namespace {

class PersistentJournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/tier-journal-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = std::string(pattern) + "/persistent";
  }
  void TearDown() override {
    std::string cmd = "rm -rf '" + dir_.substr(0, dir_.rfind('/')) + "'";
    (void)!std::system(cmd.c_str());
  }
  std::unique_ptr<PersistentJournal> Open() {
    auto journal = PersistentJournal::Open(dir_);
    EXPECT_TRUE(journal.ok()) << journal.status();
    return *std::move(journal);
  }
  // Flips one byte of `file` at `offset` from the end (1: the last byte).
  void Corrupt(const std::string& file, long from_end) {
    int fd = ::open((dir_ + "/" + file).c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    off_t size = ::lseek(fd, 0, SEEK_END);
    char c;
    ASSERT_EQ(::pread(fd, &c, 1, size - from_end), 1);
    c ^= 0x40;
    ASSERT_EQ(::pwrite(fd, &c, 1, size - from_end), 1);
    ::close(fd);
  }

  std::string dir_;
};

std::vector<char> Bytes(size_t n, char seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>(seed + i * 7);
  return v;
}

TEST_F(PersistentJournalTest, RecordsSurviveReopenBitIdentical) {
  std::vector<char> a = Bytes(10000, 1), b = Bytes(4096, 2);
  {
    auto journal = Open();
    EXPECT_TRUE(journal->manifest_status().ok());
    ASSERT_TRUE(journal->Add(1000, "ckpt/a", a.data(), a.size()).ok());
    ASSERT_TRUE(journal->Add(0, "b", b.data(), b.size()).ok());
    ASSERT_TRUE(journal->Add(1000, "gone", b.data(), b.size()).ok());
    ASSERT_TRUE(journal->Remove(1000, "gone").ok());
  }
  auto journal = Open();
  ASSERT_TRUE(journal->manifest_status().ok()) << journal->manifest_status();
  ASSERT_EQ(journal->records().size(), 2u);
  const PersistentJournal::Record& ra = journal->records()[0];
  EXPECT_EQ(ra.uid, 1000u);
  EXPECT_EQ(ra.name, "ckpt/a");
  EXPECT_EQ(ra.len, a.size());
  std::vector<char> out(ra.len);
  ASSERT_TRUE(journal->Load(ra, out.data()).ok());
  EXPECT_EQ(out, a);
  // Later adds do not reuse a file a record names.
  ASSERT_TRUE(journal->Add(5, "c", b.data(), b.size()).ok());
  for (const auto& r : journal->records()) {
    if (r.name != "c") {
      EXPECT_NE(r.file, journal->records().back().file);
    }
  }
}

TEST_F(PersistentJournalTest, DamagedRecordIsDataLossNeverData) {
  std::vector<char> a = Bytes(8192, 3);
  {
    auto journal = Open();
    ASSERT_TRUE(journal->Add(1, "a", a.data(), a.size()).ok());
    Corrupt(journal->records()[0].file, 100);
  }
  auto journal = Open();
  ASSERT_EQ(journal->records().size(), 1u);
  std::vector<char> out(a.size());
  absl::Status loaded = journal->Load(journal->records()[0], out.data());
  EXPECT_TRUE(absl::IsDataLoss(loaded)) << loaded;
  EXPECT_NE(loaded.message().find("checksum"), std::string::npos) << loaded;
  // A short (torn) file too.
  ASSERT_EQ(::truncate((dir_ + "/" + journal->records()[0].file).c_str(), 4096), 0);
  loaded = journal->Load(journal->records()[0], out.data());
  EXPECT_TRUE(absl::IsDataLoss(loaded)) << loaded;
}

TEST_F(PersistentJournalTest, DamagedManifestIsReportedAndSetAside) {
  std::vector<char> a = Bytes(4096, 4);
  {
    auto journal = Open();
    ASSERT_TRUE(journal->Add(1, "a", a.data(), a.size()).ok());
  }
  Corrupt("manifest", 20);  // inside a record line
  {
    auto journal = Open();
    EXPECT_TRUE(absl::IsDataLoss(journal->manifest_status())) << journal->manifest_status();
    EXPECT_TRUE(journal->records().empty());
    EXPECT_EQ(::access((dir_ + "/manifest.damaged").c_str(), F_OK), 0);
  }
  // Torn: cut short in the middle.
  {
    auto journal = Open();
    ASSERT_TRUE(journal->Add(1, "b", a.data(), a.size()).ok());
  }
  ASSERT_EQ(::truncate((dir_ + "/manifest").c_str(), 30), 0);
  auto journal = Open();
  EXPECT_TRUE(absl::IsDataLoss(journal->manifest_status())) << journal->manifest_status();
  EXPECT_TRUE(journal->records().empty());
}

TEST_F(PersistentJournalTest, LeftoverNewManifestOfACrashIsIgnored) {
  std::vector<char> a = Bytes(4096, 5);
  {
    auto journal = Open();
    ASSERT_TRUE(journal->Add(1, "a", a.data(), a.size()).ok());
  }
  // A crash between writing manifest.new and renaming it: the old manifest stands.
  std::ofstream(dir_ + "/manifest.new") << "tierd-persistent 1\nhalf a li";
  auto journal = Open();
  EXPECT_TRUE(journal->manifest_status().ok()) << journal->manifest_status();
  ASSERT_EQ(journal->records().size(), 1u);
  EXPECT_EQ(journal->records()[0].name, "a");
}

}  // namespace
}  // namespace tier::daemon
