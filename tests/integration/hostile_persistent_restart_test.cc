// Persistent objects across restarts and crashes (tests/integration/hostile_persistent_fixture.h):
// a restore brings back more than the pool holds; what no tier holds after a restart stays listed,
// charged and deletable; a freed object never comes back; the journal is bounded; tiny objects
// cannot take the pool nor slow the stop.
#include "integration/hostile_persistent_fixture.h"

namespace tier::hostile_persistent_testing {
namespace {

// args: socket, seed, count, len. Persists `count` objects of pattern seed+i, until durable.
int PersistPatterns(UidChannel& c) {
  Session s = Connect(c);
  const uint32_t seed = static_cast<uint32_t>(ArgU64(c, 1));
  const int count = static_cast<int>(ArgU64(c, 2));
  const uint64_t len = ArgU64(c, 3);
  HostBuffer buffer = s.AllocHost(len);
  for (int i = 0; i < count; ++i) {
    Pattern(buffer.data, len, seed + i);
    auto [object, job] = s.OffloadPersistent(absl::StrCat("ckpt/", i), buffer.id, 0, len);
    s.Wait(job);
    s.Release(object);
  }
  for (int i = 0; i < count; ++i) {
    if (AwaitDurable(s, absl::StrCat("ckpt/", i), 60000) < 0) return 1;
  }
  c.Say("durable");
  return 0;
}

// args: socket, seed, count, len. Reloads them and says how many came back whole.
int CheckPatterns(UidChannel& c) {
  Session s = Connect(c);
  const uint32_t seed = static_cast<uint32_t>(ArgU64(c, 1));
  const int count = static_cast<int>(ArgU64(c, 2));
  const uint64_t len = ArgU64(c, 3);
  HostBuffer buffer = s.AllocHost(len);
  int whole = 0;
  std::string missing;
  for (int i = 0; i < count; ++i) {
    tier_object_id object = 0;
    uint64_t found = 0;
    tier_status status = tier_object_open(s.get(), absl::StrCat("ckpt/", i).c_str(), &object, &found);
    tier_job_id job = 0;
    if (status == TIER_OK && found == len) {
      std::memset(buffer.data, 0, len);
      status = tier_reload(s.get(), object, buffer.id, 0, len, nullptr, &job);
      if (status == TIER_OK) status = tier_job_wait(s.get(), job, 30000);
      if (status == TIER_OK && HasPattern(buffer.data, len, seed + i)) ++whole;
    }
    if (status != TIER_OK) absl::StrAppend(&missing, " ", i, ":", tier_status_name(status));
  }
  c.Say(absl::StrCat("whole=", whole, missing.empty() ? "" : " missing:", missing));
  return 0;
}

// Finding 7: after a restart only what fit in the host pool came back (2 of 12); the rest stayed
// on disk, invisible, undeletable and uncharged. Now restore admits each object through the tiers
// like an offload: the spiller makes room on NVMe.
TEST_F(HostileClientPersistent, RestoreBringsBackMoreThanThePoolHolds) {
  const std::vector<std::string> flags = {"--pool_bytes=32M", "--spill_bytes=512M"};
  Start(flags);
  const std::string len = std::to_string(8 << 20);
  const uid_t uids[] = {kTestUidA, kTestUidB, kTestUidC};
  for (int u = 0; u < 3; ++u) {
    std::vector<std::string> lines;
    AsUid writer(uids[u], &PersistPatterns, {socket(), std::to_string(100 * u), "4", len});
    ASSERT_EQ(Finish(writer, 120000, &lines), "exited 0");  // 96 MiB in all, 3x the pool
  }
  Kill();
  const Clock::time_point start = Clock::now();
  Start(flags);
  std::printf("[ figures ] finding 7: restart with 96 MiB of persistent objects in a 32 MiB pool: "
              "%.0f ms\n", MsSince(start));
  EXPECT_EQ(ListObjects().objects_size(), 12);
  for (int u = 0; u < 3; ++u) {
    std::vector<std::string> lines;
    AsUid reader(uids[u], &CheckPatterns, {socket(), std::to_string(100 * u), "4", len});
    EXPECT_EQ(Finish(reader, 120000, &lines), "exited 0");
    EXPECT_EQ(Said(lines, "whole"), "4") << "uid " << uids[u];
  }
}

// args: socket. Opens, then deletes, each of ckpt/0 and ckpt/1; says what each answered.
int OpenThenDelete(UidChannel& c) {
  Session s = Connect(c);
  std::string said;
  for (int i = 0; i < 2; ++i) {
    tier_object_id object = 0;
    uint64_t len = 0;
    const std::string name = absl::StrCat("ckpt/", i);
    tier_status open = tier_object_open(s.get(), name.c_str(), &object, &len);
    tier_status deleted = tier_object_delete(s.get(), name.c_str(), TIER_UID_SELF);
    absl::StrAppend(&said, " open", i, "=", tier_status_name(open), " delete", i, "=",
                    tier_status_name(deleted));
  }
  c.Say(said.substr(1));
  return 0;
}

// Finding 7, the rest of it: what no tier has room for at a restart (the pool and the NVMe tier
// shrank) stays on NVMe in the journal: listed, charged, deletable, never silently gone.
TEST_F(HostileClientPersistent, WhatNoTierCanHoldAfterARestartStaysListedChargedAndDeletable) {
  Start({"--pool_bytes=32M", "--spill_bytes=512M"});
  const std::string len = std::to_string(12 << 20);
  std::vector<std::string> lines;
  AsUid writer(kTestUidA, &PersistPatterns, {socket(), "7", "2", len});
  ASSERT_EQ(Finish(writer, 120000, &lines), "exited 0");
  Kill();
  Start({"--pool_bytes=8M", "--spill_bytes=4M"});  // room for neither 12 MiB object
  v1::ListObjectsResponse listed = ListObjects();
  ASSERT_EQ(listed.objects_size(), 2);
  for (const v1::ObjectInfo& o : listed.objects()) {
    EXPECT_EQ(o.tier(), "journal") << o.name();
    EXPECT_TRUE(o.durable()) << o.name();
  }
  EXPECT_EQ(tierd_->Status().persistent().bytes(), 2u * (12 << 20));  // charged
  lines.clear();
  AsUid owner(kTestUidA, &OpenThenDelete, {socket()});
  EXPECT_EQ(Finish(owner, 60000, &lines), "exited 0");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "open0=UNAVAILABLE delete0=OK open1=UNAVAILABLE delete1=OK");
  EXPECT_EQ(ListObjects().objects_size(), 0);
  EXPECT_EQ(tierd_->Status().persistent().bytes(), 0u);
  // Deleted for good: not back once there is room again.
  Kill();
  Start({"--pool_bytes=32M", "--spill_bytes=512M"});
  EXPECT_EQ(ListObjects().objects_size(), 0);
}

// args: socket. Two durable objects, then 2000 more to keep the journal busy, then frees the
// first with a free job and the second with a reload that frees it; says "freed".
int FreeBehindABusyJournal(UidChannel& c) {
  Session s = Connect(c);
  HostBuffer buffer = s.AllocHost(1 << 20);
  auto [freed, job1] = s.OffloadPersistent("t/free", buffer.id, 0, 1 << 20);
  auto [reloaded, job2] = s.OffloadPersistent("t/free-after", buffer.id, 0, 1 << 20);
  s.Wait(job1);
  s.Wait(job2);
  if (AwaitDurable(s, "t/free-after", 60000) < 0) return 1;
  tier_status refusal = TIER_OK;
  if (PersistMany(s, "filler/", 2000, 4096, &refusal) != 2000) return 1;
  s.Wait(s.Free(freed));
  s.Wait(s.Reload(reloaded, buffer.id, 0, 1 << 20, /*free_after=*/true));
  c.Say("freed");
  c.Hear(60000);  // (alive until the test killed tierd)
  return 0;
}

// args: socket. Says what opening each of the two freed objects answers.
int OpenFreed(UidChannel& c) {
  Session s = Connect(c);
  std::string said;
  for (const char* name : {"t/free", "t/free-after"}) {
    tier_object_id object = 0;
    uint64_t len = 0;
    absl::StrAppend(&said, name, "=", tier_status_name(tier_object_open(s.get(), name, &object, &len)),
                    " ");
  }
  c.Say(said);
  return 0;
}

// Finding 14: a free job (tier_free, or a reload with FREE_AFTER) of a persistent object only
// queued its journal removal: a crash before it brought the object back, quota and all. Now the
// job completes once its end is durable.
TEST_F(HostileClientPersistent, AFreedObjectNeverComesBackAfterACrash) {
  Start({"--pool_bytes=128M", "--spill_bytes=1G"});
  AsUid owner(kTestUidA, &FreeBehindABusyJournal, {socket()});
  ASSERT_EQ(owner.ReadLine(120000), "freed");
  Kill();  // the moment the frees completed
  Start({"--pool_bytes=128M", "--spill_bytes=1G"});
  std::vector<std::string> lines;
  AsUid again(kTestUidA, &OpenFreed, {socket()});
  EXPECT_EQ(Finish(again, 60000, &lines), "exited 0");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "t/free=NOT_FOUND t/free-after=NOT_FOUND ");
}

