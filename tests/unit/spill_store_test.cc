// SpillStore on real files, through each io queue (io_uring and the thread-pool fallback run the
// same suite): round trips of many records of varied sizes with every byte checked, corruption on
// disk caught as DATA_LOSS, injected EIO/ENOSPC/short transfers/bit flips failing one operation
// and nothing else, accounting, and shutdown.
#include "storage/spill_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "gtest/gtest.h"
#include "spill_test_util.h"
#include "storage/crc32c.h"
#include "storage/faulty_io_queue.h"
#include "storage/host_pool.h"
#include "storage/uring_io_queue.h"

namespace tier::storage {
namespace {

using testing::Countdown;
using testing::FillPattern;
using testing::TempDir;

// Passes everything through and counts, per registered file, the requests outstanding and the
// most seen at once (written on the store's I/O thread, read by the test: atomics).
class CountingIoQueue final : public IoQueue {
 public:
  explicit CountingIoQueue(std::unique_ptr<IoQueue> inner) : inner_(std::move(inner)) {}
  absl::Status RegisterBuffers(absl::Span<const IoBuffer> buffers) override {
    return inner_->RegisterBuffers(buffers);
  }
  absl::StatusOr<int> RegisterFile(int fd) override { return inner_->RegisterFile(fd); }
  absl::Status UnregisterFile(int index) override { return inner_->UnregisterFile(index); }
  absl::Status Enqueue(const IoRequest& request) override {
    absl::Status s = inner_->Enqueue(request);
    if (s.ok() && request.file >= 0 && request.file < kFiles) {
      file_of_[request.user_data] = request.file;
      uint32_t now = ++outstanding_[request.file];
      if (now > most_[request.file]) most_[request.file] = now;
      uint32_t all = inner_->outstanding();
      if (all > most_all_) most_all_ = all;
    }
    return s;
  }
  int Submit() override { return inner_->Submit(); }
  int Poll(std::vector<IoCompletion>* out, bool wait) override {
    size_t before = out->size();
    int n = inner_->Poll(out, wait);
    for (size_t i = before; i < out->size(); ++i) {
      auto it = file_of_.find((*out)[i].user_data);
      if (it == file_of_.end()) continue;
      --outstanding_[it->second];
      file_of_.erase(it);
    }
    return n;
  }
  void Wake() override { inner_->Wake(); }
  uint32_t outstanding() const override { return inner_->outstanding(); }
  uint32_t depth() const override { return inner_->depth(); }
  std::string_view name() const override { return inner_->name(); }

  static constexpr int kFiles = 4;
  uint32_t most(int file) const { return most_[file]; }
  uint32_t most_all() const { return most_all_; }

 private:
  std::unique_ptr<IoQueue> inner_;
  std::map<uint64_t, int> file_of_;  // I/O thread only
  std::atomic<uint32_t> outstanding_[kFiles] = {};
  std::atomic<uint32_t> most_[kFiles] = {};
  std::atomic<uint32_t> most_all_{0};
};

class SpillStoreTest : public ::testing::TestWithParam<IoQueueKind> {
 protected:
  void SetUp() override {
    if (GetParam() == IoQueueKind::kUring && !UringIoQueue::Create(2).ok()) {
      GTEST_SKIP() << "io_uring is not available here (detected, not assumed)";
    }
    auto pool = HostPool::Create({.bytes = 96 << 20, .lock = LockMode::kOff});
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
  }

  SpillStoreOptions Options(uint64_t file_bytes = 64 << 20) {
    SpillStoreOptions o;
    o.directories = {dir_.path()};
    o.file_bytes = file_bytes;
    o.io_bytes = 64 << 10;  // small chunks: records of a few hundred KiB span many requests
    o.queue_depth = 8;
    o.io_queue = GetParam();
    o.registered_buffers = {IoBuffer{pool_->base(), pool_->bytes()}};
    return o;
  }

