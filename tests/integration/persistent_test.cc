// Named, persistent objects (issue 17) against a real tierd with the host engine: they outlive
// their session, belong to their uid alone, count against persistent_quota_bytes_per_uid, and
// tierctl lists and deletes them; with an NVMe tier they survive SIGKILL and a restart, and
// damaged files on disk are refused, never served.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "common/unix_socket.h"
#include "gtest/gtest.h"
#include "raw_session.h"
#include "tier/client.hpp"
#include "tier/session_wire.h"
#include "tierd_process.h"

namespace tier {
namespace {

using testing::AwaitSpillFileFree;
using testing::ChildProcess;
using testing::TierdProcess;

constexpr uint32_t kNobody = 65534;

void Fill(void* data, uint64_t len, uint32_t seed) {
  std::mt19937 rng(seed);
  auto* words = static_cast<uint32_t*>(data);
  for (uint64_t i = 0; i < len / 4; ++i) words[i] = rng();
}

bool Matches(const void* data, uint64_t len, uint32_t seed) {
  std::mt19937 rng(seed);
  auto* words = static_cast<const uint32_t*>(data);
  for (uint64_t i = 0; i < len / 4; ++i) {
    if (words[i] != rng()) return false;
  }
  return true;
}

// The status code a call threw (TIER_OK if it did not).
template <typename F>
tier_status CodeOf(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return TIER_OK;
}

// Offloads `len` bytes of pattern `seed` into the new persistent object `name`, in a session
// that then ends.
void Persist(const TierdProcess& tierd, const std::string& name, uint64_t len, uint32_t seed) {
  Session session(tierd.SessionOptions("persistent-test"));
  HostBuffer buffer = session.AllocHost(len);
  Fill(buffer.data, len, seed);
  auto [object, job] = session.OffloadPersistent(name, buffer.id, 0, len);
  session.Wait(job);
}

// Runs object_peer as `uid`; returns its one line ("open NOT_FOUND").
std::string Peer(const TierdProcess& tierd, uint32_t uid, std::vector<std::string> args) {
  std::vector<std::string> argv = {OBJECT_PEER_BIN, "--socket=" + tierd.socket(),
                                   "--uid=" + std::to_string(uid)};
  argv.insert(argv.end(), args.begin(), args.end());
  ChildProcess peer(argv);
  return peer.ReadLine(30000);
}

TEST(Persistent, OutlivesItsSessionAndReloadsBitIdentical) {
  TierdProcess tierd;
  const uint64_t len = (3 << 20) + 4096;
  Persist(tierd, "ckpt/layer0.weight", len, 17);
  // The session is gone; the object is not.
  ASSERT_TRUE(tierd.WaitForStatus([](const v1::GetStatusResponse& s) { return s.sessions() == 0; }));
  EXPECT_GE(TierdProcess::HostTier(tierd.Status()).used_bytes(), len);

  Session later(tierd.SessionOptions("persistent-test"));
  auto [object, found_len] = later.Open("ckpt/layer0.weight");
  ASSERT_EQ(found_len, len);
  HostBuffer buffer = later.AllocHost(len);
  later.Wait(later.Reload(object, buffer.id, 0, len));
  EXPECT_TRUE(Matches(buffer.data, len, 17));
  // Reloading again works: a reload does not consume it.
  std::memset(buffer.data, 0, len);
  later.Wait(later.Reload(object, buffer.id, 0, len));
  EXPECT_TRUE(Matches(buffer.data, len, 17));

  later.Delete("ckpt/layer0.weight");
  EXPECT_EQ(CodeOf([&] { later.Open("ckpt/layer0.weight"); }), TIER_NOT_FOUND);
  // The object id bound before the delete names nothing any more.
  EXPECT_EQ(later.TryWait(later.Reload(object, buffer.id, 0, len)), TIER_NOT_FOUND);
  EXPECT_EQ(TierdProcess::HostTier(tierd.Status()).used_bytes(), 0u);
}

TEST(Persistent, NamesAreCheckedAndUnique) {
  TierdProcess tierd;
  Persist(tierd, "a", 4096, 1);
  Session session(tierd.SessionOptions("persistent-test"));
  HostBuffer buffer = session.AllocHost(4096);
  EXPECT_EQ(CodeOf([&] { session.OffloadPersistent("a", buffer.id, 0, 4096); }),
            TIER_ALREADY_EXISTS);
  EXPECT_EQ(CodeOf([&] { session.OffloadPersistent("has space", buffer.id, 0, 4096); }),
            TIER_INVALID_ARGUMENT);
  EXPECT_EQ(CodeOf([&] { session.OffloadPersistent("", buffer.id, 0, 4096); }),
            TIER_INVALID_ARGUMENT);
  EXPECT_EQ(CodeOf([&] { session.OffloadPersistent(std::string(128, 'x'), buffer.id, 0, 4096); }),
            TIER_INVALID_ARGUMENT);
  EXPECT_EQ(CodeOf([&] { session.Open("never-made"); }), TIER_NOT_FOUND);
  EXPECT_EQ(CodeOf([&] { session.Delete("never-made"); }), TIER_NOT_FOUND);
  // A persistent offload whose job fails leaves no name behind: the name can be taken again.
  auto [bad, bad_job] = session.OffloadPersistent("b", buffer.id, 4096, 4096);  // out of range
  EXPECT_EQ(session.TryWait(bad_job), TIER_OUT_OF_RANGE);
  EXPECT_EQ(CodeOf([&] { session.Open("b"); }), TIER_NOT_FOUND);
  Fill(buffer.data, 4096, 2);
  auto [good, good_job] = session.OffloadPersistent("b", buffer.id, 0, 4096);
  session.Wait(good_job);
  auto [opened, len] = session.Open("b");
  EXPECT_EQ(len, 4096u);
  std::memset(buffer.data, 0, 4096);
  session.Wait(session.Reload(opened, buffer.id, 0, 4096));
  EXPECT_TRUE(Matches(buffer.data, 4096, 2));
  // The daemon keeps serving: an ordinary offload still works.
  auto [plain, plain_job] = session.Offload(buffer.id, 0, 4096);
  session.Wait(plain_job);
}

TEST(Persistent, QuotaPerUidIsEnforcedWithAClearError) {
  TierdProcess tierd({"--persistent_quota_bytes_per_uid=1M"});
  Persist(tierd, "first", 768 << 10, 3);
  Session session(tierd.SessionOptions("persistent-test"));
  HostBuffer buffer = session.AllocHost(512 << 10);
  try {
    session.OffloadPersistent("second", buffer.id, 0, 512 << 10);
    FAIL() << "an offload past the persistent quota was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), TIER_RESOURCE_EXHAUSTED);
    EXPECT_NE(std::string(e.what()).find("persistent_quota_bytes_per_uid"), std::string::npos)
        << e.what();
  }
  // The session's own quota is apart: an ordinary offload of the same size goes in.
  auto [plain, plain_job] = session.Offload(buffer.id, 0, 512 << 10);
  session.Wait(plain_job);
  // Room made, the name is free again and the offload fits.
  session.Delete("first");
  auto [again, again_job] = session.OffloadPersistent("second", buffer.id, 0, 512 << 10);
  session.Wait(again_job);
}

TEST(Persistent, AnotherUidCannotSeeReadOrDeleteIt) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid (setuid)";
  // The peer runs as nobody: it must reach the sockets.
  TierdProcess tierd({"--socket_mode=0666"});
  ASSERT_EQ(::chmod(tierd.dir().c_str(), 0755), 0);
  Persist(tierd, "secret", 8192, 5);

