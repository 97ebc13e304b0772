// Where the GPUs the copy engine serves sit on the PCIe bus, for the daemon's NUMA topology
// (daemon/tiers/numa_topology.h): the daemon includes no GPU runtime header, so it asks here.
#ifndef TIER_ENGINE_GPU_PCI_H_
#define TIER_ENGINE_GPU_PCI_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tier::engine {

// The PCI bus id of each GPU the engine named `engine_name` (CopyEngine::name()) serves, indexed
// by the engine's GPU ordinal (ImportedBuffer::device()), as the runtime writes it; "" for a GPU
// whose id the runtime would not give. Empty for the host engine.
std::vector<std::string> GpuPciBusIds(absl::string_view engine_name);

}  // namespace tier::engine

#endif  // TIER_ENGINE_GPU_PCI_H_
