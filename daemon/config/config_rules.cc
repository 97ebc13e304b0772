// The rules between settings, and the settings derived from others (Finalize).
#include <sys/un.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "daemon/config/config.h"
#include "daemon/config/config_keys.h"
#include "daemon/config/config_values.h"
#include "storage/io_queue.h"

namespace tier::daemon {
namespace {

// This Abseil build has its own string_view type; the public header speaks std::string_view.
absl::string_view ToAbsl(std::string_view text) {
  return absl::string_view(text.data(), text.size());
}

}  // namespace

absl::Status CheckMetricsListen(std::string_view value_in) {
  absl::string_view value = ToAbsl(value_in);
  if (value.empty()) return absl::OkStatus();
  const auto bad = [value](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", value, "': ", why, "; expected HOST:PORT, e.g. 127.0.0.1:9477"));
  };
  if (absl::StartsWith(value, "/") || absl::StartsWith(value, "unix:")) {
    return bad("a Unix socket is not supported: the metrics exporter listens on TCP only");
  }
  const size_t colon = value.rfind(':');
  if (colon == absl::string_view::npos) return bad("no port");
  absl::string_view host = value.substr(0, colon);
  absl::string_view port = value.substr(colon + 1);
  absl::StatusOr<uint64_t> number = config::ParseUnsigned(port);
  if (!number.ok() || *number == 0 || *number > 65535) return bad("the port must be 1..65535");
  if (absl::StartsWith(host, "[")) {
    // [IPv6]: hex digits, ':' and '.' (a mapped IPv4 address) between the brackets.
    if (host.size() < 3 || !absl::EndsWith(host, "]")) return bad("an unclosed [IPv6] address");
    for (char c : host.substr(1, host.size() - 2)) {
      if (!absl::ascii_isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.') {
        return bad("not an IPv6 address");
      }
    }
    return absl::OkStatus();
  }
  if (host.empty()) return bad("no host (0.0.0.0 listens on every interface)");
  for (char c : host) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-') {
      return bad("not a host name or IPv4 address");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ParseMemAvailable(std::string_view meminfo_text) {
  for (absl::string_view line : absl::StrSplit(ToAbsl(meminfo_text), '\n')) {
    if (!absl::ConsumePrefix(&line, "MemAvailable:")) continue;
    // "MemAvailable:   12345678 kB"
    std::vector<absl::string_view> fields =
        absl::StrSplit(absl::StripAsciiWhitespace(line), ' ', absl::SkipEmpty());
    uint64_t number = 0;
    if (fields.empty() || fields.size() > 2 || !config::AllDigits(fields[0]) ||
        !absl::SimpleAtoi(fields[0], &number)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot parse meminfo line 'MemAvailable:", line, "'"));
    }
    if (fields.size() == 1) return number;  // no unit: bytes
    if (!absl::EqualsIgnoreCase(fields[1], "kB")) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected unit '", fields[1], "' in meminfo"));
    }
    if (number > (std::numeric_limits<uint64_t>::max() >> 10)) {
      return absl::InvalidArgumentError("MemAvailable overflows 64 bits");
    }
    return number << 10;
  }
  return absl::FailedPreconditionError("no MemAvailable line in meminfo (kernel before 3.14?)");
}

uint64_t DerivePoolBytes(double fraction, uint64_t mem_available_bytes, uint64_t max_bytes) {
  double share = fraction * static_cast<double>(mem_available_bytes);
  uint64_t bytes =
      share >= static_cast<double>(max_bytes) ? max_bytes : static_cast<uint64_t>(share);
  bytes -= bytes % kPoolGranuleBytes;
  return std::max(bytes, kMinDerivedPoolBytes);
}

absl::Status Finalize(Config* config) {
  namespace fs = std::filesystem;
  if (config->session_socket_path.empty()) {
    config->session_socket_path =
        (fs::path(config->socket_path).parent_path() / "tierd.session.sock").string();
  }
  if (config->spill_dirs.empty()) {
    config->spill_dirs = {(fs::path(config->state_dir) / "spill").string()};
  }

  // Re-check what setters check, for configs built in code rather than parsed.
  for (absl::string_view name :
       {"socket", "session_socket", "state_dir", "spill_dir", "topology_sysfs_root", "pool_numa"}) {
    const config::Key* key = config::FindKey(name);
    if (absl::Status status = key->set(key->print(*config), *config); !status.ok()) return status;
  }
  // bind() takes at most sizeof(sun_path) - 1 bytes; catch it here, naming the setting.
  constexpr size_t kMaxSocketPath = sizeof(sockaddr_un::sun_path) - 1;
  for (auto [name, path] :
       {std::pair<absl::string_view, const std::string*>{"socket", &config->socket_path},
        {"session_socket", &config->session_socket_path}}) {
    if (path->size() > kMaxSocketPath) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": '", *path, "' is longer than the ",
                                                     kMaxSocketPath,
                                                     " bytes a Unix socket path may have"));
    }
  }
  if (config->socket_path == config->session_socket_path) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket and session_socket are both ", config->socket_path));
  }
  if (config->pool_numa.mode == PoolNuma::Mode::kNodes && config->pool_numa_node >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool_numa_node (", config->pool_numa_node, ") and a pool_numa node list (",
        absl::StrJoin(config->pool_numa.nodes, ","),
        ") both place the pool: set one (pool_numa_node binds one part; the list makes one part "
        "per node)"));
  }
  if (config->spill_low_pct > config->spill_high_pct) {
    return absl::InvalidArgumentError(absl::StrCat("spill_low_pct (", config->spill_low_pct,
                                                   ") exceeds spill_high_pct (",
                                                   config->spill_high_pct, ")"));
  }
  if (uint64_t{config->spill_queue_depth} * config->spill_dirs.size() > storage::kMaxIoQueueDepth) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spill_queue_depth (", config->spill_queue_depth, ") x ", config->spill_dirs.size(),
        " spill directories exceeds the ", storage::kMaxIoQueueDepth,
        " requests one io queue holds"));
  }
  if (config->spill_io_bytes % 4096 != 0) {
    return absl::InvalidArgumentError("spill_io_bytes must be a multiple of 4096");
  }
  if (config->default_quota_bytes != 0 && config->max_quota_bytes != 0 &&
      config->default_quota_bytes > config->max_quota_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("default_quota_bytes (", config::FormatSize(config->default_quota_bytes),
                     ") exceeds max_quota_bytes (", config::FormatSize(config->max_quota_bytes), ")"));
  }

  if (config->pool_bytes == 0) {
    absl::StatusOr<std::string> meminfo = config::ReadWholeFile("/proc/meminfo");
    if (!meminfo.ok()) return meminfo.status();
    absl::StatusOr<uint64_t> available = ParseMemAvailable(*meminfo);
    if (!available.ok()) {
      return absl::Status(
          available.status().code(),
          absl::StrCat("/proc/meminfo: ", available.status().message(), "; set pool_bytes"));
    }
    config->pool_bytes = DerivePoolBytes(config->pool_fraction, *available, config->pool_max_bytes);
  }
  return absl::OkStatus();
}

}  // namespace tier::daemon
