// Reading the NUMA and PCI topology from sysfs, on a fake tree in a temporary directory: a machine
// of two nodes and four GPUs (two under each socket's host bridge), plus GPUs whose files are
// missing, say -1, or hold garbage. Nothing read from sysfs may fail tierd; what cannot be read is
// unknown, with the reason.
#include "daemon/tiers/numa_topology.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tier::daemon {
namespace {

namespace fs = std::filesystem;

class FakeSysfs {
 public:
  FakeSysfs() {
    std::string pattern = (fs::temp_directory_path() / "tierd-sysfs-XXXXXX").string();
    root_ = ::mkdtemp(pattern.data()) ? pattern : "";
  }
  ~FakeSysfs() {
    std::error_code ignored;
    fs::remove_all(root_, ignored);
  }
  const std::string& root() const { return root_; }

  void Write(const std::string& relative, const std::string& text) {
    fs::create_directories((fs::path(root_) / relative).parent_path());
    std::ofstream(fs::path(root_) / relative) << text;
  }
  // A PCI device as the kernel shows it: the real directory under devices/pciDDDD:BB/..., and
  // bus/pci/devices/<id> a link to it; its numa_node file holds `numa_node` unless that is null.
  void AddPciDevice(const std::string& root_bridge, const std::string& id, const char* numa_node) {
    const std::string real = "devices/" + root_bridge + "/0000:00:01.0/" + id;
    fs::create_directories(fs::path(root_) / real);
    if (numa_node != nullptr) Write(real + "/numa_node", numa_node);
    fs::create_directories(fs::path(root_) / "bus/pci/devices");
    fs::create_symlink("../../../" + real, fs::path(root_) / "bus/pci/devices" / id);
  }