  EXPECT_EQ(Peer(tierd, kNobody, {"open", "secret"}), "open NOT_FOUND");
  EXPECT_EQ(Peer(tierd, kNobody, {"stat", "secret"}), "stat NOT_FOUND");
  EXPECT_EQ(Peer(tierd, kNobody, {"read", "secret"}), "read NOT_FOUND");
  EXPECT_EQ(Peer(tierd, kNobody, {"delete", "secret"}), "delete NOT_FOUND");
  // Naming the owner's uid does not help (and does not reveal that the name exists).
  EXPECT_EQ(Peer(tierd, kNobody, {"delete", "secret", "0"}), "delete NOT_FOUND");
  EXPECT_EQ(Peer(tierd, kNobody, {"delete", "no-such-name", "0"}), "delete NOT_FOUND");
  // Its own namespace is its own: the same name is free there.
  EXPECT_EQ(Peer(tierd, kNobody, {"create", "secret"}), "create OK");
  EXPECT_EQ(Peer(tierd, kNobody, {"read", "secret"}), "read OK");

  // The owner's object is untouched.
  Session owner(tierd.SessionOptions("persistent-test"));
  auto [object, len] = owner.Open("secret");
  ASSERT_EQ(len, 8192u);
  HostBuffer buffer = owner.AllocHost(len);
  owner.Wait(owner.Reload(object, buffer.id, 0, len));
  EXPECT_TRUE(Matches(buffer.data, len, 5));
  // Root may delete another uid's object.
  owner.Delete("secret", kNobody);
  EXPECT_EQ(Peer(tierd, kNobody, {"open", "secret"}), "open NOT_FOUND");
}

TEST(Persistent, TierctlListsAndDeletes) {
  TierdProcess tierd;
  Persist(tierd, "ckpt/opt.state", 65536, 9);
  const std::string tierctl = std::string(TIERCTL_BIN) + " --socket " + tierd.socket() + " ";
  auto [rc, out] = testing::RunCommand(tierctl + "objects");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("ckpt/opt.state"), std::string::npos) << out;
  EXPECT_NE(out.find("64.0 KiB"), std::string::npos) << out;
  auto [rc_json, json] = testing::RunCommand(tierctl + "--json objects");
  ASSERT_EQ(rc_json, 0) << json;
  EXPECT_NE(json.find("\"name\":\"ckpt/opt.state\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"uid\":" + std::to_string(::getuid())), std::string::npos) << json;
  EXPECT_NE(json.find("\"bytes\":65536"), std::string::npos) << json;
  EXPECT_NE(json.find("\"tier\":\"host\""), std::string::npos) << json;

