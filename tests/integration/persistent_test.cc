// Named, persistent objects (issue 17) against a real tierd with the host engine: they outlive
// their session, belong to their uid alone, count against persistent_quota_bytes_per_uid, and
// tierctl lists and deletes them.
#include <sys/stat.h>
#include <unistd.h>

#include <random>
#include <string>

#include "gtest/gtest.h"
#include "tier/client.hpp"
#include "tierd_process.h"

namespace tier {
namespace {

using testing::ChildProcess;
using testing::TierdProcess;

constexpr uint32_t kNobody = 65534;

Session::Options OptionsFor(const TierdProcess& tierd, uint64_t quota = 0) {
  Session::Options options;
  options.socket_path = tierd.socket();
  options.name = "persistent-test";
  options.quota_bytes = quota;
  return options;
}

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
  Session session(OptionsFor(tierd));
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

  Session later(OptionsFor(tierd));
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
  Session session(OptionsFor(tierd));
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
  Session session(OptionsFor(tierd));
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
  EXPECT_EQ(Peer(tierd, kNobody, {"read", "secret"}), "read NOT_FOUND");
  EXPECT_EQ(Peer(tierd, kNobody, {"delete", "secret"}), "delete NOT_FOUND");
  // Naming the owner's uid does not help (and does not reveal that the name exists).
  EXPECT_EQ(Peer(tierd, kNobody, {"delete", "secret", "0"}), "delete NOT_FOUND");
  EXPECT_EQ(Peer(tierd, kNobody, {"delete", "no-such-name", "0"}), "delete NOT_FOUND");
  // Its own namespace is its own: the same name is free there.
  EXPECT_EQ(Peer(tierd, kNobody, {"create", "secret"}), "create OK");
  EXPECT_EQ(Peer(tierd, kNobody, {"read", "secret"}), "read OK");

  // The owner's object is untouched.
  Session owner(OptionsFor(tierd));
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
  Session session(OptionsFor(tierd));
  EXPECT_EQ(CodeOf([&] { session.Open("ckpt/opt.state"); }), TIER_NOT_FOUND);
}

}  // namespace
}  // namespace tier