// args: socket, rounds, len. Persists and deletes an object of len, `rounds` times.
int ChurnBigObjects(UidChannel& c) {
  Session s = Connect(c);
  HostBuffer buffer = s.AllocHost(ArgU64(c, 2));
  for (uint64_t i = 0; i < ArgU64(c, 1); ++i) {
    auto [object, job] = s.OffloadPersistent("big", buffer.id, 0, ArgU64(c, 2));
    s.Wait(job);
    s.Release(object);
    if (AwaitDurable(s, "big", 60000) < 0) return 1;
    s.Delete("big");
  }
  return 0;
}

// Finding 16: the journal's disk was bounded by nothing (2.2 GB beside a 1 GiB spill file) and
// shown nowhere. Now it is bounded by persistent_journal_max_bytes, compacted, and in status.
TEST_F(HostileClientPersistent, TheJournalIsBoundedAndShownInStatus) {
  Start({"--pool_bytes=64M", "--spill_bytes=256M"});  // node share 80 MiB: journal <= 224 MiB
  std::vector<std::string> lines;
  AsUid churn(kTestUidA, &ChurnBigObjects, {socket(), "40", std::to_string(16 << 20)});
  EXPECT_EQ(Finish(churn, 300000, &lines), "exited 0");  // 640 MiB written in all
  const v1::PersistentStatus p = tierd_->Status().persistent();
  EXPECT_TRUE(p.journaled());
  EXPECT_GT(p.journal_max_bytes(), 0u);
  EXPECT_LE(p.journal_bytes(), p.journal_max_bytes());
  EXPECT_GE(p.journal_compactions(), 1u);
  EXPECT_EQ(p.journal_errors(), 0u);
  uint64_t on_disk = 0;
  for (const auto& entry : std::filesystem::directory_iterator(spill_ + "/persistent")) {
    on_disk += entry.file_size();
  }
  std::printf("[ figures ] finding 16: journal %llu bytes on disk after 640 MiB of churn (max "
              "%llu)\n", static_cast<unsigned long long>(on_disk),
              static_cast<unsigned long long>(p.journal_max_bytes()));
  EXPECT_LE(on_disk, p.journal_max_bytes());
}

