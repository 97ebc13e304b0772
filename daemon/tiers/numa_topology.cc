#include "daemon/tiers/numa_topology.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tier::daemon {
namespace {

constexpr int kMaxNode = 1023;  // as pool_numa_node; the kernel's MAX_NUMNODES is at most 1024

// The whole file, or nullopt where it cannot be opened.
std::optional<std::string> ReadSmallFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return std::nullopt;
  return text;
}

bool IsHex(absl::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return absl::ascii_isxdigit(static_cast<unsigned char>(c));
  });
}

bool IsDecimal(absl::string_view text) {
  return !text.empty() && text.size() <= 4 && std::all_of(text.begin(), text.end(), [](char c) {
    return absl::ascii_isdigit(static_cast<unsigned char>(c));
  });
}

absl::StatusOr<int> ParseNode(absl::string_view text) {
  int node = 0;
  if (!IsDecimal(text) || !absl::SimpleAtoi(text, &node) || node > kMaxNode) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a NUMA node (0..", kMaxNode, ")"));
  }
  return node;
}

// The host bridge of a PCI device from where its sysfs link points:
// ../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0 -> pci0000:3a.
std::string PciRootOf(const std::filesystem::path& device_link) {
  std::error_code error;
  if (!std::filesystem::is_symlink(device_link, error)) return "";
  std::filesystem::path target = std::filesystem::read_symlink(device_link, error);
  if (error) return "";
  for (const std::filesystem::path& part : target) {
    const std::string name = part.string();
    if (name.rfind("pci", 0) == 0 && name.size() > 3) return name;
  }
  return "";
}

}  // namespace

absl::StatusOr<std::string> NormalizePciBusId(absl::string_view text) {
  // domain:bus:device.function, the domain 4 or 8 hex digits (NVML pads it to 8).
  const auto bad = [text] {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a PCI bus id (expected DDDD:BB:DD.F)"));
  };
  std::vector<absl::string_view> fields = absl::StrSplit(text, ':');
  if (fields.size() != 3) return bad();
  absl::string_view domain = fields[0];
  std::vector<absl::string_view> slot = absl::StrSplit(fields[2], '.');
  if (slot.size() != 2) return bad();
  if ((domain.size() != 4 && domain.size() != 8) || !IsHex(domain) || fields[1].size() != 2 ||
      !IsHex(fields[1]) || slot[0].size() != 2 || !IsHex(slot[0]) || slot[1].size() != 1 ||
      slot[1][0] < '0' || slot[1][0] > '7') {
    return bad();
  }
  if (domain.size() == 8) {
    if (domain.substr(0, 4) != "0000") return bad();  // sysfs names 16-bit domains only
    domain = domain.substr(4);
  }
  return absl::AsciiStrToLower(absl::StrCat(domain, ":", fields[1], ":", slot[0], ".", slot[1]));
}

absl::StatusOr<int> ParseNumaNode(absl::string_view text) {
  text = absl::StripTrailingAsciiWhitespace(text);
  if (text == "-1") return -1;
  return ParseNode(text);
}

absl::StatusOr<std::vector<int>> ParseNodeList(absl::string_view text) {
  text = absl::StripTrailingAsciiWhitespace(text);
  std::vector<int> nodes;
  if (text.empty()) return nodes;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> range = absl::StrSplit(item, absl::MaxSplits('-', 1));
    absl::StatusOr<int> first = ParseNode(range[0]);
    if (!first.ok()) return first.status();
    absl::StatusOr<int> last = range.size() == 2 ? ParseNode(range[1]) : first;
    if (!last.ok()) return last.status();
    if (*last < *first || (!nodes.empty() && *first <= nodes.back())) {
      return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not an ascending node list"));
    }
    for (int node = *first; node <= *last; ++node) nodes.push_back(node);
  }
  return nodes;
}

std::string FormatNodeList(const std::vector<int>& nodes) {
  std::vector<std::string> items;
  for (size_t i = 0; i < nodes.size();) {
    size_t j = i;
    while (j + 1 < nodes.size() && nodes[j + 1] == nodes[j] + 1) ++j;
    items.push_back(j == i ? absl::StrCat(nodes[i]) : absl::StrCat(nodes[i], "-", nodes[j]));
    i = j + 1;
  }
  return absl::StrJoin(items, ",");
}

NumaTopology NumaTopology::Read(const std::string& sysfs_root,
                                const std::vector<std::string>& pci_bus_ids) {
  const std::filesystem::path root(sysfs_root);
  std::vector<int> online;
  bool online_known = false;
  if (std::optional<std::string> text = ReadSmallFile(root / "devices/system/node/online")) {
    absl::StatusOr<std::vector<int>> nodes = ParseNodeList(*text);
    if (nodes.ok() && !nodes->empty()) {
      online = *std::move(nodes);
      online_known = true;
    }
  }
  std::vector<GpuLocation> gpus;
  for (size_t i = 0; i < pci_bus_ids.size(); ++i) {
    GpuLocation gpu;
    gpu.device = static_cast<int>(i);
    absl::StatusOr<std::string> id = NormalizePciBusId(pci_bus_ids[i]);
    if (!id.ok()) {
      gpu.problem = pci_bus_ids[i].empty() ? "the GPU runtime gave no PCI bus id"
                                           : std::string(id.status().message());
      gpus.push_back(std::move(gpu));
      continue;
    }
    gpu.pci_bus_id = *id;
    const std::filesystem::path device = root / "bus/pci/devices" / *id;
    gpu.pci_root = PciRootOf(device);
    std::optional<std::string> text = ReadSmallFile(device / "numa_node");
    if (!text) {
      gpu.problem = absl::StrCat("cannot read ", (device / "numa_node").string());
    } else if (absl::StatusOr<int> node = ParseNumaNode(*text); !node.ok()) {
      gpu.problem = absl::StrCat((device / "numa_node").string(), ": ", node.status().message());
    } else {
      gpu.numa_node = *node;
    }
    gpus.push_back(std::move(gpu));
  }
  return NumaTopology(std::move(online), online_known, std::move(gpus));
}

bool NumaTopology::HasNode(int node) const {
  if (!online_known_) return node >= 0;
  return std::binary_search(online_nodes_.begin(), online_nodes_.end(), node);
}

}  // namespace tier::daemon