  auto [rc_missing, missing] =
      testing::RunCommand(tierctl + "objects delete no-such-object 2>&1");
  EXPECT_EQ(rc_missing, 1) << missing;
  EXPECT_NE(missing.find("NOT_FOUND"), std::string::npos) << missing;
  auto [rc_delete, deleted] = testing::RunCommand(
      tierctl + "objects delete ckpt/opt.state --uid " + std::to_string(::getuid()));
  ASSERT_EQ(rc_delete, 0) << deleted;
  auto [rc_after, after] = testing::RunCommand(tierctl + "--json objects");
  ASSERT_EQ(rc_after, 0) << after;
  EXPECT_EQ(after.find("ckpt/opt.state"), std::string::npos) << after;
  Session session(tierd.SessionOptions("persistent-test"));
  EXPECT_EQ(CodeOf([&] { session.Open("ckpt/opt.state"); }), TIER_NOT_FOUND);
}

// What a hostile client may send on the session socket: each bad request is refused with a clear
// code, and the session and the daemon keep serving.
TEST(Persistent, BadObjectRequestsAreRefusedAndTheDaemonServesOn) {
  TierdProcess tierd;
  Persist(tierd, "mine", 4096, 4);
  testing::RawSession raw(tierd);
  client::SessionChannel& channel = *raw.channel;
  auto code = [](const absl::StatusOr<wire::ObjectReply>& r) { return r.status().code(); };
  EXPECT_EQ(code(channel.ObjectRequest(static_cast<wire::ObjectOp>(99), "mine", 7,
                                       wire::kCallerUid)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(channel.ObjectRequest(wire::ObjectOp::kOpen, "mine", 0, wire::kCallerUid)),
            absl::StatusCode::kInvalidArgument);  // id 0
  EXPECT_EQ(code(channel.ObjectRequest(wire::ObjectOp::kOpen, "bad\nname", 7, wire::kCallerUid)),
            absl::StatusCode::kInvalidArgument);
  // Binding one id twice, or an id the session's own table already holds.
  ASSERT_TRUE(channel.ObjectRequest(wire::ObjectOp::kOpen, "mine", 7, wire::kCallerUid).ok());
  EXPECT_EQ(code(channel.ObjectRequest(wire::ObjectOp::kOpen, "mine", 7, wire::kCallerUid)),
            absl::StatusCode::kAlreadyExists);
  int memfd = ::memfd_create("raw", MFD_ALLOW_SEALING);
  ASSERT_GE(memfd, 0);
  ASSERT_EQ(::ftruncate(memfd, 4096), 0);
  testing::PopulateMemfd(memfd, 4096);
  ASSERT_EQ(::fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  wire::RegisterBuffer reg{};
  reg.kind = static_cast<uint32_t>(wire::BufferKind::kHostMemfd);
  reg.device = -1;
  reg.bytes = 4096;
  int fds[] = {memfd};
  absl::StatusOr<uint64_t> buffer = channel.Register(reg, fds);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  ring::SubmissionEntry offload{};
  offload.job_id = 1;
  offload.opcode = static_cast<uint32_t>(ring::Opcode::kOffload);
  offload.object_id = 8;
  offload.buffer_id = *buffer;
  offload.len = 4096;
  raw.Push(offload);
  EXPECT_EQ(raw.Next().status, 0);
  EXPECT_EQ(code(channel.ObjectRequest(wire::ObjectOp::kOpen, "mine", 8, wire::kCallerUid)),
            absl::StatusCode::kAlreadyExists);
  // A create refused for its id reserves no name: another session may take it at once.
  EXPECT_EQ(code(channel.ObjectRequest(wire::ObjectOp::kCreate, "fresh", 8, wire::kCallerUid,
                                       4096)),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(code(channel.ObjectRequest(wire::ObjectOp::kCreate, "fresh", 0, wire::kCallerUid,
                                       4096)),
            absl::StatusCode::kInvalidArgument);
  Persist(tierd, "fresh", 4096, 6);
  // A name that fills all 128 bytes with no NUL.
  wire::ObjectRequest unterminated{};
  unterminated.header = {static_cast<uint32_t>(wire::MessageType::kObjectRequest),
                         wire::kProtocolVersion, 99};
  unterminated.op = static_cast<uint32_t>(wire::ObjectOp::kOpen);
  unterminated.uid = wire::kCallerUid;
  unterminated.object_id = 9;
  std::memset(unterminated.name, 'x', sizeof(unterminated.name));
  ASSERT_TRUE(SendMessage(channel.fd(), &unterminated, sizeof(unterminated)).ok());
  absl::StatusOr<ReceivedMessage> reply = ReceiveMessage(channel.fd(), wire::kMaxMessageBytes, 0);
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->data.size(), sizeof(wire::ObjectReply));
  wire::ObjectReply parsed;
  std::memcpy(&parsed, reply->data.data(), sizeof(parsed));
  EXPECT_EQ(parsed.reply.status, TIER_INVALID_ARGUMENT);
  EXPECT_NE(std::string(parsed.reply.message).find("NUL"), std::string::npos)
      << parsed.reply.message;

  // The bound id 7 still reloads the persistent object through the ring.
  ring::SubmissionEntry reload{};
  reload.job_id = 2;
  reload.opcode = static_cast<uint32_t>(ring::Opcode::kReload);
  reload.object_id = 7;
  reload.buffer_id = *buffer;
  reload.len = 4096;
  raw.Push(reload);
  EXPECT_EQ(raw.Next().status, 0);
  void* mapped = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, memfd, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  EXPECT_TRUE(Matches(mapped, 4096, 4));
  ::munmap(mapped, 4096);
  ::close(memfd);
  EXPECT_EQ(tierd.Status().state(), v1::HealthResponse::SERVING);
}

// Each bound id and each reserved name is daemon memory no byte quota counts before its offload
// lands: a session may bind a bounded number, and the names it reserved go with it.
TEST(Persistent, BindingsPerSessionAreBounded) {
  TierdProcess tierd;
  {
    testing::RawSession raw(tierd);
    client::SessionChannel& channel = *raw.channel;
    for (uint64_t i = 1; i <= 4096; ++i) {
      absl::StatusOr<wire::ObjectReply> created = channel.ObjectRequest(
          wire::ObjectOp::kCreate, "n" + std::to_string(i), i, wire::kCallerUid, 4096);
      ASSERT_TRUE(created.ok()) << i << ": " << created.status();
    }
    absl::StatusOr<wire::ObjectReply> over =
        channel.ObjectRequest(wire::ObjectOp::kCreate, "one-more", 5000, wire::kCallerUid, 4096);
    EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  }
  // The session ended with none of them filled: every name is free again.
  ASSERT_TRUE(tierd.WaitForStatus([](const v1::GetStatusResponse& s) { return s.sessions() == 0; }));
  Persist(tierd, "n1", 4096, 1);
  Persist(tierd, "one-more", 4096, 1);
}

// A long-lived session (a trainer that saves every few steps) releases the ids it is done with:
// the object stays, the id names nothing, and the bound ids never pile up.
TEST(Persistent, ReleasedIdsFreeTheirSlotAndKeepTheObject) {
  TierdProcess tierd;
  const uint64_t len = 64 << 10;
  Persist(tierd, "kept", len, 5);
  Session session(tierd.SessionOptions("persistent-test"));
  HostBuffer buffer = session.AllocHost(len);
  for (int i = 0; i < 5000; ++i) {  // more than Session::kMaxBound
    auto [object, found] = session.Open("kept");
    ASSERT_EQ(found, len);
    if (i % 1000 == 0) {
      std::memset(buffer.data, 0, len);
      session.Wait(session.Reload(object, buffer.id, 0, len));
      EXPECT_TRUE(Matches(buffer.data, len, 5));
    }
    session.Release(object);
    if (i == 0) {
      EXPECT_EQ(session.TryWait(session.Reload(object, buffer.id, 0, len)), TIER_NOT_FOUND);
      EXPECT_EQ(CodeOf([&] { session.Release(object); }), TIER_NOT_FOUND);
    }
  }
  // Released, not deleted; and an id of the session's own (never bound) is not released.
  auto [object, found] = session.Open("kept");
  EXPECT_EQ(found, len);
  auto [own, job] = session.Offload(buffer.id, 0, len);
  session.Wait(job);
  EXPECT_EQ(CodeOf([&] { session.Release(own); }), TIER_NOT_FOUND);
  session.Wait(session.Reload(own, buffer.id, 0, len));
  EXPECT_TRUE(Matches(buffer.data, len, 5));
}

// Deleting an object through its id (a free, or a reload that frees after) releases the id too:
// a session that saves and deletes again and again never reaches the bound ids' limit. (Before,
// the 4097th save of a session that freed each one was refused RESOURCE_EXHAUSTED.)
TEST(Persistent, IdsDeletedThroughAreReleasedWithTheirObjects) {
  TierdProcess tierd;
  const uint64_t len = 4096;
  Session session(tierd.SessionOptions("persistent-test"));
  HostBuffer buffer = session.AllocHost(len);
  std::memset(buffer.data, 0x5a, len);
  for (int i = 0; i < 4200; ++i) {  // more than Session::kMaxBound
    auto [object, job] = session.OffloadPersistent("churn", buffer.id, 0, len);
    session.Wait(job);
    if (i % 2 == 0) {
      session.Wait(session.Free(object));
    } else {
      session.Wait(session.Reload(object, buffer.id, 0, len, /*free_after=*/true));
    }
    if (i == 0) {
      // The id names nothing now: neither a job nor a release finds it.
      EXPECT_EQ(session.TryWait(session.Reload(object, buffer.id, 0, len)), TIER_NOT_FOUND);
      EXPECT_EQ(CodeOf([&] { session.Release(object); }), TIER_NOT_FOUND);
    }
  }
  EXPECT_EQ(CodeOf([&] { session.Open("churn"); }), TIER_NOT_FOUND);
}

// Stat answers without binding: length and READY; no JOURNALED (so never DURABLE) without NVMe;
// another uid's name and a missing name answer alike.
TEST(Persistent, StatSaysReadyAndWhetherDurabilityWillCome) {
  TierdProcess tierd;
  Persist(tierd, "stat/me", 8192, 3);
  Session session(tierd.SessionOptions("persistent-test"));
  tier_object_info info = session.Stat("stat/me");
  EXPECT_EQ(info.len, 8192u);
  EXPECT_EQ(info.flags, TIER_OBJECT_READY);
  EXPECT_EQ(CodeOf([&] { session.Stat("stat/none"); }), TIER_NOT_FOUND);
  EXPECT_EQ(CodeOf([&] { session.Stat("bad name"); }), TIER_INVALID_ARGUMENT);
  tier_object_info small{};
  small.struct_size = 4;
  EXPECT_EQ(tier_object_stat(session.get(), "stat/me", &small), TIER_INVALID_ARGUMENT);
}

// With NVMe: a persistent object is written through and comes back after tierd is killed.
class PersistentRestart : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/tier-persist-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    spill_ = pattern;
  }
  void TearDown() override {
    (void)!std::system(("rm -rf '" + spill_ + "'").c_str());
  }
  std::vector<std::string> Flags() const {
    return {"--spill_dir=" + spill_, "--spill_bytes=16M"};
  }
  // Waits until `tierd` lists `name` as durable (written through to NVMe).
  static bool Durable(TierdProcess& tierd, const std::string& name) {
    for (int i = 0; i < 2000; ++i) {
      v1::ListObjectsRequest request;
      absl::StatusOr<std::string> token = ReadToken(tierd);
      if (token.ok()) request.set_admin_token(*token);
      v1::ListObjectsResponse response;
      grpc::ClientContext context;
      if (tierd.stub().ListObjects(&context, request, &response).ok()) {
        for (const v1::ObjectInfo& o : response.objects()) {
          if (o.name() == name && o.durable()) return true;
        }
      }
      ::usleep(5000);
    }
    return false;
  }
  static absl::StatusOr<std::string> ReadToken(const TierdProcess& tierd) {
    std::ifstream in(tierd.socket() + ".admin-token");
    std::string token;
    if (!(in >> token)) return absl::NotFoundError("no token");
    return token;
  }
  // The journal's file (journal-<generation>; one only, as after a clean start).
  std::string JournalFile() const {
    for (int g = 9; g >= 1; --g) {
      std::string path = spill_ + "/persistent/journal-" + std::to_string(g);
      if (::access(path.c_str(), F_OK) == 0) return path;
    }
    return "";
  }
  // SIGKILL, then until the dead daemon's spill file is free (AwaitSpillFileFree).
  void KillAndAwaitFiles(TierdProcess& tierd) const {
    tierd.Kill();
    AwaitSpillFileFree(spill_);
  }
  static void FlipByte(const std::string& path, off_t offset) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(offset);
    char c = 0;
    f.get(c);
    f.seekp(offset);
    f.put(static_cast<char>(c ^ 0x5a));
  }

  std::string spill_;
};