  // The store with its queue wrapped in a FaultyIoQueue (faulty_).
  std::unique_ptr<SpillStore> MakeFaulty(SpillStoreOptions o) {
    o.wrap_io_queue = [this](std::unique_ptr<IoQueue> inner) {
      auto faulty = std::make_unique<FaultyIoQueue>(std::move(inner));
      faulty_ = faulty.get();
      return faulty;
    };
    return Make(std::move(o));
  }

  std::unique_ptr<SpillStore> Make(SpillStoreOptions o) {
    auto store = SpillStore::Create(std::move(o));
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }

  char* Alloc(uint64_t bytes) {
    std::optional<Extent> e = pool_->Allocate(bytes);
    EXPECT_TRUE(e.has_value()) << bytes;
    return e ? pool_->At(*e) : nullptr;
  }

  // Overwrites bytes of the spill file behind the store's back, as a failing disk would.
  void Scribble(const std::string& path, uint64_t offset, const std::string& garbage) {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
    ASSERT_TRUE(fd.valid());
    ASSERT_EQ(::pwrite(fd.get(), garbage.data(), garbage.size(), static_cast<off_t>(offset)),
              static_cast<ssize_t>(garbage.size()));
    ASSERT_EQ(::fdatasync(fd.get()), 0);
  }

  TempDir dir_;
  std::unique_ptr<HostPool> pool_;
  FaultyIoQueue* faulty_ = nullptr;
};

TEST_P(SpillStoreTest, ManyRecordsOfVariedSizesRoundTripExactly) {
  auto store = Make(Options());
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->io_queue_name(), GetParam() == IoQueueKind::kUring ? "io_uring" : "thread_pool");

  // Edge sizes around the block and the io size, then random ones up to 600 KiB.
  std::vector<uint64_t> sizes = {1, 100, 4095, 4096, 4097, 65535, 65536, 65537, 3 * 65536 + 5};
  std::mt19937_64 rng(11);
  while (sizes.size() < 90) sizes.push_back(1 + rng() % (600 << 10));
  uint64_t total = 0;
  for (uint64_t s : sizes) total += (s + 4095) & ~uint64_t{4095};

  std::vector<char*> src(sizes.size()), dst(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    src[i] = Alloc(sizes[i]);
    dst[i] = Alloc(sizes[i]);
    ASSERT_TRUE(src[i] && dst[i]);
    FillPattern(src[i], sizes[i], 1000 + i);
  }

  // All writes in flight at once; callbacks arrive on the store's I/O thread.
  std::vector<SpillRecord> records(sizes.size());
  std::vector<absl::Status> write_status(sizes.size());
  Countdown written(static_cast<int>(sizes.size()));
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(store->Write(src[i], sizes[i], [&, i](absl::StatusOr<SpillRecord> r) {
                  write_status[i] = r.status();
                  if (r.ok()) records[i] = *r;
                  written.Done();
                }).ok());
  }
  written.Wait();
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(write_status[i].ok()) << write_status[i];
    EXPECT_EQ(records[i].len, sizes[i]);
  }

  std::vector<absl::Status> read_status(sizes.size());
  Countdown read(static_cast<int>(sizes.size()));
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(store->Read(records[i], dst[i], [&, i](absl::Status s) {
                  read_status[i] = std::move(s);
                  read.Done();
                }).ok());
  }
  read.Wait();
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(read_status[i].ok()) << read_status[i];
    ASSERT_EQ(std::memcmp(src[i], dst[i], sizes[i]), 0) << "record " << i << ", " << sizes[i] << " bytes";
  }

  std::vector<SpillFileUsage> usage = store->Usage();
  ASSERT_EQ(usage.size(), 1u);
  EXPECT_EQ(usage[0].records, sizes.size());
  EXPECT_EQ(usage[0].used_bytes, total);
  EXPECT_EQ(usage[0].bytes_written, total);
  EXPECT_EQ(usage[0].bytes_read, total);
  EXPECT_EQ(usage[0].writes, sizes.size());
  EXPECT_EQ(usage[0].reads, sizes.size());
  EXPECT_EQ(usage[0].capacity_bytes, uint64_t{64} << 20);
  EXPECT_EQ(usage[0].write_errors + usage[0].read_errors + usage[0].checksum_failures, 0u);
  EXPECT_EQ(usage[0].direct_io, testing::DirectIoWorks(dir_.path()));

  for (const SpillRecord& r : records) ASSERT_TRUE(store->Free(r).ok());
  usage = store->Usage();
  EXPECT_EQ(usage[0].used_bytes, 0u);
  EXPECT_EQ(usage[0].records, 0u);
}

