#include "daemon/tiers/pool_layout.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tier::daemon {
namespace {

std::string NodesText(const NumaTopology& topology) {
  return topology.online_known() ? FormatNodeList(topology.online_nodes()) : "unknown";
}

absl::Status NoSuchNode(absl::string_view setting, int node, const NumaTopology& topology) {
  return absl::FailedPreconditionError(
      absl::StrCat(setting, ": NUMA node ", node, " does not exist on this machine (nodes online: ",
                   NodesText(topology), ")"));
}

std::string PartText(const PoolLayout::Part& part) {
  std::string text = part.numa_node < 0 ? "unbound" : absl::StrCat("node ", part.numa_node);
  if (!part.gpus.empty()) absl::StrAppend(&text, " (GPUs ", absl::StrJoin(part.gpus, ","), ")");
  return text;
}

// Why `gpu` has no part of its own, for the log.
std::string Homeless(const GpuLocation& gpu) {
  std::string text = absl::StrCat("GPU ", gpu.device);
  if (!gpu.pci_bus_id.empty()) absl::StrAppend(&text, " (", gpu.pci_bus_id, ")");
  if (gpu.numa_node >= 0) {
    absl::StrAppend(&text, " is on NUMA node ", gpu.numa_node, ", which has no pool part");
  } else {
    absl::StrAppend(&text, ": NUMA node unknown");
    if (!gpu.problem.empty()) absl::StrAppend(&text, " (", gpu.problem, ")");
  }
  absl::StrAppend(&text, "; its offloads take host memory from any part");
  return text;
}

// One part holding every GPU.
PoolLayout OnePart(int numa_node, const NumaTopology& topology) {
  PoolLayout layout;
  PoolLayout::Part part;
  part.numa_node = numa_node;
  for (const GpuLocation& gpu : topology.gpus()) part.gpus.push_back(gpu.device);
  layout.parts.push_back(part);
  layout.part_of_gpu.assign(topology.gpus().size(), 0);
  return layout;
}

// Parts for `nodes` in that order; each GPU goes to a part of its own node, in turn among that
// node's parts; the others to none.
PoolLayout PartsFor(const std::vector<int>& nodes, const NumaTopology& topology) {
  PoolLayout layout;
  std::map<int, std::vector<int>> parts_of_node;
  for (size_t i = 0; i < nodes.size(); ++i) {
    layout.parts.push_back(PoolLayout::Part{nodes[i], {}});
    parts_of_node[nodes[i]].push_back(static_cast<int>(i));
  }
  std::map<int, size_t> dealt;  // per node: GPUs given out so far
  layout.part_of_gpu.assign(topology.gpus().size(), storage::HostPool::kAnyPart);
  for (const GpuLocation& gpu : topology.gpus()) {
    auto it = parts_of_node.find(gpu.numa_node);
    if (gpu.device < 0 || static_cast<size_t>(gpu.device) >= layout.part_of_gpu.size()) continue;
    if (gpu.numa_node < 0 || it == parts_of_node.end()) {
      layout.warnings.push_back(Homeless(gpu));
      continue;
    }
    const int part = it->second[dealt[gpu.numa_node]++ % it->second.size()];
    layout.parts[part].gpus.push_back(gpu.device);
    layout.part_of_gpu[gpu.device] = part;
  }
  return layout;
}

}  // namespace

std::vector<storage::PoolPartOptions> PoolLayout::PartOptions() const {
  std::vector<storage::PoolPartOptions> options;
  for (const Part& part : parts) {
    options.push_back(storage::PoolPartOptions{
        part.numa_node, std::max<uint64_t>(1, static_cast<uint64_t>(part.gpus.size()))});
  }
  return options;
}

absl::StatusOr<PoolLayout> PlanPoolLayout(const PoolNuma& pool_numa, int pool_numa_node,
                                          const NumaTopology& topology) {
  PoolLayout layout;
  std::string why;
  if (pool_numa.mode == PoolNuma::Mode::kNodes) {
    if (pool_numa.nodes.empty()) return absl::InvalidArgumentError("pool_numa: no nodes listed");
    for (int node : pool_numa.nodes) {
      if (!topology.HasNode(node)) return NoSuchNode("pool_numa", node, topology);
    }
    layout = PartsFor(pool_numa.nodes, topology);
    why = "pool_numa lists the nodes";
  } else if (pool_numa.mode == PoolNuma::Mode::kOff || pool_numa_node >= 0) {
    if (pool_numa_node >= 0 && !topology.HasNode(pool_numa_node)) {
      return NoSuchNode("pool_numa_node", pool_numa_node, topology);
    }
    layout = OnePart(pool_numa_node, topology);
    why = pool_numa.mode == PoolNuma::Mode::kOff ? "pool_numa = off" : "pool_numa_node is set";
  } else {
    // auto: split by where the GPUs are, when they are on more than one node.
    std::set<int> gpu_nodes;
    for (const GpuLocation& gpu : topology.gpus()) {
      if (gpu.numa_node >= 0) gpu_nodes.insert(gpu.numa_node);
    }
    std::vector<int> missing;
    for (int node : gpu_nodes) {
      if (!topology.HasNode(node)) missing.push_back(node);
    }
    if (!missing.empty()) {
      layout = OnePart(-1, topology);
      layout.warnings.push_back(absl::StrCat(
          "pool_numa = auto: the GPUs' NUMA nodes (", absl::StrJoin(gpu_nodes, ","),
          ") are not all online (nodes online: ", NodesText(topology),
          "); one unbound pool part"));
      why = "auto, GPU nodes not online";
    } else if (gpu_nodes.size() < 2) {
      layout = OnePart(-1, topology);
      if (topology.gpus().empty()) {
        why = "auto, no GPUs";
      } else {
        why = gpu_nodes.empty() ? "auto, GPUs' NUMA nodes unknown" : "auto, GPUs on one NUMA node";
      }
    } else {
      layout = PartsFor(std::vector<int>(gpu_nodes.begin(), gpu_nodes.end()), topology);
      why = "auto, GPUs on several NUMA nodes";
    }
  }
  std::vector<std::string> parts;
  for (const PoolLayout::Part& part : layout.parts) parts.push_back(PartText(part));
  layout.summary = absl::StrCat(layout.parts.size(), layout.parts.size() == 1 ? " part" : " parts",
                                " (", why, "): ", absl::StrJoin(parts, "; "));
  return layout;
}

}  // namespace tier::daemon
