// Issue 30, "one local user can hurt the others", persistent objects: each scenario runs the
// attacker and the witness as two unprivileged uids (as_uid.h) against a real tierd with an NVMe
// tier, and fails while its finding stands. Needs root (CI runs it as root); skips otherwise.
// The timings the findings quote are printed as "[ figures ]" lines.
//
// Run the same tests against another tierd binary (TIERD_BIN=...) to see the findings before
// the fix.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "as_uid.h"
#include "client/control_client.h"
#include "client/session_channel.h"
#include "gtest/gtest.h"
#include "tier/client.hpp"
#include "tier/session_wire.h"
#include "tierd_process.h"

namespace tier {
namespace {

using testing::AsUid;
using testing::kTestUidA;
using testing::kTestUidB;
using testing::TierdProcess;
using testing::UidChannel;
using testing::UidExit;
using Clock = std::chrono::steady_clock;

constexpr uid_t kTestUidC = 61003;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

uint64_t ArgU64(const UidChannel& c, size_t i) {
  uint64_t value = 0;
  return absl::SimpleAtoi(c.args().at(i), &value) ? value : 0;
}

// ---- in the children (as a test uid) -----------------------------------------------------------

Session::Options OptionsOf(const UidChannel& c, const char* name = "hostile") {
  Session::Options options;
  options.socket_path = c.args().at(0);
  options.name = name;
  return options;
}
Session Connect(const UidChannel& c, const char* name = "hostile") {
  return Session(OptionsOf(c, name));
}

void Pattern(void* data, uint64_t len, uint32_t seed) {
  auto* bytes = static_cast<uint8_t*>(data);
  for (uint64_t i = 0; i < len; ++i) bytes[i] = static_cast<uint8_t>(seed * 131 + i * 7 + (i >> 12));
}

bool HasPattern(const void* data, uint64_t len, uint32_t seed) {
  auto* bytes = static_cast<const uint8_t*>(data);
  for (uint64_t i = 0; i < len; ++i) {
    if (bytes[i] != static_cast<uint8_t>(seed * 131 + i * 7 + (i >> 12))) return false;
  }
  return true;
}

// Persists objects `prefix`0.. of `len` bytes until `count` are in, one is refused (*refusal:
// its status), or `deadline`. Waits in groups and gives the ids back (a session binds at most
// 4096). Returns how many went in.
int PersistMany(Session& s, const HostBuffer& buffer, const std::string& prefix, int count,
                uint64_t len, tier_status* refusal,
                Clock::time_point deadline = Clock::time_point::max()) {
  std::memset(buffer.data, 0x42, len);
  std::vector<std::pair<tier_object_id, tier_job_id>> pending;
  int done = 0;
  *refusal = TIER_OK;
  auto flush = [&] {
    for (auto [object, job] : pending) {
      tier_status status = tier_job_wait(s.get(), job, 60000);
      if (status == TIER_OK) {
        ++done;
      } else if (*refusal == TIER_OK) {
        *refusal = status;
      }
      tier_object_release(s.get(), object);
    }
    pending.clear();
  };
  for (int i = 0; i < count && *refusal == TIER_OK && Clock::now() < deadline; ++i) {
    tier_object_id object = 0;
    tier_job_id job = 0;
    tier_status status = tier_offload_persistent(s.get(), (prefix + std::to_string(i)).c_str(),
                                                  buffer.id, 0, len, nullptr, &object, &job);
    if (status != TIER_OK) {
      *refusal = status;
      break;
    }
    pending.emplace_back(object, job);
    if (pending.size() == 256) flush();
  }
  flush();
  return done;
}

int PersistMany(Session& s, const std::string& prefix, int count, uint64_t len,
                tier_status* refusal, Clock::time_point deadline = Clock::time_point::max()) {
  HostBuffer buffer = s.AllocHost(std::max<uint64_t>(len, 4096));
  const int done = PersistMany(s, buffer, prefix, count, len, refusal, deadline);
  s.Unregister(buffer.id);
  return done;
}

// Until `name` is durable (its Stat says so), or `timeout_ms`: ms waited, or -1.
double AwaitDurable(Session& s, const std::string& name, int timeout_ms) {
  const Clock::time_point start = Clock::now();
  while (MsSince(start) < timeout_ms) {
    tier_object_info info{};
    info.struct_size = sizeof(info);
    if (tier_object_stat(s.get(), name.c_str(), &info) == TIER_OK &&
        (info.flags & TIER_OBJECT_DURABLE)) {
      return MsSince(start);
    }
    ::usleep(1000);
  }
  return -1;
}

std::string Percentiles(std::vector<double> ms) {
  if (ms.empty()) return "none";
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) { return ms[std::min(ms.size() - 1, static_cast<size_t>(q * ms.size()))]; };
  char text[128];
  std::snprintf(text, sizeof(text), "%zu p50 %.2f p99 %.2f max %.2f", ms.size(), at(0.5), at(0.99),
                ms.back());
  return text;
}

// A session driven by hand on the session socket (object requests the C API does not expose).
struct RawObjects {
  explicit RawObjects(const std::string& socket) {
    client::ControlClient control(socket, 5000);
    v1::OpenSessionRequest request;
    request.set_name("raw-objects");
    absl::StatusOr<v1::OpenSessionResponse> opened = control.OpenSession(request, /*daemon_wait_ms=*/0);
    if (!opened.ok()) throw std::runtime_error(opened.status().ToString());
    absl::StatusOr<client::SessionChannel> connected =
        client::SessionChannel::Connect(opened->session_socket());
    if (!connected.ok()) throw std::runtime_error(connected.status().ToString());
    channel.emplace(*std::move(connected));
    absl::StatusOr<client::AttachResult> attached =
        channel->Attach(opened->session_id(), opened->attach_token());
    if (!attached.ok()) throw std::runtime_error(attached.status().ToString());
    result = *std::move(attached);
  }
  absl::Status Request(wire::ObjectOp op, const std::string& name, uint64_t id, uint64_t len = 0) {
    return channel->ObjectRequest(op, name, id, wire::kCallerUid, len).status();
  }
  std::optional<client::SessionChannel> channel;
  client::AttachResult result;
};

// ---- in the test (root) -------------------------------------------------------------------------

// A tierd with an NVMe tier that other uids may reach, restartable over the same files.
class HostileClientPersistent : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::CanRunAsOtherUids()) GTEST_SKIP() << "needs root: runs clients as other uids";
    char pattern[] = "/tmp/tier-hostile-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    spill_ = pattern;
  }
  void TearDown() override {
    tierd_.reset();
    if (!spill_.empty()) (void)!std::system(("rm -rf '" + spill_ + "'").c_str());
  }
  void Start(std::vector<std::string> flags, bool capture_log = false) {
    std::vector<std::string> all = {"--socket_mode=0666", "--spill_dir=" + spill_};
    all.insert(all.end(), flags.begin(), flags.end());
    tierd_ = std::make_unique<TierdProcess>(all, testing::TierdOptions{0, capture_log});
    ASSERT_EQ(::chmod(tierd_->dir().c_str(), 0755), 0);
  }
  // SIGKILL, then until the dead daemon's spill file is free (the kernel drops a killed
  // process's io_uring, and the files it holds, a moment after the process is reaped).
  void Kill() {
    tierd_->Kill();
    tierd_.reset();
    const std::string path = spill_ + "/tierd.spill";
    for (int i = 0; i < 3000; ++i) {
      int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return;
      const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
      ::close(fd);
      if (free) return;
      ::usleep(10000);
    }
  }
  const std::string& socket() const { return tierd_->socket(); }
  v1::ListObjectsResponse ListObjects() {
    v1::ListObjectsRequest request;
    std::ifstream in(tierd_->socket() + ".admin-token");
    std::string token;
    if (in >> token) request.set_admin_token(token);
    v1::ListObjectsResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    EXPECT_TRUE(tierd_->stub().ListObjects(&context, request, &response).ok());
    return response;
  }
  // Waits for a child's end; its exit as text ("exited 0") and everything it said.
  static std::string Finish(AsUid& child, int timeout_ms, std::vector<std::string>* lines) {
    std::string line;
    const Clock::time_point start = Clock::now();
    // (Until it ends: EOF. NextLine is false at EOF or once the time is up.)
    while (child.NextLine(&line, std::max(1, timeout_ms - static_cast<int>(MsSince(start))))) {
      lines->push_back(line);
    }
    for (std::string& l : *lines) std::printf("[ %s ]\n", l.c_str());
    return child.Wait(std::max(1, timeout_ms - static_cast<int>(MsSince(start)))).Describe();
  }

  std::string spill_;
  std::unique_ptr<TierdProcess> tierd_;
};