TEST_P(SpillStoreTest, ConcurrentCallersFromSeveralThreads) {
  auto store = Make(Options());
  ASSERT_NE(store, nullptr);
  constexpr int kThreads = 3, kPerThread = 20;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    char* src = Alloc(256 << 10);
    char* dst = Alloc(256 << 10);
    threads.emplace_back([&, t, src, dst] {
      for (int i = 0; i < kPerThread; ++i) {
        uint64_t len = 1 + (static_cast<uint64_t>(t * 7919 + i * 104729) % (256 << 10));
        FillPattern(src, len, t * 1000 + i);
        absl::StatusOr<SpillRecord> r = store->WriteAndWait(src, len);
        if (!r.ok() || !store->ReadAndWait(*r, dst).ok() || std::memcmp(src, dst, len) != 0 ||
            !store->Free(*r).ok()) {
          ++failures;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(store->Usage()[0].used_bytes, 0u);
}

TEST_P(SpillStoreTest, CorruptionOnDiskIsDataLossNamingTheRecord) {
  auto store = Make(Options());
  ASSERT_NE(store, nullptr);
  char* a = Alloc(300000);
  char* b = Alloc(300000);
  char* out = Alloc(300000);
  FillPattern(a, 300000, 1);
  FillPattern(b, 300000, 2);
  absl::StatusOr<SpillRecord> ra = store->WriteAndWait(a, 300000);
  absl::StatusOr<SpillRecord> rb = store->WriteAndWait(b, 300000);
  ASSERT_TRUE(ra.ok() && rb.ok());

  Scribble(store->file_path(ra->file), ra->extent.offset + 200000, "not the data you wrote");
  absl::Status s = store->ReadAndWait(*ra, out);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("spill record " + std::to_string(ra->id)), std::string_view::npos) << s;
  EXPECT_NE(s.message().find("checksum mismatch"), std::string_view::npos) << s;

  // Corruption past len, in the padding of the last block, is not data: still a clean read.
  Scribble(store->file_path(rb->file), rb->extent.offset + 300000 + 10, "padding");
  ASSERT_TRUE(store->ReadAndWait(*rb, out).ok());
  EXPECT_EQ(std::memcmp(out, b, 300000), 0);

  SpillFileUsage u = store->Usage()[0];
  EXPECT_EQ(u.checksum_failures, 1u);
  EXPECT_EQ(u.read_errors, 0u);
  EXPECT_EQ(u.reads, 1u);
  // The damaged record can still be freed, and its space is reused.
  ASSERT_TRUE(store->Free(*ra).ok());
  absl::StatusOr<SpillRecord> rc = store->WriteAndWait(a, 300000);
  ASSERT_TRUE(rc.ok());
  ASSERT_TRUE(store->ReadAndWait(*rc, out).ok());
  EXPECT_EQ(std::memcmp(out, a, 300000), 0);
}

// Each chunk is verified on its own as soon as every chunk before it arrived: progress reports a
// growing verified prefix, the whole record on a clean read, and stops short of a damaged chunk.
TEST_P(SpillStoreTest, ProgressReportsOnlyVerifiedChunksInOrder) {
  SpillStoreOptions o = Options();
  o.io_bytes = 16 << 10;
  auto store = Make(o);
  ASSERT_NE(store, nullptr);
  constexpr uint64_t kLen = 10 * (16 << 10) - 1000;  // 10 chunks, the last one short
  char* src = Alloc(kLen);
  char* out = Alloc(kLen);
  FillPattern(src, kLen, 42);
  absl::StatusOr<SpillRecord> r = store->WriteAndWait(src, kLen);
  ASSERT_TRUE(r.ok()) << r.status();

  auto read = [&](std::vector<uint64_t>* seen) {
    Countdown done(1);
    absl::Status result;
    absl::Status posted = store->Read(
        *r, out,
        [&](absl::Status s) {
          result = std::move(s);
          done.Done();
        },
        [&](uint64_t verified) { seen->push_back(verified); });
    if (!posted.ok()) return posted;
    done.Wait();
    return result;
  };
  std::vector<uint64_t> clean;
  ASSERT_TRUE(read(&clean).ok());
  ASSERT_FALSE(clean.empty());
  EXPECT_TRUE(std::is_sorted(clean.begin(), clean.end()));
  EXPECT_EQ(std::adjacent_find(clean.begin(), clean.end()), clean.end()) << "repeated value";
  EXPECT_EQ(clean.back(), kLen);
  for (uint64_t v : clean) EXPECT_TRUE(v == kLen || v % (16 << 10) == 0) << v;
  EXPECT_EQ(std::memcmp(out, src, kLen), 0);

  // Damage chunk 6: nothing at or past it is ever reported verified.
  Scribble(store->file_path(r->file), r->extent.offset + 6 * (16 << 10) + 100, "bad");
  std::vector<uint64_t> damaged;
  absl::Status s = read(&damaged);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("chunk 6"), std::string_view::npos) << s;
  for (uint64_t v : damaged) EXPECT_LE(v, 6u * (16 << 10));
  EXPECT_EQ(store->Usage()[0].checksum_failures, 1u);
}

TEST_P(SpillStoreTest, WriteErrorsFailOneRecordAndLoseNothingElse) {
  auto store = MakeFaulty(Options());
  ASSERT_NE(store, nullptr);
  ASSERT_NE(faulty_, nullptr);
  EXPECT_EQ(store->io_queue_name().substr(0, 7), "faulty(");
  char* src = Alloc(1 << 20);
  char* out = Alloc(1 << 20);
  FillPattern(src, 1 << 20, 3);
  absl::StatusOr<SpillRecord> kept = store->WriteAndWait(src, 500000);
  ASSERT_TRUE(kept.ok());
  uint64_t used_before = store->Usage()[0].used_bytes;

  // EIO on the 3rd chunk of the next record (chunks are 64 KiB).
  faulty_->AddRule({.op = IoOp::kWrite, .error = EIO, .skip = 2});
  absl::StatusOr<SpillRecord> r = store->WriteAndWait(src, 1 << 20);
  EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("Input/output error"), std::string_view::npos);

  // ENOSPC on a single-chunk record.
  faulty_->AddRule({.op = IoOp::kWrite, .error = ENOSPC});
  r = store->WriteAndWait(src, 4096);
  EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("No space left"), std::string_view::npos);

  // A short write of the 2nd chunk whose remainder fails.
  faulty_->AddRule({.op = IoOp::kWrite, .action = FaultRule::Action::kShort, .error = EIO,
                    .skip = 1, .short_bytes = 4096});
  r = store->WriteAndWait(src, 300000);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("short transfer"), std::string_view::npos) << r.status();

  SpillFileUsage u = store->Usage()[0];
  EXPECT_EQ(u.write_errors, 3u);
  EXPECT_EQ(u.used_bytes, used_before);  // the failed records' space is back
  EXPECT_EQ(u.records, 1u);
  // The store keeps working, and the earlier record is intact.
  ASSERT_TRUE(store->ReadAndWait(*kept, out).ok());
  EXPECT_EQ(std::memcmp(out, src, 500000), 0);
  r = store->WriteAndWait(src, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(store->ReadAndWait(*r, out).ok());
  EXPECT_EQ(std::memcmp(out, src, 1 << 20), 0);
}

