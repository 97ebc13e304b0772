// Persistent objects shared fairly (tests/integration/hostile_persistent_fixture.h): objects
// waiting for the journal, many objects, deletes and many names of one uid never block or slow
// another uid's jobs; default quotas leave room for others; a released reservation keeps no name.
#include "integration/hostile_persistent_fixture.h"

namespace tier::hostile_persistent_testing {
namespace {

TEST_F(HostileClientPersistent, ObjectsWaitingForTheJournalDoNotBlockAnotherUidsOffload) {
  Start({"--pool_bytes=128M", "--spill_bytes=1G"});
  AsUid attacker(kTestUidA, &PersistManyThenAwaitDurable, {socket(), "16000", "4096", "a/"});
  const std::string persisted = attacker.ReadLine(120000);
  ASSERT_NE(persisted.find("persisted=16000"), std::string::npos) << persisted;
  // At once, while the journal works through them: 3 x 32 MiB more than the pool has room for.
  std::vector<std::string> lines;
  // One object larger than what the pool has left: only spilling the attacker's makes room.
  AsUid witness(kTestUidB, &OffloadMoreThanThePoolHolds, {socket(), "1", "96"});
  EXPECT_EQ(Finish(witness, 120000, &lines), "exited 0");
  EXPECT_EQ(Said(lines, "offload"), "OK");
  std::vector<std::string> attacker_lines = {persisted};
  EXPECT_EQ(Finish(attacker, 120000, &attacker_lines), "exited 0");
}

// args: socket. One 1 MiB object, then how long until it is durable.
int PersistOneAndTimeDurability(UidChannel& c) {
  Session s = Connect(c, "witness");
  const Clock::time_point start = Clock::now();
  tier_status refusal = TIER_OK;
  if (PersistMany(s, "ckpt/w", 1, 1 << 20, &refusal) != 1) {
    c.Say(absl::StrCat("persist=", tier_status_name(refusal)));
    return 1;
  }
  const double durable = AwaitDurable(s, "ckpt/w0", 60000);
  c.Say(absl::StrCat("durable_ms=", durable < 0 ? -1 : static_cast<int>(MsSince(start))));
  return durable < 0 ? 1 : 0;
}

// Finding 6: the manifest was rewritten whole, with 3 fsyncs, per add and remove: 20k small
// objects took 105 s to become durable, and another uid's 1 MiB checkpoint waited 97.7 s behind
// them. Now appends are synced in batches, round robin over uids.
TEST_F(HostileClientPersistent, ManyObjectsBecomeDurableFastAndAnotherUidsWaitsForNone) {
  Start({"--pool_bytes=128M", "--spill_bytes=1G"});
  AsUid attacker(kTestUidA, &PersistManyThenAwaitDurable, {socket(), "16000", "4096", "a/"});
  const std::string persisted = attacker.ReadLine(120000);
  ASSERT_NE(persisted.find("persisted=16000"), std::string::npos) << persisted;
  std::vector<std::string> lines;
  AsUid witness(kTestUidB, &PersistOneAndTimeDurability, {socket()});
  EXPECT_EQ(Finish(witness, 120000, &lines), "exited 0");
  const double witness_ms = SaidNumber(lines, "durable_ms");
  std::vector<std::string> attacker_lines = {persisted};
  EXPECT_EQ(Finish(attacker, 120000, &attacker_lines), "exited 0");
  const double all_ms = SaidNumber(attacker_lines, "all_durable_ms");
  std::printf("[ figures ] finding 6: 16000 x 4 KiB durable in %.0f ms; another uid's 1 MiB "
              "durable in %.0f ms\n", all_ms, witness_ms);
  EXPECT_GE(witness_ms, 0);
  EXPECT_LT(witness_ms, 10000);
  EXPECT_GE(all_ms, 0);
  EXPECT_LT(all_ms, 30000);
}

// args: socket, len. Persists objects of len until refused; says how many bytes it holds.
int FillPersistentQuota(UidChannel& c) {
  Session s = Connect(c);
  tier_status refusal = TIER_OK;
  const uint64_t len = ArgU64(c, 1);
  const int done = PersistMany(s, "fill/", 1000, len, &refusal);
  c.Say(absl::StrCat("held=", done * len, " refusal=", tier_status_name(refusal)));
  return refusal == TIER_RESOURCE_EXHAUSTED ? 0 : 1;
}

// Finding 2: the default persistent quota was every tier, per uid, and it outlives the session
// and restarts: one uid left 1.2 of 1.25 GiB and exited, and the next uid's offload failed. Now
// each uid gets a small share and every uid together a bounded one.
TEST_F(HostileClientPersistent, TheDefaultQuotasLeaveRoomForOtherUids) {
  Start({"--pool_bytes=64M", "--spill_bytes=256M"});  // 320 MiB in all
  std::vector<std::string> a_lines, c_lines, b_lines;
  AsUid a(kTestUidA, &FillPersistentQuota, {socket(), std::to_string(4 << 20)});
  EXPECT_EQ(Finish(a, 300000, &a_lines), "exited 0");
  AsUid c(kTestUidC, &FillPersistentQuota, {socket(), std::to_string(4 << 20)});
  EXPECT_EQ(Finish(c, 300000, &c_lines), "exited 0");
  // Both left; their objects stay. Another uid can still use most of the daemon.
  AsUid b(kTestUidB, &OffloadMoreThanThePoolHolds, {socket(), "5", "32"});  // 160 MiB
  EXPECT_EQ(Finish(b, 120000, &b_lines), "exited 0");
  EXPECT_EQ(Said(b_lines, "offload"), "OK");
  const double held = SaidNumber(a_lines, "held");
  EXPECT_LE(held, (320 << 20) / 16) << "a uid's default share is 1/16 of pool and NVMe";
}

// args: socket, seconds. Churns: persists and deletes an object, deletes a missing name.
int ChurnDeletes(UidChannel& c) {
  Session s = Connect(c);
  tier_status refusal = TIER_OK;
  // Many names first: the old journal rewrote a manifest of all of them per delete.
  if (PersistMany(s, "keep/", 3000, 4096, &refusal) != 3000) return 1;
  c.Say("churning");
  const Clock::time_point end = Clock::now() + std::chrono::seconds(ArgU64(c, 1));
  int deletes = 0;
  std::vector<double> ms;
  HostBuffer buffer = s.AllocHost(4096);
  while (Clock::now() < end) {
    if (PersistMany(s, buffer, "churn/", 1, 4096, &refusal) != 1) return 1;
    Clock::time_point start = Clock::now();
    tier_object_delete(s.get(), "churn/0", TIER_UID_SELF);
    tier_object_delete(s.get(), "no-such-name", TIER_UID_SELF);
    ms.push_back(MsSince(start));
    deletes += 2;
  }
  c.Say(absl::StrCat("deletes=", deletes, " own_delete_ms: ", Percentiles(ms)));
  return 0;
}

// args: socket, seconds. Times its own session-socket requests (stat, open of a missing name).
int TimeRequests(UidChannel& c) {
  Session s = Connect(c, "witness");
  const Clock::time_point end = Clock::now() + std::chrono::seconds(ArgU64(c, 1));
  std::vector<double> ms;
  while (Clock::now() < end) {
    Clock::time_point start = Clock::now();
    tier_object_info info{};
    info.struct_size = sizeof(info);
    (void)tier_object_stat(s.get(), "mine", &info);
    ms.push_back(MsSince(start));
  }
  std::sort(ms.begin(), ms.end());
  c.Say(absl::StrCat("p99_ms=", ms[ms.size() * 99 / 100], " max_ms=", ms.back(),
                     " requests: ", Percentiles(ms)));
  return 0;
}

// Findings 3 and N6: a delete took the journal's lock on the one session-listener thread (before
// looking the name up, and to rewrite the manifest): another uid's attach and stat stalled
// 334-608 ms. Now the listener only looks up and answers; a delete whose record must go is
// answered by the journal's writer once durable.
TEST_F(HostileClientPersistent, DeletesNeverStallAnotherUidsRequests) {
  Start({"--pool_bytes=128M", "--spill_bytes=1G"});
  AsUid attacker(kTestUidA, &ChurnDeletes, {socket(), "6"});
  ASSERT_EQ(attacker.ReadLine(120000), "churning");
  std::vector<std::string> lines, attacker_lines;
  AsUid witness(kTestUidB, &TimeRequests, {socket(), "4"});
  EXPECT_EQ(Finish(witness, 60000, &lines), "exited 0");
  EXPECT_EQ(Finish(attacker, 60000, &attacker_lines), "exited 0");
  const double p99 = SaidNumber(lines, "p99_ms"), max = SaidNumber(lines, "max_ms");
  std::printf("[ figures ] findings 3/N6: another uid's stat while one uid deletes: p99 %.2f ms, "
              "max %.2f ms\n", p99, max);
  EXPECT_GE(p99, 0);
  EXPECT_LT(p99, 20);
  EXPECT_LT(max, 200);
}

// args: socket, count. Reserves names (create) and gives the ids back (release) without ever
// offloading, in one session; then, in a second session, tries to create the same names.
int ReserveAndRelease(UidChannel& c) {
  const uint64_t count = ArgU64(c, 1);
  RawObjects first(c.args().at(0));
  const Clock::time_point start = Clock::now();
  for (uint64_t i = 0; i < count; ++i) {
    const std::string name = absl::StrCat("r/", i);
    absl::Status created = first.Request(wire::ObjectOp::kCreate, name, 1, 4096);
    if (!created.ok()) {
      c.Say(absl::StrCat("create=", absl::StatusCodeToString(created.code()), " at=", i));
      return 1;
    }
    if (!first.Request(wire::ObjectOp::kRelease, name, 1).ok()) return 1;
  }
  const double ms = MsSince(start);
  RawObjects second(c.args().at(0));
  uint64_t free = 0;
  for (uint64_t i = 0; i < 100; ++i) {
    if (second.Request(wire::ObjectOp::kCreate, absl::StrCat("r/", i), 1 + i, 4096).ok()) ++free;
  }
  c.Say(absl::StrCat("reserved_ms=", static_cast<int>(ms), " names_free_again=", free));
  return 0;
}

// Finding 4: create-then-release kept the name reserved until the session ended: 300k
// reservations in 11 s, daemon memory no limit counted (the 4096-binding bound bypassed). Now a
// released reservation goes at once, and names are bounded per uid and node anyway.
TEST_F(HostileClientPersistent, AReleasedReservationDoesNotKeepItsName) {
  Start({"--pool_bytes=64M", "--spill_bytes=64M"});
  std::vector<std::string> lines;
  AsUid attacker(kTestUidA, &ReserveAndRelease, {socket(), "20000"});
  EXPECT_EQ(Finish(attacker, 120000, &lines), "exited 0");
  EXPECT_EQ(Said(lines, "names_free_again"), "100");
  // The second session's 100 reservations go when tierd has seen it end (the exit above is the
  // process's; under load tierd's reaper comes a moment later).
  EXPECT_TRUE(tierd_->WaitForStatus([](const v1::GetStatusResponse& s) {
    return s.sessions() == 0 && s.persistent().objects() == 0;
  })) << tierd_->Status().ShortDebugString();
}

// args: socket, count, seconds, reservations. Reserves and gives back `reservations` names
// (finding 4 kept them all), holds `count` names, then churns fills and frees of its own
// persistent objects and whole sessions.
int ChurnAmongManyNames(UidChannel& c) {
  {
    RawObjects raw(c.args().at(0));
    for (uint64_t i = 0; i < ArgU64(c, 3); ++i) {
      const std::string name = absl::StrCat("r/", i);
      if (!raw.Request(wire::ObjectOp::kCreate, name, 1, 1).ok() ||
          !raw.Request(wire::ObjectOp::kRelease, name, 1).ok()) {
        return 1;
      }
    }
  }
  Session s = Connect(c);
  tier_status refusal = TIER_OK;
  const int held = PersistMany(s, "n/", static_cast<int>(ArgU64(c, 1)), 1, &refusal);
  c.Say(absl::StrCat("churning held=", held, " refusal=", tier_status_name(refusal)));
  const Clock::time_point end = Clock::now() + std::chrono::seconds(ArgU64(c, 2));
  HostBuffer buffer = s.AllocHost(4096);
  int rounds = 0;
  while (Clock::now() < end) {
    auto [object, job] = s.OffloadPersistent("churn", buffer.id, 0, 4096);
    s.Wait(job);
    s.Wait(s.Free(object));
    Session brief = Connect(c, "brief");  // its end sweeps its reservations
    ++rounds;
  }
  c.Say(absl::StrCat("rounds=", rounds));
  return 0;
}

// args: socket, seconds. Times 64 KiB round trips and the end of a session of its own.
int TimeJobsAndSessionEnds(UidChannel& c) {
  Session s = Connect(c, "witness");
  HostBuffer buffer = s.AllocHost(64 << 10);
  const Clock::time_point end = Clock::now() + std::chrono::seconds(ArgU64(c, 1));
  std::vector<double> jobs, closes;
  while (Clock::now() < end) {
    Clock::time_point start = Clock::now();
    auto [object, offload] = s.Offload(buffer.id, 0, 64 << 10);
    s.Wait(offload);
    s.Wait(s.Reload(object, buffer.id, 0, 64 << 10, /*free_after=*/true));
    jobs.push_back(MsSince(start));
    if (jobs.size() % 50 == 0) {
      auto brief = std::make_unique<Session>(OptionsOf(c, "brief"));
      Clock::time_point close = Clock::now();
      brief.reset();
      closes.push_back(MsSince(close));
    }
  }
  std::sort(jobs.begin(), jobs.end());
  std::sort(closes.begin(), closes.end());
  c.Say(absl::StrCat("job_p99_ms=", jobs[jobs.size() * 99 / 100],
                     " close_p99_ms=", closes.empty() ? -1 : closes[closes.size() * 99 / 100],
                     " jobs: ", Percentiles(jobs), "; session closes: ", Percentiles(closes)));
  return 0;
}

// Finding 5: every fill, free and session end scanned names under the store's one lock, on the
// engine's completion thread, the ring poller and the reaper: with many names of one uid,
// another uid's job p99 went from 0.4 to 244 ms. Now each is a hash lookup (and names are
// bounded per uid).
TEST_F(HostileClientPersistent, ManyNamesOfOneUidDoNotSlowAnotherUidsJobs) {
  Start({"--pool_bytes=128M", "--spill_bytes=1G"});
  // The attacker reserves (and gives back) 50k names, then holds nearly as many as it may
  // (16384 by default), one byte each.
  AsUid attacker(kTestUidA, &ChurnAmongManyNames, {socket(), "16000", "5", "50000"});
  const std::string churning = attacker.ReadLine(300000);
  ASSERT_NE(churning.find("churning"), std::string::npos) << churning;
  std::vector<std::string> lines, attacker_lines{churning};
  AsUid witness(kTestUidB, &TimeJobsAndSessionEnds, {socket(), "4"});
  EXPECT_EQ(Finish(witness, 60000, &lines), "exited 0");
  EXPECT_EQ(Finish(attacker, 60000, &attacker_lines), "exited 0");
  const double p99 = SaidNumber(lines, "job_p99_ms"), close = SaidNumber(lines, "close_p99_ms");
  std::printf("[ figures ] finding 5: another uid's 64 KiB round trip p99 %.2f ms, session close "
              "p99 %.2f ms, beside one uid's names churning\n", p99, close);
  // Loose: a witness that the other uid is served, not a benchmark (CI runs tests two at a time
  // beside other load; session closes also wait for gRPC and the reaper). At this scale the old
  // store's scans cost milliseconds, under this bound too: PersistentStoreTest
  // .OperationsDoNotScanNames is what fails on a store that scans.
  EXPECT_GE(p99, 0);
  EXPECT_LT(p99, 50);
  EXPECT_LT(close, 250);
}

}  // namespace
}  // namespace tier::hostile_persistent_testing