// The value of "key=value" in a child's lines ("" when absent).
std::string Said(const std::vector<std::string>& lines, const std::string& key) {
  for (const std::string& line : lines) {
    for (absl::string_view field : absl::StrSplit(line, ' ')) {
      if (absl::StartsWith(field, key + "=")) return std::string(field.substr(key.size() + 1));
    }
  }
  return "";
}
double SaidNumber(const std::vector<std::string>& lines, const std::string& key) {
  double value = -1;
  return absl::SimpleAtod(Said(lines, key), &value) ? value : -1;
}

// args: socket, count, len, prefix. Persists, then says how long until the last is durable.
int PersistManyThenAwaitDurable(UidChannel& c) {
  Session s = Connect(c);
  const int count = static_cast<int>(ArgU64(c, 1));
  const std::string prefix = c.args().at(3);
  const Clock::time_point start = Clock::now();
  tier_status refusal = TIER_OK;
  const int done = PersistMany(s, prefix, count, ArgU64(c, 2), &refusal);
  const double persisted_ms = MsSince(start);
  c.Say(absl::StrCat("persisted=", done, " persist_ms=", static_cast<int>(persisted_ms),
                     " refusal=", tier_status_name(refusal)));
  const double durable = AwaitDurable(s, prefix + std::to_string(count - 1), 60000);
  c.Say(absl::StrCat("all_durable_ms=", durable < 0 ? -1 : static_cast<int>(persisted_ms + durable)));
  return done == count ? 0 : 1;
}