TEST_P(SpillStoreTest, ReadErrorsAndBitFlipsFailTheReadButKeepTheRecord) {
  auto store = MakeFaulty(Options());
  ASSERT_NE(store, nullptr);
  char* src = Alloc(1 << 20);
  char* out = Alloc(1 << 20);
  FillPattern(src, 1 << 20, 4);
  absl::StatusOr<SpillRecord> r = store->WriteAndWait(src, 777777);
  ASSERT_TRUE(r.ok());

  faulty_->AddRule({.op = IoOp::kRead, .error = EIO, .skip = 4});
  absl::Status s = store->ReadAndWait(*r, out);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("Input/output error"), std::string_view::npos) << s;

  faulty_->AddRule({.op = IoOp::kRead, .action = FaultRule::Action::kShort, .error = EIO});
  EXPECT_FALSE(store->ReadAndWait(*r, out).ok());

  // One bit flipped in a chunk after the device delivered it: only the checksum can tell.
  faulty_->AddRule({.op = IoOp::kRead, .action = FaultRule::Action::kCorrupt,
                    .offset_begin = r->extent.offset + 400000,
                    .offset_end = r->extent.offset + 400001,
                    .corrupt_offset = r->extent.offset + 400000});
  s = store->ReadAndWait(*r, out);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("checksum mismatch"), std::string_view::npos) << s;

  SpillFileUsage u = store->Usage()[0];
  EXPECT_EQ(u.read_errors, 2u);
  EXPECT_EQ(u.checksum_failures, 1u);
  EXPECT_EQ(faulty_->total_fired(), 3u);
  // The record survives all of it: a retry reads it whole.
  ASSERT_TRUE(store->ReadAndWait(*r, out).ok());
  EXPECT_EQ(std::memcmp(out, src, 777777), 0);
}