TEST_F(PersistentRestart, SurvivesSigkillBitIdentical) {
  const uint64_t len = (1 << 20) + 4096;
  {
    TierdProcess tierd(Flags());
    Persist(tierd, "ckpt/durable", len, 21);
    Persist(tierd, "ckpt/deleted", 4096, 22);
    ASSERT_TRUE(Durable(tierd, "ckpt/durable"));
    ASSERT_TRUE(Durable(tierd, "ckpt/deleted"));
    Session session(tierd.SessionOptions("persistent-test"));
    // What ListObjects (admin) says, the owner's Stat says too.
    EXPECT_EQ(session.Stat("ckpt/durable").flags,
              TIER_OBJECT_READY | TIER_OBJECT_DURABLE | TIER_OBJECT_JOURNALED);
    session.Delete("ckpt/deleted");
    auto [bound, bound_len] = session.Open("ckpt/durable");
    EXPECT_EQ(bound_len, len);
    KillAndAwaitFiles(tierd);  // SIGKILL: no shutdown path runs
  }
  TierdProcess restarted(Flags());
  Session session(restarted.SessionOptions("persistent-test"));
  auto [object, found] = session.Open("ckpt/durable");
  ASSERT_EQ(found, len);
  HostBuffer buffer = session.AllocHost(len);
  session.Wait(session.Reload(object, buffer.id, 0, len));
  EXPECT_TRUE(Matches(buffer.data, len, 21));
  EXPECT_EQ(CodeOf([&] { session.Open("ckpt/deleted"); }), TIER_NOT_FOUND);
  // A free job deletes it for good: not back after the next restart.
  session.Wait(session.Free(object));
  ASSERT_EQ(restarted.Stop(), 0);
  TierdProcess again(Flags());
  Session last(again.SessionOptions("persistent-test"));
  EXPECT_EQ(CodeOf([&] { last.Open("ckpt/durable"); }), TIER_NOT_FOUND);
}