// args: socket, seconds. Persists one-byte objects as fast as it can.
int PersistTinyObjects(UidChannel& c) {
  Session s = Connect(c);
  tier_status refusal = TIER_OK;
  const int done = PersistMany(s, "tiny/", 1 << 30, 1, &refusal,
                               Clock::now() + std::chrono::seconds(ArgU64(c, 1)));
  c.Say(absl::StrCat("tiny=", done, " refusal=", tier_status_name(refusal)));
  return 0;
}

// N5: one session made 30,208 one-byte persistent objects in 20 s, 4 KiB charged each: 107 MiB of
// a 256 MiB pool, all back after a restart; another session's offloads then failed, and SIGTERM
// took 13.5 s. Now the uid's share and its count of names bound it, and the stop is quick.
TEST_F(HostileClientPersistent, TinyObjectsCannotTakeThePoolNorSlowTheStop) {
  Start({"--pool_bytes=256M", "--spill_bytes=64M"});
  std::vector<std::string> lines, b_lines;
  AsUid attacker(kTestUidA, &PersistTinyObjects, {socket(), "10"});
  EXPECT_EQ(Finish(attacker, 60000, &lines), "exited 0");
  const double tiny = SaidNumber(lines, "tiny");
  EXPECT_LE(tiny * 4096, (320 << 20) / 16 + 4096) << "bounded by the uid's share";
  AsUid witness(kTestUidB, &OffloadMoreThanThePoolHolds, {socket(), "7", "32"});  // 224 MiB
  EXPECT_EQ(Finish(witness, 120000, &b_lines), "exited 0");
  EXPECT_EQ(Said(b_lines, "offload"), "OK");
  const Clock::time_point stop = Clock::now();
  EXPECT_EQ(tierd_->StopWithin(20000), 0);
  const double stop_ms = MsSince(stop);
  tierd_.reset();
  std::printf("[ figures ] N5: %.0f tiny objects in 10 s; SIGTERM took %.0f ms\n", tiny, stop_ms);
  EXPECT_LT(stop_ms, 5000);
}

}  // namespace
}  // namespace tier::hostile_persistent_testing