TEST_P(SpillStoreTest, RefusesWhatItCannotDo) {
  auto store = Make(Options(1 << 20));
  ASSERT_NE(store, nullptr);
  char* buf = Alloc(2 << 20);
  EXPECT_TRUE(absl::IsInvalidArgument(store->Write(buf + 512, 4096, [](auto) {})));
  EXPECT_TRUE(absl::IsInvalidArgument(store->Write(buf, 0, [](auto) {})));
  EXPECT_TRUE(absl::IsInvalidArgument(store->Write(nullptr, 4096, [](auto) {})));
  // Larger than the file: refused at once, no callback.
  EXPECT_TRUE(absl::IsResourceExhausted(store->WriteAndWait(buf, (1 << 20) + 1).status()));

  absl::StatusOr<SpillRecord> r = store->WriteAndWait(buf, 1 << 20);  // fills the file exactly
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(absl::IsResourceExhausted(store->WriteAndWait(buf, 1).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store->ReadAndWait(*r, buf + 1)));

  SpillRecord stale = *r;
  stale.id += 1000;
  EXPECT_TRUE(absl::IsNotFound(store->Free(stale)));
  EXPECT_TRUE(absl::IsNotFound(store->ReadAndWait(stale, buf)));
  ASSERT_TRUE(store->Free(*r).ok());
  EXPECT_TRUE(absl::IsNotFound(store->Free(*r)));  // double free
  EXPECT_TRUE(absl::IsNotFound(store->ReadAndWait(*r, buf)));
  EXPECT_EQ(store->Usage()[0].used_bytes, 0u);
}

