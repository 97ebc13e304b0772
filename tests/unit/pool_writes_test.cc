// PoolWrites: a reload is ordered after the writes into its pool bytes registered before it, and
// after no others; writes are found across the shards they span; and jobs on different pool
// bytes take different locks, so one GPU's flood of jobs does not hold another GPU's (issue 26).
#include "engine/pool_writes.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <chrono>
#include <future>
#include <vector>

namespace tier::engine {

// Holds the lock of the shard that `pool` falls in, as a busy GPU's worker would.
struct PoolWritesPeer {
  static Mutex& ShardLock(PoolWrites& writes, const char* pool) {
    return writes.shards_[PoolWrites::SpanOf(pool, 1).first].mu;
  }
};

namespace {

constexpr uint64_t kRegion = uint64_t{1} << PoolWrites::kRegionBits;

// A fake pool: only its addresses are used (reserved, never touched).
struct Pool {
  static constexpr uint64_t kBytes = 2 * PoolWrites::kShards * kRegion;
  Pool() : base(static_cast<char*>(::mmap(nullptr, kBytes, PROT_NONE,
                                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0))) {
    EXPECT_NE(base, MAP_FAILED);
  }
  ~Pool() { ::munmap(base, kBytes); }
  char* at(uint64_t offset) { return base + offset; }
  char* const base;
};

TEST(PoolWrites, AReloadIsOrderedAfterTheWritesRegisteredBeforeIt) {
  Pool pool;
  PoolWrites writes;
  const uint64_t write = writes.Add(pool.at(0), 4096);
  PoolWrites::Before before = writes.Newest(pool.at(0), 4096);
  const uint64_t later = writes.Add(pool.at(8192), 4096);  // after the reload: not its business
  std::vector<PoolWrites::Write> out;
  EXPECT_FALSE(writes.Overlapping(pool.at(0), 4096, before, &out)) << "not issued yet";
  uint64_t word = 0;
  writes.Issued(write, pool.at(0), 0x1000, &word, 7);
  ASSERT_TRUE(writes.Overlapping(pool.at(0), 4096, before, &out));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].id, write);
  EXPECT_EQ(out[0].seq, 7u);
  EXPECT_TRUE(writes.Overlapping(pool.at(0), 16384, before, &out)) << "later one is not waited for";
  EXPECT_EQ(out.size(), 1u);
  writes.End(write, pool.at(0));
  ASSERT_TRUE(writes.Overlapping(pool.at(0), 4096, before, &out));
  EXPECT_TRUE(out.empty());
  writes.End(later, pool.at(8192));
}

// A large write spans many shards: a reload of any part of it, even one whose first byte lies
// regions after the write's first byte, finds it, once.
TEST(PoolWrites, AWriteAcrossShardsIsFoundFromAnyOfThem) {
  Pool pool;
  PoolWrites writes;
  const uint64_t len = 3 * kRegion + 4096;
  const uint64_t write = writes.Add(pool.at(kRegion / 2), len);
  uint64_t word = 0;
  writes.Issued(write, pool.at(kRegion / 2), 0x2000, &word, 3);
  for (uint64_t offset : {kRegion / 2, kRegion, 2 * kRegion + 4096, 3 * kRegion}) {
    PoolWrites::Before before = writes.Newest(pool.at(offset), 2 * 4096);
    std::vector<PoolWrites::Write> out;
    ASSERT_TRUE(writes.Overlapping(pool.at(offset), 2 * 4096, before, &out)) << offset;
    ASSERT_EQ(out.size(), 1u) << offset;
    EXPECT_EQ(out[0].id, write);
  }
  // The whole range, across every shard it covers: the write once.
  PoolWrites::Before before = writes.Newest(pool.at(0), 5 * kRegion);
  std::vector<PoolWrites::Write> out;
  ASSERT_TRUE(writes.Overlapping(pool.at(0), 5 * kRegion, before, &out));
  EXPECT_EQ(out.size(), 1u);
  writes.End(write, pool.at(kRegion / 2));
  ASSERT_TRUE(writes.Overlapping(pool.at(0), 5 * kRegion, before, &out));
  EXPECT_TRUE(out.empty()) << "End removed it from every shard";
}

// Larger than every shard together: registered in each, found and ended everywhere.
TEST(PoolWrites, AWriteOfMoreRegionsThanShardsIsInEveryShard) {
  Pool pool;
  PoolWrites writes;
  const uint64_t len = (PoolWrites::kShards + 3) * kRegion;
  const uint64_t write = writes.Add(pool.at(0), len);
  for (int r = 0; r < PoolWrites::kShards + 3; ++r) {
    PoolWrites::Before before = writes.Newest(pool.at(r * kRegion), 4096);
    std::vector<PoolWrites::Write> out;
    EXPECT_FALSE(writes.Overlapping(pool.at(r * kRegion), 4096, before, &out)) << r;
  }
  writes.End(write, pool.at(0));
  PoolWrites::Before before = writes.Newest(pool.at(0), len);
  std::vector<PoolWrites::Write> out;
  ASSERT_TRUE(writes.Overlapping(pool.at(0), len, before, &out));
  EXPECT_TRUE(out.empty());
}

// While one job's pool bytes are locked (a GPU's worker busy with its flood of writes), a job on
// other pool bytes registers, is ordered, issued and ended without waiting. With one lock for
// every write (before issue 26) this waited for the other GPU.
TEST(PoolWrites, JobsOnOtherPoolBytesDoNotWaitForALockedShard) {
  Pool pool;
  PoolWrites writes;
  char* busy = pool.at(0);
  char* other = pool.at(5 * kRegion);
  std::future<bool> done;
  {
    MutexLock hold(&PoolWritesPeer::ShardLock(writes, busy));
    done = std::async(std::launch::async, [&] {
      const uint64_t write = writes.Add(other, 4096);
      PoolWrites::Before before = writes.Newest(other, 4096);
      uint64_t word = 0;
      writes.Issued(write, other, 0x3000, &word, 1);
      std::vector<PoolWrites::Write> out;
      const bool ordered = writes.Overlapping(other, 4096, before, &out) && out.size() == 1;
      writes.End(write, other);
      return ordered;
    });
    ASSERT_EQ(done.wait_for(std::chrono::seconds(10)), std::future_status::ready)
        << "a job on other pool bytes waited for the locked shard";
  }
  EXPECT_TRUE(done.get());
}

}  // namespace
}  // namespace tier::engine