 private:
  std::string root_;
};

// Two sockets, two GPUs under each one's host bridge.
void TwoSocketsFourGpus(FakeSysfs& sysfs) {
  sysfs.Write("devices/system/node/online", "0-1\n");
  sysfs.AddPciDevice("pci0000:17", "0000:18:00.0", "0\n");
  sysfs.AddPciDevice("pci0000:17", "0000:19:00.0", "0\n");
  sysfs.AddPciDevice("pci0000:ae", "0000:af:00.0", "1\n");
  sysfs.AddPciDevice("pci0000:ae", "0000:b0:00.0", "1\n");
}

TEST(NumaTopology, ReadsEachGpusNodeAndHostBridge) {
  FakeSysfs sysfs;
  ASSERT_FALSE(sysfs.root().empty());
  TwoSocketsFourGpus(sysfs);
  // As the CUDA runtime writes them (upper case) and as NVML does (8-digit domain).
  NumaTopology topology = NumaTopology::Read(
      sysfs.root(), {"0000:18:00.0", "0000:19:00.0", "0000:AF:00.0", "00000000:B0:00.0"});
  EXPECT_TRUE(topology.online_known());
  EXPECT_EQ(topology.online_nodes(), (std::vector<int>{0, 1}));
  EXPECT_TRUE(topology.HasNode(1));
  EXPECT_FALSE(topology.HasNode(2));
  ASSERT_EQ(topology.gpus().size(), 4u);
  const std::vector<std::string> ids = {"0000:18:00.0", "0000:19:00.0", "0000:af:00.0",
                                        "0000:b0:00.0"};
  for (int i = 0; i < 4; ++i) {
    const GpuLocation& gpu = topology.gpus()[i];
    EXPECT_EQ(gpu.device, i);
    EXPECT_EQ(gpu.pci_bus_id, ids[i]);
    EXPECT_EQ(gpu.numa_node, i < 2 ? 0 : 1) << i;
    EXPECT_EQ(gpu.pci_root, i < 2 ? "pci0000:17" : "pci0000:ae") << i;
    EXPECT_EQ(gpu.problem, "") << i;
  }
}

TEST(NumaTopology, WhatCannotBeReadIsUnknownWithTheReason) {
  FakeSysfs sysfs;
  ASSERT_FALSE(sysfs.root().empty());
  sysfs.Write("devices/system/node/online", "0\n");
  sysfs.AddPciDevice("pci0000:00", "0000:01:00.0", "-1\n");      // the firmware did not say
  sysfs.AddPciDevice("pci0000:00", "0000:02:00.0", "banana\n");  // garbage
  sysfs.AddPciDevice("pci0000:00", "0000:03:00.0", nullptr);     // no numa_node file
  sysfs.AddPciDevice("pci0000:00", "0000:05:00.0", "99999\n");   // out of range
  NumaTopology topology = NumaTopology::Read(
      sysfs.root(), {"0000:01:00.0", "0000:02:00.0", "0000:03:00.0", "0000:04:00.0", "",
                     "../../etc:00.0", "0000:05:00.0"});
  ASSERT_EQ(topology.gpus().size(), 7u);
  for (const GpuLocation& gpu : topology.gpus()) EXPECT_EQ(gpu.numa_node, -1) << gpu.device;
  EXPECT_EQ(topology.gpus()[0].problem, "");  // -1 is an answer, not a problem
  EXPECT_EQ(topology.gpus()[0].pci_root, "pci0000:00");
  EXPECT_NE(topology.gpus()[1].problem.find("banana"), std::string::npos);
  EXPECT_NE(topology.gpus()[2].problem.find("cannot read"), std::string::npos);
  EXPECT_NE(topology.gpus()[3].problem.find("0000:04:00.0"), std::string::npos);  // no device
  EXPECT_EQ(topology.gpus()[3].pci_root, "");
  EXPECT_NE(topology.gpus()[4].problem.find("no PCI bus id"), std::string::npos);
  EXPECT_EQ(topology.gpus()[5].pci_bus_id, "");  // never a path outside the tree
  EXPECT_NE(topology.gpus()[5].problem.find("not a PCI bus id"), std::string::npos);
  EXPECT_NE(topology.gpus()[6].problem.find("99999"), std::string::npos);
}

TEST(NumaTopology, NoSysfsMeansNodesUnknown) {
  NumaTopology topology = NumaTopology::Read("/nonexistent-tierd-sysfs", {"0000:01:00.0"});
  EXPECT_FALSE(topology.online_known());
  EXPECT_TRUE(topology.HasNode(3));  // mbind will say
  ASSERT_EQ(topology.gpus().size(), 1u);
  EXPECT_EQ(topology.gpus()[0].numa_node, -1);
  EXPECT_NE(topology.gpus()[0].problem, "");
}

TEST(NumaTopology, GarbageNodeListIsUnknown) {
  FakeSysfs sysfs;
  ASSERT_FALSE(sysfs.root().empty());
  sysfs.Write("devices/system/node/online", "zero\n");
  EXPECT_FALSE(NumaTopology::Read(sysfs.root(), {}).online_known());
}

TEST(NumaTopology, TheRealMachineHasItsNodes) {
  // This machine (and any Linux with NUMA in sysfs) lists node 0 online.
  NumaTopology topology = NumaTopology::Read("/sys", {});
  if (!topology.online_known()) GTEST_SKIP() << "no /sys/devices/system/node/online here";
  EXPECT_TRUE(topology.HasNode(topology.online_nodes().front()));
  EXPECT_TRUE(topology.gpus().empty());
}

TEST(NormalizePciBusId, AcceptsTheRuntimesFormsOnly) {
  EXPECT_EQ(*NormalizePciBusId("0000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(*NormalizePciBusId("00000000:3b:00.1"), "0000:3b:00.1");
  EXPECT_EQ(*NormalizePciBusId("0001:c1:1f.7"), "0001:c1:1f.7");
  for (const char* bad :
       {"", "3b:00.0", "0000:3b:00", "0000:3b:00.8", "0000:3g:00.0", "00010000:3b:00.0",
        "0000:3b:00.0/..", "0000:3b:000.0", "0000:3b:00.0 "}) {
    EXPECT_FALSE(NormalizePciBusId(bad).ok()) << bad;
  }
}

TEST(ParseNumaNode, NodesAndMinusOne) {
  EXPECT_EQ(*ParseNumaNode("0\n"), 0);
  EXPECT_EQ(*ParseNumaNode("7"), 7);
  EXPECT_EQ(*ParseNumaNode("-1\n"), -1);
  for (const char* bad : {"", "-2", "1x", " 1", "1024", "+1", "0x1"}) {
    EXPECT_FALSE(ParseNumaNode(bad).ok()) << bad;
  }
}

TEST(ParseNodeList, KernelSyntax) {
  EXPECT_EQ(*ParseNodeList("0\n"), (std::vector<int>{0}));
  EXPECT_EQ(*ParseNodeList("0-3"), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(*ParseNodeList("0,2-3,5\n"), (std::vector<int>{0, 2, 3, 5}));
  EXPECT_EQ(*ParseNodeList(""), (std::vector<int>{}));
  for (const char* bad : {"3-1", "1,0", "0,0", "a", "0-", ",", "0-1-2", "2000"}) {
    EXPECT_FALSE(ParseNodeList(bad).ok()) << bad;
  }
  EXPECT_EQ(FormatNodeList({0, 1, 3, 5, 6, 7}), "0-1,3,5-7");
  EXPECT_EQ(FormatNodeList({}), "");
}

}  // namespace
}  // namespace tier::daemon