// A spill file locked by someone else (here another open file description; in life a tierd killed
// a moment ago whose io_uring the kernel has not torn down yet) is waited for, up to lock_wait_ms;
// a directory named twice is refused at once, whatever the wait.
TEST_P(SpillStoreTest, WaitsBoundedForAFileAnotherHolderLocks) {
  const std::string path = dir_.File("tierd.spill");
  UniqueFd holder(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  ASSERT_TRUE(holder.valid());
  ASSERT_EQ(::flock(holder.get(), LOCK_EX | LOCK_NB), 0);
  {
    SpillStoreOptions o = Options(1 << 20);
    o.lock_wait_ms = 0;
    absl::StatusOr<std::unique_ptr<SpillStore>> refused = SpillStore::Create(std::move(o));
    EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
    EXPECT_NE(refused.status().message().find("in use by another process"), std::string::npos);
    o = Options(1 << 20);
    o.lock_wait_ms = 200;
    auto start = std::chrono::steady_clock::now();
    refused = SpillStore::Create(std::move(o));
    EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
    EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));
    EXPECT_NE(refused.status().message().find("waited"), std::string::npos) << refused.status();
  }
  // The holder lets go while the store waits: the store gets the file.
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    holder.reset();
  });
  SpillStoreOptions o = Options(1 << 20);
  o.lock_wait_ms = 20000;
  absl::StatusOr<std::unique_ptr<SpillStore>> store = SpillStore::Create(std::move(o));
  release.join();
  ASSERT_TRUE(store.ok()) << store.status();
  store->reset();
  // The same directory twice (the second spelled differently): refused at once.
  o = Options(1 << 20);
  o.directories = {dir_.path(), dir_.path() + "/."};
  o.lock_wait_ms = 20000;
  auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<SpillStore>> twice = SpillStore::Create(std::move(o));
  EXPECT_TRUE(absl::IsInvalidArgument(twice.status())) << twice.status();
  EXPECT_NE(twice.status().message().find("listed twice"), std::string::npos) << twice.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST_P(SpillStoreTest, FreeDuringReadReleasesSpaceAfterTheRead) {
  auto store = Make(Options());
  ASSERT_NE(store, nullptr);
  char* src = Alloc(4 << 20);
  char* out = Alloc(4 << 20);
  FillPattern(src, 4 << 20, 5);
  absl::StatusOr<SpillRecord> r = store->WriteAndWait(src, 4 << 20);
  ASSERT_TRUE(r.ok());
  Countdown done(1);
  absl::Status read_status;
  ASSERT_TRUE(store->Read(*r, out, [&](absl::Status s) {
                read_status = std::move(s);
                done.Done();
              }).ok());
  ASSERT_TRUE(store->Free(*r).ok());  // usually while the read is in flight
  EXPECT_TRUE(absl::IsNotFound(store->Read(*r, out, [](absl::Status) {})));
  done.Wait();
  EXPECT_TRUE(read_status.ok()) << read_status;
  EXPECT_EQ(std::memcmp(out, src, 4 << 20), 0);
  EXPECT_EQ(store->Usage()[0].used_bytes, 0u);
}

TEST_P(SpillStoreTest, SpreadsRecordsOverSeveralDirectories) {
  TempDir second;
  SpillStoreOptions o = Options(8 << 20);
  o.directories.push_back(second.path());
  auto store = Make(o);
  ASSERT_NE(store, nullptr);
  ASSERT_EQ(store->files(), 2u);
  char* src = Alloc(1 << 20);
  char* out = Alloc(1 << 20);
  std::vector<SpillRecord> records;
  for (int i = 0; i < 12; ++i) {  // 12 MiB: more than one file holds
    FillPattern(src, 1 << 20, 50 + i);
    absl::StatusOr<SpillRecord> r = store->WriteAndWait(src, 1 << 20);
    ASSERT_TRUE(r.ok()) << r.status();
    records.push_back(*r);
  }
  std::vector<SpillFileUsage> u = store->Usage();
  EXPECT_EQ(u[0].records, 6u);
  EXPECT_EQ(u[1].records, 6u);
  EXPECT_NE(u[0].path, u[1].path);
  for (int i = 0; i < 12; ++i) {
    FillPattern(src, 1 << 20, 50 + i);
    ASSERT_TRUE(store->ReadAndWait(records[i], out).ok());
    ASSERT_EQ(std::memcmp(out, src, 1 << 20), 0) << i;
  }
}

