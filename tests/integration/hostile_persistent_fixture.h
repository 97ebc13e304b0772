// What the hostile-client tests of persistent objects share (hostile_persistent_fairness_test.cc,
// hostile_persistent_restart_test.cc): issue 30, "one local user can hurt the others",
// persistent objects. Each scenario runs the attacker and the witness as two unprivileged uids
// (as_uid.h) against a real tierd with an NVMe tier, and fails while its finding stands. Needs root
// (CI runs it as root); skips otherwise. The timings the findings quote are printed as
// "[ figures ]" lines.
//
// Run the same tests against another tierd binary (TIERD_BIN=...) to see the findings before
// the fix.
#ifndef TIER_TESTS_INTEGRATION_HOSTILE_PERSISTENT_FIXTURE_H_
#define TIER_TESTS_INTEGRATION_HOSTILE_PERSISTENT_FIXTURE_H_

#include <fcntl.h>
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

namespace tier::hostile_persistent_testing {

using testing::AsUid;
using testing::AwaitSpillFileFree;
using testing::kTestUidA;
using testing::kTestUidB;
using testing::TierdProcess;
using testing::UidChannel;
using testing::UidExit;
using Clock = std::chrono::steady_clock;

constexpr uid_t kTestUidC = 61003;

inline double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

inline uint64_t ArgU64(const UidChannel& c, size_t i) {
  uint64_t value = 0;
  return absl::SimpleAtoi(c.args().at(i), &value) ? value : 0;
}

// ---- in the children (as a test uid) -----------------------------------------------------------

inline Session::Options OptionsOf(const UidChannel& c, const char* name = "hostile") {
  Session::Options options;
  options.socket_path = c.args().at(0);
  options.name = name;
  return options;
}
inline Session Connect(const UidChannel& c, const char* name = "hostile") {
  return Session(OptionsOf(c, name));
}

inline void Pattern(void* data, uint64_t len, uint32_t seed) {
  auto* bytes = static_cast<uint8_t*>(data);
  for (uint64_t i = 0; i < len; ++i) bytes[i] = static_cast<uint8_t>(seed * 131 + i * 7 + (i >> 12));
}

inline bool HasPattern(const void* data, uint64_t len, uint32_t seed) {
  auto* bytes = static_cast<const uint8_t*>(data);
  for (uint64_t i = 0; i < len; ++i) {
    if (bytes[i] != static_cast<uint8_t>(seed * 131 + i * 7 + (i >> 12))) return false;
  }
  return true;
}

// Persists objects `prefix`0.. of `len` bytes until `count` are in, one is refused (*refusal:
// its status), or `deadline`. Waits in groups and gives the ids back (a session binds at most
// 4096). Returns how many went in.
inline int PersistMany(Session& s, const HostBuffer& buffer, const std::string& prefix, int count,
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

inline int PersistMany(Session& s, const std::string& prefix, int count, uint64_t len,
                tier_status* refusal, Clock::time_point deadline = Clock::time_point::max()) {
  HostBuffer buffer = s.AllocHost(std::max<uint64_t>(len, 4096));
  const int done = PersistMany(s, buffer, prefix, count, len, refusal, deadline);
  s.Unregister(buffer.id);
  return done;
}

// Until `name` is durable (its Stat says so), or `timeout_ms`: ms waited, or -1.
inline double AwaitDurable(Session& s, const std::string& name, int timeout_ms) {
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

inline std::string Percentiles(std::vector<double> ms) {
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
  // SIGKILL, then until the dead daemon's spill file is free (AwaitSpillFileFree).
  void Kill() {
    tierd_->Kill();
    tierd_.reset();
    AwaitSpillFileFree(spill_);
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
inline std::string Said(const std::vector<std::string>& lines, const std::string& key) {
  for (const std::string& line : lines) {
    for (absl::string_view field : absl::StrSplit(line, ' ')) {
      if (absl::StartsWith(field, key + "=")) return std::string(field.substr(key.size() + 1));
    }
  }
  return "";
}
inline double SaidNumber(const std::vector<std::string>& lines, const std::string& key) {
  double value = -1;
  return absl::SimpleAtod(Said(lines, key), &value) ? value : -1;
}

// args: socket, count, len, prefix. Persists, then says how long until the last is durable.
inline int PersistManyThenAwaitDurable(UidChannel& c) {
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
inline int OffloadMoreThanThePoolHolds(UidChannel& c) {
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

}  // namespace tier::hostile_persistent_testing

#endif  // TIER_TESTS_INTEGRATION_HOSTILE_PERSISTENT_FIXTURE_H_
