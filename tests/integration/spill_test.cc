// The NVMe tier with a real tierd and real files: more data than the host pool holds goes to the
// spill file and comes back byte for byte, through io_uring and through the pread/pwrite thread
// pool, with prefetching; a spilled record corrupted on disk fails its reload with DATA_LOSS and
// nothing else; I/O faults injected in the I/O layer (tierd's test-only spill_inject_faults:
// EIO, ENOSPC, short transfers, corrupted reads) fail or delay only the I/O they hit, and nothing
// is lost, with both I/O back ends.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "tier/client.hpp"
#include "tierd_process.h"
#include "unit/spill_test_util.h"

namespace tier {
namespace {

using testing::TierdProcess;

constexpr uint64_t kMiB = 1 << 20;
constexpr int kObjects = 48;  // 48 MiB through a 16 MiB host pool

void Fill(void* data, uint64_t len, uint32_t seed) {
  std::mt19937 rng(seed);
  auto* words = static_cast<uint32_t*>(data);
  for (uint64_t i = 0; i < len / 4; ++i) words[i] = rng();
}

bool Matches(const void* data, uint64_t len, uint32_t seed) {
  std::vector<uint32_t> expected(len / 4);
  Fill(expected.data(), len, seed);
  return std::memcmp(data, expected.data(), len) == 0;
}

// 128 KiB I/Os: each 1 MiB object is 8 chunks, so reloads of spilled objects are pipelined (each
// chunk copied onward as the read verifies it).
std::vector<std::string> SpillFlags(const std::string& io) {
  return {"--pool_bytes=16M", "--spill_bytes=256M", "--spill_high_pct=50", "--spill_low_pct=25",
          "--spill_io_bytes=128K", "--spill_io=" + io};
}

// The host pool may be momentarily full while the spiller writes: an offload or a reload then
// fails at once with RESOURCE_EXHAUSTED (the client keeps its data) and is retried here.
template <typename Submit>
tier_status RetryWhileFull(Session& session, Submit submit) {
  for (int attempt = 0;; ++attempt) {
    tier_job_id job = submit();
    tier_status status = session.TryWait(job, 30000);
    if (status != TIER_RESOURCE_EXHAUSTED || attempt == 5000) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// Offloads kObjects objects of 1 MiB one at a time (object i filled with seed base + i), each
// retried while the pool is momentarily full; their ids.
std::vector<tier_object_id> OffloadOneByOne(Session& session, HostBuffer& buffer, uint32_t base) {
  std::vector<tier_object_id> objects(kObjects);
  for (int i = 0; i < kObjects; ++i) {
    Fill(buffer.data, kMiB, base + i);
    tier_status status = RetryWhileFull(session, [&] {
      auto [object, job] = session.Offload(buffer.id, 0, kMiB);
      objects[i] = object;
      return job;
    });
    EXPECT_EQ(status, TIER_OK) << "offload " << i;
    if (status != TIER_OK) return {};
  }
  return objects;
}

// Reloads every object into `buffer`, newest first (as activations come back in backward), each
// reload dropping its object and retried while the pool is momentarily full; object i must come
// back filled with seed base + i.
void ReloadAllInReverse(Session& session, HostBuffer& buffer,
                        const std::vector<tier_object_id>& objects, uint32_t base) {
  for (int i = static_cast<int>(objects.size()) - 1; i >= 0; --i) {
    std::memset(buffer.data, 0, kMiB);
    ASSERT_EQ(RetryWhileFull(session,
                             [&] { return session.Reload(objects[i], buffer.id, 0, kMiB, true); }),
              TIER_OK)
        << "reload " << i;
    EXPECT_TRUE(Matches(buffer.data, kMiB, base + i)) << "object " << i << " came back different";
  }
}

// Offloads `count` objects of 1 MiB one at a time, each either stored or refused at once with
// RESOURCE_EXHAUSTED (a hang fails the test): the stored ones with their seeds; `refused` counts
// the others.
std::vector<std::pair<tier_object_id, uint32_t>> OffloadUntilFull(Session& session,
                                                                  HostBuffer& buffer, int count,
                                                                  uint32_t base, int* refused) {
  std::vector<std::pair<tier_object_id, uint32_t>> stored;
  *refused = 0;
  for (int i = 0; i < count; ++i) {
    Fill(buffer.data, kMiB, base + i);
    auto [object, job] = session.Offload(buffer.id, 0, kMiB);
    tier_status status = session.TryWait(job, 30000);
    EXPECT_NE(status, TIER_DEADLINE_EXCEEDED) << "offload " << i << " hangs";
    if (status == TIER_DEADLINE_EXCEEDED) break;
    if (status == TIER_OK) {
      stored.push_back({object, base + i});
    } else {
      EXPECT_EQ(status, TIER_RESOURCE_EXHAUSTED) << "offload " << i;
      ++*refused;
    }
  }
  return stored;
}

void RoundTripThroughNvme(const std::string& io) {
  TierdProcess tierd(SpillFlags(io));
  Session session(tierd.SessionOptions("spill-test"));
  // All offloads submitted at once: three times what the host pool holds. Those that find it full
  // wait in tierd for the spiller to make room (backpressure), none fails.
  HostBuffer source = session.AllocHost(kObjects * kMiB);
  HostBuffer buffer = session.AllocHost(kMiB);
  std::vector<tier_object_id> objects(kObjects);
  std::vector<tier_job_id> jobs(kObjects);
  for (int i = 0; i < kObjects; ++i) {
    char* chunk = static_cast<char*>(source.data) + i * kMiB;
    Fill(chunk, kMiB, 1000 + i);
    std::tie(objects[i], jobs[i]) = session.Offload(source.id, i * kMiB, kMiB);
  }
  for (int i = 0; i < kObjects; ++i) ASSERT_EQ(session.TryWait(jobs[i], 60000), TIER_OK) << i;
  v1::GetStatusResponse status = tierd.Status();
  ASSERT_EQ(status.tiers_size(), 2);
  EXPECT_EQ(status.tiers(1).name(), "nvme");
  EXPECT_GT(status.tiers(1).used_bytes(), 0u);
  EXPECT_GT(status.bytes_spilled(), 0u);
  EXPECT_LE(status.tiers(0).used_bytes(), 16 * kMiB);
  EXPECT_EQ(status.spill_io(), io == "thread_pool" ? "thread_pool" : status.spill_io());
  ASSERT_NO_FATAL_FAILURE(ReloadAllInReverse(session, buffer, objects, 1000));
  v1::GetStatusResponse after = tierd.Status();
  EXPECT_GT(after.bytes_fetched(), 0u);
  // Reloads freed host memory, so the spilled objects reloaded next were prefetched, and some
  // reloads found theirs already back.
  EXPECT_GT(after.prefetches(), 0u);
  EXPECT_GT(after.prefetch_hits(), 0u);
  EXPECT_LE(after.prefetch_hits() + after.prefetch_misses(), static_cast<uint64_t>(kObjects));
  EXPECT_LE(after.prefetch_hits(), after.prefetches());
  EXPECT_EQ(after.checksum_failures(), 0u);
  EXPECT_TRUE(tierd.WaitForStatus([](const v1::GetStatusResponse& s) {
    return s.tiers(0).used_bytes() == 0 && s.tiers(1).used_bytes() == 0;
  })) << "extents or records leaked";
}

TEST(Spill, MoreThanTheHostPoolComesBackInReverseOrder) { RoundTripThroughNvme("auto"); }

TEST(Spill, ThreadPoolFallbackPassesTheSameRoundTrip) { RoundTripThroughNvme("thread_pool"); }

// One spill directory per NVMe device: records spread over the files (the one with the most free
// space takes the next), each file is reported on its own (status API and `tierctl spill`), and
// everything comes back.
TEST(Spill, SeveralSpillDirectoriesShareTheTier) {
  storage::testing::TempDir root;
  const std::string dirs[2] = {root.path() + "/nvme0", root.path() + "/nvme1"};
  std::vector<std::string> flags = SpillFlags("auto");
  flags.push_back("--spill_dir=" + dirs[0] + "," + dirs[1]);
  // No prefetch: a prefetch frees the record it read back, from either file, and under load one
  // ran between the spills and left the files two records apart (scripts/flake-hunt, 1 in 20).
  flags.push_back("--spill_prefetch=0");
  TierdProcess tierd(flags);
  Session session(tierd.SessionOptions("spill-test"));
  HostBuffer buffer = session.AllocHost(kMiB);
  std::vector<tier_object_id> objects = OffloadOneByOne(session, buffer, 9000);
  ASSERT_EQ(objects.size(), static_cast<size_t>(kObjects));
  // Settled: at or below the high mark (50% of 16 MiB) and no write in flight (each object is
  // either in the pool or a finished record).
  ASSERT_TRUE(tierd.WaitForStatus([](const v1::GetStatusResponse& s) {
    return s.tiers(0).used_bytes() <= 8 * kMiB &&
           s.tiers(0).objects() + s.tiers(1).objects() == static_cast<uint64_t>(kObjects);
  })) << tierd.Status().DebugString();
  v1::GetStatusResponse status = tierd.Status();
  ASSERT_EQ(status.spill_files_size(), 2);
  uint64_t used = 0, records = 0;
  for (int i = 0; i < 2; ++i) {
    const v1::SpillFileStatus& file = status.spill_files(i);
    EXPECT_EQ(file.directory(), dirs[i]);
    EXPECT_EQ(file.path(), dirs[i] + "/tierd.spill");
    EXPECT_EQ(::access(file.path().c_str(), F_OK), 0) << file.path();
    EXPECT_EQ(file.capacity_bytes(), 256 * kMiB);
    // Both devices took a share (the fuller file never gets the next record while the other has
    // more room: at most one record apart).
    EXPECT_GE(file.records(), 10u) << file.directory();
    used += file.used_bytes();
    records += file.records();
  }
  EXPECT_LE(status.spill_files(0).records(), status.spill_files(1).records() + 1);
  EXPECT_LE(status.spill_files(1).records(), status.spill_files(0).records() + 1);
  EXPECT_EQ(used, status.tiers(1).used_bytes());
  EXPECT_EQ(records, status.tiers(1).objects());
  EXPECT_EQ(status.tiers(1).capacity_bytes(), 512 * kMiB);
  // The default quota is everything the daemon holds: the pool and every spill file.
  v1::ListSessionsResponse sessions = tierd.Sessions();
  ASSERT_EQ(sessions.sessions_size(), 1);
  EXPECT_EQ(sessions.sessions(0).quota_bytes(), 16 * kMiB + 512 * kMiB);

  auto [code, out] = testing::RunCommand(std::string(TIERCTL_BIN) + " --socket " +
                                         tierd.socket() + " spill");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("\n" + dirs[0] + "  "), std::string::npos) << out;
  EXPECT_NE(out.find("\n" + dirs[1] + "  "), std::string::npos) << out;

  ASSERT_NO_FATAL_FAILURE(ReloadAllInReverse(session, buffer, objects, 9000));
  EXPECT_TRUE(tierd.WaitForStatus([](const v1::GetStatusResponse& s) {
    return s.tiers(0).used_bytes() == 0 && s.spill_files(0).used_bytes() == 0 &&
           s.spill_files(1).used_bytes() == 0;
  })) << "extents or records leaked";
}

// A tierd killed with SIGKILL still holds its spill file for a moment after it was reaped: the
// kernel tears its io_uring down asynchronously, and the ring's reference to the file keeps the
// file's flock. A tierd started at once (systemd's Restart=, a test) waits for it, bounded and
// logged, instead of exiting with "in use by another process". 50 restarts in a row, each right
// after the SIGKILL of the last, each after spill I/O in flight.
TEST(Spill, RestartsRightAfterASigkill) {
  storage::testing::TempDir spill;
  std::vector<std::string> flags = {"--pool_bytes=16M", "--spill_bytes=64M",
                                    "--spill_high_pct=50", "--spill_low_pct=25",
                                    "--spill_dir=" + spill.path(), "--log_level=info"};
  testing::TierdOptions options;
  options.capture_log = true;
  int waited = 0;
  for (int i = 0; i < 50; ++i) {
    std::unique_ptr<TierdProcess> tierd;
    try {
      tierd = std::make_unique<TierdProcess>(flags, options);
    } catch (const std::exception& error) {
      FAIL() << "start " << i << " after a SIGKILL: " << error.what();
    }
    {
      // Spill writes in flight when it dies: 12 MiB into a 16 MiB pool past its 50% mark.
      Session session(tierd->SessionOptions("spill-test"));
      HostBuffer buffer = session.AllocHost(4 * kMiB);
      for (int j = 0; j < 3; ++j) {
        session.Wait(session.Offload(buffer.id, 0, 4 * kMiB).second, 30000);
      }
      tierd->Kill();
    }
    if (tierd->Log().find("waiting for it") != std::string::npos) ++waited;
  }
  // (How often a start had to wait: 0 is possible on an idle machine; the starts all succeeded.)
  std::printf("%d of 50 starts waited for the killed tierd's spill file\n", waited);
}

// Both tiers full: an offload fails at once with RESOURCE_EXHAUSTED, nothing hangs, and what was
// stored comes back.
TEST(Spill, BothTiersFullFailsAtOnce) {
  TierdProcess tierd({"--pool_bytes=16M", "--spill_bytes=8M", "--spill_high_pct=50",
                      "--spill_low_pct=25"});
  Session session(tierd.SessionOptions("spill-test"));
  HostBuffer buffer = session.AllocHost(kMiB);
  int refused = 0;
  std::vector<std::pair<tier_object_id, uint32_t>> stored =
      OffloadUntilFull(session, buffer, 40, 500, &refused);
  EXPECT_GT(refused, 0);
  EXPECT_GE(stored.size(), 20u);  // 16 MiB host + 8 MiB NVMe, less what is in flight
  for (auto it = stored.rbegin(); it != stored.rend(); ++it) {  // newest (in host memory) first
    auto [object, seed] = *it;
    std::memset(buffer.data, 0, kMiB);
    ASSERT_EQ(RetryWhileFull(session, [&] { return session.Reload(object, buffer.id, 0, kMiB, true); }),
              TIER_OK);
    EXPECT_TRUE(Matches(buffer.data, kMiB, seed));
  }
}

TEST(Spill, CorruptRecordFailsWithDataLossAndNothingElse) {
  TierdProcess tierd(SpillFlags("auto"));
  Session session(tierd.SessionOptions("spill-test"));
  HostBuffer buffer = session.AllocHost(kMiB);
  std::vector<tier_object_id> objects = OffloadOneByOne(session, buffer, 7000);
  ASSERT_EQ(objects.size(), static_cast<size_t>(kObjects));
  // Damage the start of the spill file, where the first records went.
  std::string path = tierd.dir() + "/state/spill/tierd.spill";
  int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << path;
  std::vector<char> junk(4 * kMiB, static_cast<char>(0xA5));
  ASSERT_EQ(::pwrite(fd, junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
  ::fsync(fd);
  ::close(fd);
  int lost = 0;
  for (int i = kObjects - 1; i >= 0; --i) {
    std::memset(buffer.data, 0, kMiB);
    tier_status status = RetryWhileFull(
        session, [&] { return session.Reload(objects[i], buffer.id, 0, kMiB, false); });
    if (status == TIER_DATA_LOSS) {
      ++lost;
      continue;
    }
    ASSERT_EQ(status, TIER_OK) << "reload " << i;
    EXPECT_TRUE(Matches(buffer.data, kMiB, 7000 + i)) << "object " << i;
  }
  EXPECT_GT(lost, 0) << "no reload noticed the damage";
  EXPECT_GE(tierd.Status().checksum_failures(), static_cast<uint64_t>(lost));
  // The daemon keeps serving.
  Fill(buffer.data, kMiB, 99);
  ASSERT_EQ(RetryWhileFull(session,
                           [&] {
                             auto [object, job] = session.Offload(buffer.id, 0, kMiB);
                             objects[0] = object;
                             return job;
                           }),
            TIER_OK);
}

class SpillFaults : public ::testing::TestWithParam<std::string> {
 protected:
  std::vector<std::string> Flags(const std::string& faults) {
    std::vector<std::string> flags = SpillFlags(GetParam());
    flags.push_back("--spill_inject_faults=" + faults);
    return flags;
  }
};

// Every spill write fails: objects stay in host memory, offloads past the pool fail at once with
// RESOURCE_EXHAUSTED (none hangs), and everything stored comes back.
TEST_P(SpillFaults, EveryWriteFailingKeepsDataInMemory) {
  TierdProcess tierd(Flags("write:eio:0:-1"));
  Session session(tierd.SessionOptions("spill-test"));
  HostBuffer buffer = session.AllocHost(kMiB);
  int refused = 0;
  std::vector<std::pair<tier_object_id, uint32_t>> stored =
      OffloadUntilFull(session, buffer, 24, 300, &refused);
  EXPECT_GT(refused, 0);
  EXPECT_EQ(stored.size(), 16u);  // what the host pool holds
  v1::GetStatusResponse status = tierd.Status();
  EXPECT_GT(status.spill_write_errors(), 0u);
  EXPECT_EQ(status.tiers(1).used_bytes(), 0u);  // no failed write left a record behind
  EXPECT_EQ(status.bytes_spilled(), 0u);
  for (auto [object, seed] : stored) {
    std::memset(buffer.data, 0, kMiB);
    ASSERT_EQ(session.TryWait(session.Reload(object, buffer.id, 0, kMiB, true), 30000), TIER_OK);
    EXPECT_TRUE(Matches(buffer.data, kMiB, seed)) << seed;
  }
}

// Writes that fail now and then (ENOSPC once, a short write once): the objects they carried stay
// in host memory, others go instead, and every byte comes back.
TEST_P(SpillFaults, OccasionalWriteFaultsLoseNothing) {
  // (Rules count I/O requests, 8 per record here: these hit the 1st and the 3rd record written.)
  TierdProcess tierd(Flags("write:enospc:2:1,write:short:21:1"));
  Session session(tierd.SessionOptions("spill-test"));
  HostBuffer buffer = session.AllocHost(kMiB);
  std::vector<tier_object_id> objects = OffloadOneByOne(session, buffer, 4000);
  ASSERT_EQ(objects.size(), static_cast<size_t>(kObjects));
  EXPECT_EQ(tierd.Status().spill_write_errors(), 2u);
  ASSERT_NO_FATAL_FAILURE(ReloadAllInReverse(session, buffer, objects, 4000));
  EXPECT_TRUE(tierd.WaitForStatus([](const v1::GetStatusResponse& s) {
    return s.tiers(0).used_bytes() == 0 && s.tiers(1).used_bytes() == 0;
  })) << "extents or records leaked";
}

// Reads that fail (EIO, a short read) or deliver a flipped bit: the read they hit fails (a
// reload with DATA_LOSS, never with wrong bytes), the record stays, and reading again succeeds.
// Prefetches may meet the faults first; either way each fault fires once and nothing is lost.
TEST_P(SpillFaults, ReadFaultsFailOnlyThatReadAndARetrySucceeds) {
  // (Rules count I/O requests, 8 per record here: these hit the 1st, 3rd and 6th record read.)
  TierdProcess tierd(Flags("read:eio:1:1,read:short:20:1,read:corrupt:43:1"));
  Session session(tierd.SessionOptions("spill-test"));
  HostBuffer buffer = session.AllocHost(kMiB);
  std::vector<tier_object_id> objects = OffloadOneByOne(session, buffer, 6000);
  ASSERT_EQ(objects.size(), static_cast<size_t>(kObjects));
  int failed_reloads = 0;
  for (int i = kObjects - 1; i >= 0; --i) {
    tier_status status = TIER_DATA_LOSS;
    for (int attempt = 0; attempt < 4 && status == TIER_DATA_LOSS; ++attempt) {
      std::memset(buffer.data, 0, kMiB);
      status = RetryWhileFull(
          session, [&] { return session.Reload(objects[i], buffer.id, 0, kMiB, false); });
      if (status == TIER_DATA_LOSS) ++failed_reloads;
    }
    ASSERT_EQ(status, TIER_OK) << "reload " << i;
    EXPECT_TRUE(Matches(buffer.data, kMiB, 6000 + i)) << "object " << i << " came back different";
    ASSERT_EQ(session.TryWait(session.Free(objects[i]), 30000), TIER_OK);
  }
  v1::GetStatusResponse status = tierd.Status();
  EXPECT_EQ(status.spill_read_errors(), 2u);
  EXPECT_EQ(status.checksum_failures(), 1u);
  EXPECT_LE(failed_reloads, 3);
  EXPECT_TRUE(tierd.WaitForStatus([](const v1::GetStatusResponse& s) {
    return s.tiers(0).used_bytes() == 0 && s.tiers(1).used_bytes() == 0;
  })) << "extents or records leaked";
}

INSTANTIATE_TEST_SUITE_P(IoBackends, SpillFaults, ::testing::Values("auto", "thread_pool"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace tier