// queue_depth is per file: each device gets its own depth, and a file at its depth does not hold
// back requests for the others (one shared depth would drive N devices at 1/N of it each).
TEST_P(SpillStoreTest, EachFileGetsItsOwnQueueDepth) {
  TempDir second;
  SpillStoreOptions o = Options(16 << 20);
  o.directories.push_back(second.path());
  o.queue_depth = 2;
  CountingIoQueue* counting = nullptr;
  o.wrap_io_queue = [&counting](std::unique_ptr<IoQueue> inner) {
    auto queue = std::make_unique<CountingIoQueue>(std::move(inner));
    counting = queue.get();
    return queue;
  };
  auto store = Make(o);
  ASSERT_NE(store, nullptr);
  ASSERT_NE(counting, nullptr);
  EXPECT_EQ(counting->depth(), 4u);  // 2 per file, 2 files
  // Records of 16 chunks, all submitted at once: each file's requests fill its own depth.
  constexpr int kRecords = 16;
  constexpr uint64_t kLen = 1 << 20;
  std::vector<char*> srcs;
  for (int i = 0; i < kRecords; ++i) {
    srcs.push_back(Alloc(kLen));
    FillPattern(srcs.back(), kLen, 300 + i);
  }
  std::vector<SpillRecord> records(kRecords);
  Countdown written(kRecords);
  for (int i = 0; i < kRecords; ++i) {
    ASSERT_TRUE(store
                    ->Write(srcs[i], kLen,
                            [&, i](absl::StatusOr<SpillRecord> r) {
                              EXPECT_TRUE(r.ok()) << r.status();
                              if (r.ok()) records[i] = *r;
                              written.Done();
                            })
                    .ok());
  }
  written.Wait();
  EXPECT_EQ(counting->most(0), 2u);  // the first record alone has 16 chunks to issue
  EXPECT_EQ(counting->most(1), 2u);
  EXPECT_LE(counting->most_all(), 4u);
  std::vector<SpillFileUsage> u = store->Usage();
  EXPECT_EQ(u[0].records + u[1].records, static_cast<uint64_t>(kRecords));
  EXPECT_GT(u[0].records, 0u);
  EXPECT_GT(u[1].records, 0u);
  char* out = Alloc(kLen);
  for (int i = 0; i < kRecords; ++i) {
    ASSERT_TRUE(store->ReadAndWait(records[i], out).ok()) << i;
    ASSERT_EQ(std::memcmp(out, srcs[i], kLen), 0) << i;
  }
  EXPECT_LE(counting->most(0), 2u);
  EXPECT_LE(counting->most(1), 2u);
}

TEST_P(SpillStoreTest, ASecondStoreOnTheSameDirectoryIsRefused) {
  auto store = Make(Options(1 << 20));
  ASSERT_NE(store, nullptr);
  std::string path = store->file_path(0);
  auto second = SpillStore::Create(Options(1 << 20));
  EXPECT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();
  EXPECT_EQ(::access(path.c_str(), F_OK), 0);  // the loser did not remove the winner's file
  store.reset();
  EXPECT_NE(::access(path.c_str(), F_OK), 0);  // removed at close
}

TEST_P(SpillStoreTest, ClosingRunsEveryCallbackExactlyOnce) {
  constexpr int kRecords = 40;
  std::vector<std::atomic<int>> calls(kRecords);
  std::atomic<int> ok{0}, cancelled{0};
  {
    auto store = Make(Options());
    ASSERT_NE(store, nullptr);
    char* src = Alloc(1 << 20);
    FillPattern(src, 1 << 20, 6);
    for (int i = 0; i < kRecords; ++i) {
      ASSERT_TRUE(store->Write(src, 1 << 20, [&, i](absl::StatusOr<SpillRecord> r) {
                    ++calls[i];
                    if (r.ok()) ++ok;
                    if (absl::IsCancelled(r.status())) ++cancelled;
                  }).ok());
    }
  }  // destroyed with most writes still queued
  for (int i = 0; i < kRecords; ++i) EXPECT_EQ(calls[i].load(), 1) << i;
  EXPECT_EQ(ok + cancelled, kRecords);
}

TEST_P(SpillStoreTest, BufferedModeWorksWhereDirectIoIsNotWanted) {
  SpillStoreOptions o = Options(4 << 20);
  o.direct_io = DirectIo::kOff;
  o.registered_buffers.clear();
  auto store = Make(o);
  ASSERT_NE(store, nullptr);
  EXPECT_FALSE(store->Usage()[0].direct_io);
  char* src = Alloc(1 << 20);
  char* out = Alloc(1 << 20);
  FillPattern(src, 1 << 20, 7);
  absl::StatusOr<SpillRecord> r = store->WriteAndWait(src, 123456);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(store->ReadAndWait(*r, out).ok());
  EXPECT_EQ(std::memcmp(out, src, 123456), 0);
}