// Finding 1: persistent objects stayed pinned until the journal's single writer had fsynced
// them, and pinned objects cannot be spilled: another uid's offload failed at once with the
// NVMe tier nearly empty. Now they wait for the writer unpinned, and it copies them from
// wherever they are (host memory or NVMe).
// args: socket, pieces, MiB per piece. Offloads them all, then reloads and checks each.
int OffloadMoreThanThePoolHolds(UidChannel& c) {
  Session s = Connect(c, "witness");
  const uint64_t piece = ArgU64(c, 2) << 20;
  const int pieces = static_cast<int>(ArgU64(c, 1));
  HostBuffer buffer = s.AllocHost(piece);
  std::vector<tier_object_id> objects;
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < pieces; ++i) {
    Pattern(buffer.data, piece, static_cast<uint32_t>(i));
    tier_object_id object = 0;
    tier_job_id job = 0;
    tier_status status = tier_offload(s.get(), buffer.id, 0, piece, nullptr, &object, &job);
    if (status == TIER_OK) status = tier_job_wait(s.get(), job, 30000);
    if (status != TIER_OK) {
      c.Say(absl::StrCat("offload=", tier_status_name(status), " piece=", i, " after_ms=",
                         static_cast<int>(MsSince(start))));
      return 1;
    }
    objects.push_back(object);
  }
  for (int i = 0; i < pieces; ++i) {
    std::memset(buffer.data, 0, piece);
    tier_job_id job = 0;
    if (tier_reload(s.get(), objects[i], buffer.id, 0, piece, nullptr, &job) != TIER_OK ||
        tier_job_wait(s.get(), job, 30000) != TIER_OK ||
        !HasPattern(buffer.data, piece, static_cast<uint32_t>(i))) {
      c.Say(absl::StrCat("reload=failed piece=", i));
      return 1;
    }
  }
  c.Say(absl::StrCat("offload=OK pieces=", pieces, " ms=", static_cast<int>(MsSince(start))));
  return 0;
}

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
}  // namespace tier
