// How the host pool is split over NUMA nodes (daemon/tiers/pool_layout.h), one rule per test, on
// machines given by hand: which parts, on which nodes, with which GPUs, their shares, and what a
// node that does not exist does.
#include "daemon/tiers/pool_layout.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tier::daemon {
namespace {

GpuLocation Gpu(int device, int node) {
  GpuLocation gpu;
  gpu.device = device;
  gpu.pci_bus_id = "0000:0" + std::to_string(device) + ":00.0";
  gpu.numa_node = node;
  return gpu;
}

// Two sockets, GPUs 0 and 1 on node 0, 2 and 3 on node 1.
NumaTopology TwoSockets() {
  return NumaTopology({0, 1}, true, {Gpu(0, 0), Gpu(1, 0), Gpu(2, 1), Gpu(3, 1)});
}

PoolNuma Auto() { return PoolNuma{PoolNuma::Mode::kAuto, {}}; }
PoolNuma Off() { return PoolNuma{PoolNuma::Mode::kOff, {}}; }
PoolNuma Nodes(std::vector<int> nodes) { return PoolNuma{PoolNuma::Mode::kNodes, nodes}; }

std::vector<int> Nodes(const PoolLayout& layout) {
  std::vector<int> nodes;
  for (const PoolLayout::Part& part : layout.parts) nodes.push_back(part.numa_node);
  return nodes;
}

std::vector<uint64_t> Weights(const PoolLayout& layout) {
  std::vector<uint64_t> weights;
  for (const storage::PoolPartOptions& part : layout.PartOptions()) weights.push_back(part.weight);
  return weights;
}

TEST(PoolLayout, AutoSplitsByTheGpusNodes) {
  absl::StatusOr<PoolLayout> layout = PlanPoolLayout(Auto(), -1, TwoSockets());
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(Nodes(*layout), (std::vector<int>{0, 1}));
  EXPECT_EQ(layout->parts[0].gpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(layout->parts[1].gpus, (std::vector<int>{2, 3}));
  EXPECT_EQ(layout->part_of_gpu, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(Weights(*layout), (std::vector<uint64_t>{2, 2}));
  EXPECT_EQ(layout->summary,
            "2 parts (auto, GPUs on several NUMA nodes): node 0 (GPUs 0,1); node 1 (GPUs 2,3)");
  EXPECT_TRUE(layout->warnings.empty());
}

TEST(PoolLayout, AutoSharesFollowTheGpuCount) {
  // Three GPUs on node 1, one on node 0: node 1's part is three times node 0's.
  NumaTopology topology({0, 1}, true, {Gpu(0, 1), Gpu(1, 0), Gpu(2, 1), Gpu(3, 1)});
  absl::StatusOr<PoolLayout> layout = PlanPoolLayout(Auto(), -1, topology);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(Nodes(*layout), (std::vector<int>{0, 1}));
  EXPECT_EQ(Weights(*layout), (std::vector<uint64_t>{1, 3}));
  EXPECT_EQ(layout->part_of_gpu, (std::vector<int>{1, 0, 1, 1}));
}

TEST(PoolLayout, AutoKeepsOnePartWhenTheGpusShareANodeOrThereAreNone) {
  for (const NumaTopology& topology :
       {NumaTopology({0, 1}, true, {Gpu(0, 1), Gpu(1, 1)}), NumaTopology({0}, true, {}),
        NumaTopology({0, 1}, true, {Gpu(0, -1), Gpu(1, -1)})}) {
    absl::StatusOr<PoolLayout> layout = PlanPoolLayout(Auto(), -1, topology);
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_EQ(Nodes(*layout), (std::vector<int>{-1})) << layout->summary;
    EXPECT_EQ(layout->part_of_gpu, std::vector<int>(topology.gpus().size(), 0));
  }
}

TEST(PoolLayout, AutoGpuOfUnknownNodeTakesAnyPart) {
  NumaTopology topology({0, 1}, true, {Gpu(0, 0), Gpu(1, 1), Gpu(2, -1)});
  absl::StatusOr<PoolLayout> layout = PlanPoolLayout(Auto(), -1, topology);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(Nodes(*layout), (std::vector<int>{0, 1}));
  EXPECT_EQ(layout->part_of_gpu, (std::vector<int>{0, 1, storage::HostPool::kAnyPart}));
  ASSERT_EQ(layout->warnings.size(), 1u);
  EXPECT_NE(layout->warnings[0].find("GPU 2"), std::string::npos) << layout->warnings[0];
}

TEST(PoolLayout, AutoFallsBackWhenAGpusNodeIsNotOnline) {
  NumaTopology topology({0}, true, {Gpu(0, 0), Gpu(1, 3)});
  absl::StatusOr<PoolLayout> layout = PlanPoolLayout(Auto(), -1, topology);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(Nodes(*layout), (std::vector<int>{-1}));
  ASSERT_EQ(layout->warnings.size(), 1u);
  EXPECT_NE(layout->warnings[0].find("not all online"), std::string::npos);
}

TEST(PoolLayout, PoolNumaNodeBindsOnePartAsBefore) {
  for (PoolNuma numa : {Auto(), Off()}) {
    absl::StatusOr<PoolLayout> layout = PlanPoolLayout(numa, 1, TwoSockets());
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_EQ(Nodes(*layout), (std::vector<int>{1}));
    EXPECT_EQ(layout->parts[0].gpus, (std::vector<int>{0, 1, 2, 3}));
    EXPECT_EQ(layout->part_of_gpu, (std::vector<int>{0, 0, 0, 0}));
  }
  absl::StatusOr<PoolLayout> off = PlanPoolLayout(Off(), -1, TwoSockets());
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(Nodes(*off), (std::vector<int>{-1}));
}

TEST(PoolLayout, ANodeThatDoesNotExistIsAClearError) {
  absl::StatusOr<PoolLayout> single = PlanPoolLayout(Auto(), 5, TwoSockets());
  ASSERT_FALSE(single.ok());
  EXPECT_EQ(single.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(single.status().message(),
            "pool_numa_node: NUMA node 5 does not exist on this machine (nodes online: 0-1)");
  absl::StatusOr<PoolLayout> listed = PlanPoolLayout(Nodes({0, 2}), -1, TwoSockets());
  ASSERT_FALSE(listed.ok());
  EXPECT_EQ(listed.status().message(),
            "pool_numa: NUMA node 2 does not exist on this machine (nodes online: 0-1)");
  // Where sysfs lists no nodes, mbind is left to say.
  EXPECT_TRUE(PlanPoolLayout(Nodes({2}), -1, NumaTopology({}, false, {})).ok());
}

TEST(PoolLayout, ListedNodesInTheirOrderGpusDealtAmongANodesParts) {
  absl::StatusOr<PoolLayout> layout = PlanPoolLayout(Nodes({1, 0, 1}), -1, TwoSockets());
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(Nodes(*layout), (std::vector<int>{1, 0, 1}));
  EXPECT_EQ(layout->parts[0].gpus, (std::vector<int>{2}));
  EXPECT_EQ(layout->parts[1].gpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(layout->parts[2].gpus, (std::vector<int>{3}));
  EXPECT_EQ(layout->part_of_gpu, (std::vector<int>{1, 1, 0, 2}));
  EXPECT_EQ(Weights(*layout), (std::vector<uint64_t>{1, 2, 1}));
}

TEST(PoolLayout, ListedNodeWithoutGpusGetsOneGpusShare) {
  // Only node 0 listed: node 1's GPUs have no part of their own.
  absl::StatusOr<PoolLayout> layout = PlanPoolLayout(Nodes({0}), -1, TwoSockets());
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->part_of_gpu, (std::vector<int>{0, 0, -1, -1}));
  EXPECT_EQ(layout->warnings.size(), 2u);
  // No GPUs at all (the host engine): equal parts.
  absl::StatusOr<PoolLayout> host = PlanPoolLayout(Nodes({0, 0}), -1, NumaTopology({0}, true, {}));
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(Weights(*host), (std::vector<uint64_t>{1, 1}));
  EXPECT_EQ(host->summary, "2 parts (pool_numa lists the nodes): node 0; node 0");
}

}  // namespace
}  // namespace tier::daemon
