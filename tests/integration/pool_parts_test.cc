// The host pool split into parts with a real tierd (host engine): two parts listed in pool_numa
// (both on node 0, the one node this machine and CI have), shown in the status API and in
// `tierctl pools`, objects placed in both, an object larger than a part refused; the default (no
// GPUs: one unbound part); and a node that does not exist refused at start with a clear message.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tier/client.hpp"
#include "tierd_process.h"

namespace tier {
namespace {

using testing::TierdProcess;

constexpr uint64_t kMiB = 1ull << 20;

bool NodeZeroExists() { return std::filesystem::exists("/sys/devices/system/node/node0"); }

std::string Tierctl(const TierdProcess& tierd, const std::string& command) {
  auto [code, out] = testing::RunCommand(
      absl::StrCat(TIERCTL_BIN, " --socket ", tierd.socket(), " ", command, " 2>&1"));
  EXPECT_EQ(code, 0) << out;
  return out;
}

TEST(PoolParts, TwoListedPartsShowAndHoldObjects) {
  if (!NodeZeroExists()) GTEST_SKIP() << "no NUMA node 0 in sysfs";
  TierdProcess tierd({"--pool_numa=0,0"});
  v1::GetStatusResponse status = tierd.Status();
  ASSERT_EQ(status.pool_parts_size(), 2);
  EXPECT_EQ(status.pool_layout(), "2 parts (pool_numa lists the nodes): node 0; node 0");
  for (int i = 0; i < 2; ++i) {
    const v1::PoolPartStatus& part = status.pool_parts(i);
    EXPECT_EQ(part.part(), static_cast<uint32_t>(i));
    EXPECT_EQ(part.numa_node(), 0);
    EXPECT_EQ(part.capacity_bytes(), 32 * kMiB);  // equal shares: no GPUs
    EXPECT_EQ(part.used_bytes(), 0u);
    EXPECT_EQ(part.gpus_size(), 0);
  }
  EXPECT_EQ(status.gpus_size(), 0);  // the host engine serves no GPU
  EXPECT_EQ(TierdProcess::HostTier(status).capacity_bytes(), 64 * kMiB);

  {
    Session session(tierd.SessionOptions("parts"));
    HostBuffer buffer = session.AllocHost(40 * kMiB);
    // Host memory has no GPU: each object goes to the emptiest part, so both fill.
    std::vector<uint64_t> objects;
    for (uint64_t i = 0; i < 24; ++i) {
      std::memset(static_cast<char*>(buffer.data) + i * kMiB, int(i + 1), kMiB);
      auto [object, job] = session.Offload(buffer.id, i * kMiB, kMiB);
      session.Wait(job);
      objects.push_back(object);
    }
    // Larger than either part (though the pool has that much free): refused at once.
    auto [too_big, refused] = session.Offload(buffer.id, 0, 33 * kMiB);
    EXPECT_EQ(session.TryWait(refused), TIER_RESOURCE_EXHAUSTED);

    status = tierd.Status();
    EXPECT_EQ(status.pool_parts(0).used_bytes() + status.pool_parts(1).used_bytes(), 24 * kMiB);
    EXPECT_EQ(status.pool_parts(0).used_bytes(), 12 * kMiB);
    EXPECT_EQ(status.pool_parts(1).used_bytes(), 12 * kMiB);
    EXPECT_EQ(status.pool_parts(0).any_allocations() + status.pool_parts(1).any_allocations(), 24u);
    EXPECT_EQ(status.pool_parts(0).local_allocations() + status.pool_parts(1).remote_allocations(),
              0u);
    EXPECT_EQ(TierdProcess::HostTier(status).used_bytes(), 24 * kMiB);

    // Both parts in tierctl's table.
    const std::string pools = Tierctl(tierd, "pools");
    EXPECT_NE(pools.find("Host pool: 2 parts (pool_numa lists the nodes): node 0; node 0"),
              std::string::npos)
        << pools;
    EXPECT_NE(pools.find("PART  NODE"), std::string::npos) << pools;
    EXPECT_NE(pools.find("\n   0     0  32.0 MiB  12.0 MiB  20.0 MiB  37.5%       12  -         0"
                         "       0   12\n"),
              std::string::npos)
        << pools;
    EXPECT_NE(pools.find("\n   1     0  32.0 MiB  12.0 MiB  20.0 MiB  37.5%       12  -         0"
                         "       0   12\n"),
              std::string::npos)
        << pools;
    const std::string json = Tierctl(tierd, "pools --json");
    EXPECT_NE(json.find("\"pool_parts\":[{\"part\":0,\"numa_node\":0,"), std::string::npos)
        << json;

    // Every byte came back intact from either part.
    for (uint64_t i = 0; i < 24; ++i) {
      std::memset(static_cast<char*>(buffer.data) + i * kMiB, 0, kMiB);
      session.Wait(session.Reload(objects[i], buffer.id, i * kMiB, kMiB));
      const auto* bytes = static_cast<const unsigned char*>(buffer.data) + i * kMiB;
      EXPECT_EQ(bytes[0], i + 1);
      EXPECT_EQ(bytes[kMiB - 1], i + 1);
    }
    for (uint64_t object : objects) session.Wait(session.Free(object));
    status = tierd.Status();
    EXPECT_EQ(status.pool_parts(0).used_bytes(), 0u);
    EXPECT_EQ(status.pool_parts(1).used_bytes(), 0u);
  }
  EXPECT_EQ(tierd.Stop(), 0);
}

TEST(PoolParts, WithoutGpusTheDefaultIsOneUnboundPart) {
  TierdProcess tierd;
  v1::GetStatusResponse status = tierd.Status();
  ASSERT_EQ(status.pool_parts_size(), 1);
  EXPECT_EQ(status.pool_parts(0).numa_node(), -1);
  EXPECT_EQ(status.pool_parts(0).capacity_bytes(), 64 * kMiB);
  EXPECT_EQ(status.pool_layout(), "1 part (auto, no GPUs): unbound");
  const std::string pools = Tierctl(tierd, "pools");
  EXPECT_NE(pools.find("\n   0     -  64.0 MiB   0 B  64.0 MiB  0.0%        0  -         0       0"
                       "    0\n"),
            std::string::npos)
      << pools;
}

TEST(PoolParts, PoolNumaNodeStillBindsTheOnePart) {
  if (!NodeZeroExists()) GTEST_SKIP() << "no NUMA node 0 in sysfs";
  TierdProcess tierd({"--pool_numa_node=0"});
  v1::GetStatusResponse status = tierd.Status();
  ASSERT_EQ(status.pool_parts_size(), 1);
  EXPECT_EQ(status.pool_parts(0).numa_node(), 0);
  EXPECT_EQ(status.pool_layout(), "1 part (pool_numa_node is set): node 0");
}

// A node the machine does not have: tierd refuses to start and says which nodes exist, for
// pool_numa_node and for a pool_numa list alike. The machine is a fake sysfs tree of one node.
TEST(PoolParts, ANodeThatDoesNotExistIsRefusedAtStart) {
  char pattern[] = "/tmp/tierd-parts-XXXXXX";
  ASSERT_NE(::mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  std::filesystem::create_directories(dir + "/sys/devices/system/node");
  std::ofstream(dir + "/sys/devices/system/node/online") << "0\n";
  for (const char* setting : {"--pool_numa_node=7", "--pool_numa=0,7"}) {
    auto [code, out] = testing::RunCommand(absl::StrCat(
        TIERD_BIN, " --socket=", dir, "/tierd.sock --state_dir=", dir,
        "/state --pool_bytes=64M --pool_lock=off --topology_sysfs_root=", dir, "/sys ", setting,
        " 2>&1"));
    EXPECT_NE(code, 0) << out;
    EXPECT_NE(out.find("NUMA node 7 does not exist on this machine (nodes online: 0)"),
              std::string::npos)
        << setting << ": " << out;
  }
  // Both at once is a settings error, before anything starts.
  auto [code, out] = testing::RunCommand(absl::StrCat(
      TIERD_BIN, " --socket=", dir, "/tierd.sock --state_dir=", dir,
      "/state --pool_bytes=64M --pool_numa=0 --pool_numa_node=0 2>&1"));
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("both place the pool"), std::string::npos) << out;
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

}  // namespace
}  // namespace tier
