// How the host pool is split over NUMA nodes, decided once at start from the settings
// (pool_numa, pool_numa_node) and the machine (daemon/tiers/numa_topology.h): the parts in address
// order, each with its node and the GPUs local to it, and for each GPU the part its offloads
// take extents from first. A pure function of its inputs, so every rule is a unit test.
//
// The rules (docs/architecture.md, "The host pool"):
// - off, or auto with pool_numa_node set: one part, bound to pool_numa_node (or unbound), every
//   GPU's;
// - auto: one part per NUMA node that has GPUs, in node order, when at least two nodes have;
//   else one unbound part, as before there were parts;
// - a node list: one part per entry in that order; a node listed twice gets two parts and its
//   GPUs are dealt to them in turn;
// - a part's share of the pool is proportional to its GPUs, counting at least one each (so a
//   listed node without GPUs still gets a GPU's share, and with no GPUs at all, e.g. the host
//   engine, the parts are equal);
// - a GPU whose node is unknown or has no part takes extents wherever there is most room;
// - binding to a node the machine does not have is an error naming the nodes it has, except
//   under auto, which falls back to one unbound part with a warning.
#ifndef TIER_DAEMON_TIERS_POOL_LAYOUT_H_
#define TIER_DAEMON_TIERS_POOL_LAYOUT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/config/config.h"
#include "daemon/tiers/numa_topology.h"
#include "storage/host_pool.h"

namespace tier::daemon {

struct PoolLayout {
  struct Part {
    int numa_node = -1;     // -1: not bound
    std::vector<int> gpus;  // GPU ordinals local to it (ascending)
  };
  std::vector<Part> parts;
  // Index: GPU ordinal; the part it prefers, or -1 (storage::HostPool::kAnyPart).
  std::vector<int> part_of_gpu;
  std::string summary;                // one line for the log and the status API
  std::vector<std::string> warnings;  // for the log

  // What storage::HostPool::Create takes.
  std::vector<storage::PoolPartOptions> PartOptions() const;
};

absl::StatusOr<PoolLayout> PlanPoolLayout(const PoolNuma& pool_numa, int pool_numa_node,
                                          const NumaTopology& topology);

}  // namespace tier::daemon

#endif  // TIER_DAEMON_TIERS_POOL_LAYOUT_H_