TEST_F(PersistentRestart, DamagedRecordIsRefusedWithAClearError) {
  {
    TierdProcess tierd(Flags());
    Persist(tierd, "ckpt/w", 65536, 23);
    ASSERT_TRUE(Durable(tierd, "ckpt/w"));
    KillAndAwaitFiles(tierd);
  }
  const std::string file = JournalFile();
  ASSERT_FALSE(file.empty());
  // In its data: the file is a 32-byte header, the record's head, then its 65536 bytes (and zero
  // padding to the end of the last 4096-byte block, which the file's size includes).
  FlipByte(file, 32768);
  TierdProcess tierd(Flags(), testing::TierdOptions{0, /*capture_log=*/true});
  Session session(tierd.SessionOptions("persistent-test"));
  EXPECT_EQ(CodeOf([&] { session.Open("ckpt/w"); }), TIER_NOT_FOUND);
  const std::string log = tierd.Log();
  EXPECT_NE(log.find("\"ckpt/w\" of uid"), std::string::npos) << log;
  EXPECT_NE(log.find("DATA_LOSS"), std::string::npos) << log;
  EXPECT_NE(log.find("checksum mismatch"), std::string::npos) << log;
}

TEST_F(PersistentRestart, DamagedJournalIsRefusedWithAClearError) {
  {
    TierdProcess tierd(Flags());
    Persist(tierd, "ckpt/m", 8192, 24);
    ASSERT_TRUE(Durable(tierd, "ckpt/m"));
    KillAndAwaitFiles(tierd);
  }
  const std::string file = JournalFile();
  ASSERT_FALSE(file.empty());
  FlipByte(file, 20);  // in the file's header
  TierdProcess tierd(Flags(), testing::TierdOptions{0, /*capture_log=*/true});
  Session session(tierd.SessionOptions("persistent-test"));
  EXPECT_EQ(CodeOf([&] { session.Open("ckpt/m"); }), TIER_NOT_FOUND);
  const std::string log = tierd.Log();
  EXPECT_NE(log.find("journal"), std::string::npos) << log;
  EXPECT_NE(log.find("damaged"), std::string::npos) << log;
  EXPECT_EQ(::access((file + ".damaged").c_str(), F_OK), 0);
  // The daemon serves on, and new persistent objects are durable again.
  Persist(tierd, "ckpt/new", 4096, 25);
  EXPECT_TRUE(Durable(tierd, "ckpt/new"));
}

}  // namespace
}  // namespace tier
