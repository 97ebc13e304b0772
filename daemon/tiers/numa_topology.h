// What tierd knows of the machine's NUMA layout, read from sysfs once at start: which NUMA nodes
// exist, and for each GPU it serves (by PCI bus id, from the copy engine) the node its PCIe
// device sits on and the host bridge (PCIe root) it hangs off. The sysfs root is a parameter so
// that tests read a fake tree. Nothing here fails: what cannot be read is unknown (-1, ""), with
// the reason kept for the log.
#ifndef TIER_DAEMON_TIERS_NUMA_TOPOLOGY_H_
#define TIER_DAEMON_TIERS_NUMA_TOPOLOGY_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tier::daemon {

struct GpuLocation {
  int device = -1;         // the daemon's GPU ordinal
  std::string pci_bus_id;  // "0000:3b:00.0" (lower case, 4-digit domain); "" when unknown
  int numa_node = -1;      // -1: unknown (no NUMA, the firmware did not say, or unreadable)
  std::string pci_root;    // "pci0000:3a": the host bridge above it; "" when unknown
  std::string problem;     // why numa_node is unknown when sysfs could not say; "" otherwise
};

class NumaTopology {
 public:
  // `pci_bus_ids[i]` is GPU i's bus id as the GPU runtime gives it ("" when it did not); read
  // under `sysfs_root` (normally "/sys"): devices/system/node/online and, per GPU,
  // bus/pci/devices/<bus id>/numa_node and where that link points.
  static NumaTopology Read(const std::string& sysfs_root,
                           const std::vector<std::string>& pci_bus_ids);
  // A machine as given (tests).
  NumaTopology(std::vector<int> online_nodes, bool online_known, std::vector<GpuLocation> gpus)
      : online_nodes_(std::move(online_nodes)), online_known_(online_known),
        gpus_(std::move(gpus)) {}

  // The nodes the kernel lists online, ascending; meaningful only when online_known().
  const std::vector<int>& online_nodes() const { return online_nodes_; }
  // false where sysfs has no node list (a kernel without NUMA, a container without /sys).
  bool online_known() const { return online_known_; }
  // Whether `node` exists: true when online_known() is false (the kernel's mbind will say).
  bool HasNode(int node) const;
  const std::vector<GpuLocation>& gpus() const { return gpus_; }

 private:
  std::vector<int> online_nodes_;
  bool online_known_ = false;
  std::vector<GpuLocation> gpus_;
};

// "0000:3B:00.0" or NVML's "00000000:3B:00.0" -> "0000:3b:00.0"; INVALID_ARGUMENT for anything
// not of that form (it becomes a path under sysfs, so nothing else may pass).
absl::StatusOr<std::string> NormalizePciBusId(absl::string_view text);
// A sysfs numa_node file: a decimal node, or -1 (unknown); a trailing newline is allowed.
absl::StatusOr<int> ParseNumaNode(absl::string_view text);
// The kernel's node list syntax ("0", "0-3", "0,2-3\n"): ascending, no duplicates.
absl::StatusOr<std::vector<int>> ParseNodeList(absl::string_view text);
// "0-1,3" for {0, 1, 3} (the inverse of ParseNodeList), for messages.
std::string FormatNodeList(const std::vector<int>& nodes);

}  // namespace tier::daemon

#endif  // TIER_DAEMON_TIERS_NUMA_TOPOLOGY_H_