// An attached file (the persistent journal's) is written, flushed and read through the store's
// queue from its staging memory; once detached, requests for it are refused and its index goes
// to the next file.
TEST_P(SpillStoreTest, AttachedFilesGoThroughTheSameQueue) {
  SpillStoreOptions o = Options(1 << 20);
  o.staging_bytes = 1 << 20;
  auto store = Make(o);
  ASSERT_NE(store, nullptr);
  ASSERT_NE(store->staging(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(store->staging()) % 4096, 0u);
  const std::string path = dir_.File("attached");
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT, 0600));
  ASSERT_TRUE(fd.valid());
  absl::StatusOr<uint32_t> file = store->AttachFile(fd.get());
  ASSERT_TRUE(file.ok()) << file.status();
  auto run = [&](IoOp op, uint64_t offset, char* buf, uint64_t len) {
    auto done = std::make_shared<std::promise<absl::Status>>();
    std::future<absl::Status> result = done->get_future();
    absl::Status posted = store->FileIo(*file, op, offset, buf, len,
                                        [done](absl::Status s) { done->set_value(std::move(s)); });
    return posted.ok() ? result.get() : posted;
  };
  char* staging = store->staging();
  FillPattern(staging, 8192, 5);
  ASSERT_TRUE(run(IoOp::kWrite, 4096, staging, 8192).ok());
  ASSERT_TRUE(run(IoOp::kSync, 0, nullptr, 0).ok());
  char* back = Alloc(8192);
  ASSERT_TRUE(run(IoOp::kRead, 4096, back, 8192).ok());
  EXPECT_TRUE(testing::MatchesPattern(back, 8192, 5));
  EXPECT_TRUE(absl::IsInvalidArgument(run(IoOp::kWrite, 0, nullptr, 4096)));
  ASSERT_TRUE(store->DetachFile(*file).ok());
  EXPECT_TRUE(absl::IsNotFound(run(IoOp::kSync, 0, nullptr, 0)));
  EXPECT_TRUE(absl::IsNotFound(store->DetachFile(*file)));
  absl::StatusOr<uint32_t> again = store->AttachFile(fd.get());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *file);
  ASSERT_TRUE(store->DetachFile(*again).ok());
  // The spill files work on beside it.
  char* src = Alloc(4096);
  FillPattern(src, 4096, 6);
  absl::StatusOr<SpillRecord> record = store->WriteAndWait(src, 4096);
  ASSERT_TRUE(record.ok()) << record.status();
  ASSERT_TRUE(store->ReadAndWait(*record, back).ok());
  EXPECT_TRUE(testing::MatchesPattern(back, 4096, 6));
}

INSTANTIATE_TEST_SUITE_P(Queues, SpillStoreTest,
                         ::testing::Values(IoQueueKind::kUring, IoQueueKind::kThreadPool),
                         [](const auto& info) {
                           return info.param == IoQueueKind::kUring ? "IoUring" : "ThreadPool";
                         });

TEST(SpillStoreOptions, RejectsBadOptions) {
  TempDir dir;
  EXPECT_FALSE(SpillStore::Create({.file_bytes = 1 << 20}).ok());
  EXPECT_FALSE(SpillStore::Create({.directories = {dir.path()}, .file_bytes = 100}).ok());
  EXPECT_FALSE(
      SpillStore::Create({.directories = {dir.path()}, .file_bytes = 1 << 20, .io_bytes = 1000})
          .ok());
  EXPECT_FALSE(SpillStore::Create({.directories = {dir.path() + "/missing"}, .file_bytes = 1 << 20})
                   .ok());
  EXPECT_FALSE(
      SpillStore::Create({.directories = {dir.path()}, .file_bytes = 1 << 20, .queue_depth = 0})
          .ok());
  // The depth is per file: two files of 4096 each exceed what one io queue holds.
  TempDir second;
  absl::StatusOr<std::unique_ptr<SpillStore>> deep = SpillStore::Create(
      {.directories = {dir.path(), second.path()}, .file_bytes = 1 << 20, .queue_depth = 4096});
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(deep.status().message().find("per file x 2 files"), std::string::npos)
      << deep.status();
}

}  // namespace
}  // namespace tier::storage
