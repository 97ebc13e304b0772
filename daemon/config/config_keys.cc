#include "daemon/config/config_keys.h"

#include <cstdint>
#include <limits>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/config/config_values.h"
#include "storage/faulty_io_queue.h"

namespace tier::daemon::config {
namespace {

const std::vector<Choice<storage::LockMode>> kPoolLockNames = {
    {"off", storage::LockMode::kOff},
    {"best-effort", storage::LockMode::kBestEffort},
    {"required", storage::LockMode::kRequired}};
const std::vector<Choice<storage::IoQueueKind>> kSpillIoNames = {
    {"auto", storage::IoQueueKind::kAuto},
    {"io_uring", storage::IoQueueKind::kUring},
    {"thread_pool", storage::IoQueueKind::kThreadPool}};
const std::vector<Choice<engine::EngineKind>> kEngineNames = {{"auto", engine::EngineKind::kAuto},
                                                           {"host", engine::EngineKind::kHost},
                                                           {"cuda", engine::EngineKind::kCuda},
                                                           {"hip", engine::EngineKind::kHip}};
const std::vector<Choice<Severity>> kLogLevelNames = {{"debug", Severity::kDebug},
                                                      {"info", Severity::kInfo},
                                                      {"warning", Severity::kWarning},
                                                      {"error", Severity::kError}};

absl::Status KeyError(absl::string_view key, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(key, ": ", message));
}
absl::Status KeyError(absl::string_view key, const absl::Status& status) {
  return KeyError(key, status.message());
}

bool IsPowerOfTwo(uint64_t value) { return value != 0 && (value & (value - 1)) == 0; }

// Integers in [min, max]; optionally powers of two only.
template <typename T>
Key IntegerKey(absl::string_view name, absl::string_view section, absl::string_view help,
               T Config::*field, int64_t min, int64_t max, bool power_of_two = false) {
  Key key{name, section, "N", help, nullptr, nullptr};
  key.set = [name, field, min, max, power_of_two](absl::string_view value, Config& config) {
    int64_t number = 0;
    if (min < 0) {
      absl::StatusOr<int64_t> parsed = ParseSigned(value);
      if (!parsed.ok()) return KeyError(name, parsed.status());
      number = *parsed;
    } else {
      absl::StatusOr<uint64_t> parsed = ParseUnsigned(value);
      if (!parsed.ok()) return KeyError(name, parsed.status());
      if (*parsed > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return KeyError(name, absl::StrCat(value, " is out of range ", min, "..", max));
      }
      number = static_cast<int64_t>(*parsed);
    }
    if (number < min || number > max ||
        (power_of_two && !IsPowerOfTwo(static_cast<uint64_t>(number)))) {
      return KeyError(name, absl::StrCat("must be ", power_of_two ? "a power of two " : "", "in ",
                                         min, "..", max, ", got ", value));
    }
    config.*field = static_cast<T>(number);
    return absl::OkStatus();
  };
  key.print = [field](const Config& config) { return absl::StrCat(config.*field); };
  return key;
}

// Sizes: 0 when allow_zero, else at least min_bytes.
Key SizeKey(absl::string_view name, absl::string_view section, absl::string_view help,
            uint64_t Config::*field, bool allow_zero, uint64_t min_bytes) {
  Key key{name, section, "SIZE", help, nullptr, nullptr};
  key.set = [name, field, allow_zero, min_bytes](absl::string_view value, Config& config) {
    absl::StatusOr<uint64_t> bytes = ParseSize(value);
    if (!bytes.ok()) return KeyError(name, bytes.status());
    if (*bytes < min_bytes && !(allow_zero && *bytes == 0)) {
      return KeyError(name, absl::StrCat("must be ", allow_zero ? "0 or " : "", "at least ",
                                         FormatSize(min_bytes), ", got ", value));
    }
    config.*field = *bytes;
    return absl::OkStatus();
  };
  key.print = [field](const Config& config) { return FormatSize(config.*field); };
  return key;
}

// An enum setting, one of `choices`.
template <typename E>
Key EnumKey(absl::string_view name, absl::string_view section, absl::string_view help,
            E Config::*field, std::vector<Choice<E>> choices) {
  std::vector<absl::string_view> names;
  for (const Choice<E>& choice : choices) names.push_back(choice.name);
  Key key{name, section, absl::StrJoin(names, "|"), help, nullptr, nullptr};
  key.set = [name, field, choices](absl::string_view value, Config& config) {
    absl::StatusOr<E> parsed = ParseChoice(value, choices);
    if (!parsed.ok()) return KeyError(name, parsed.status());
    config.*field = *parsed;
    return absl::OkStatus();
  };
  key.print = [field, choices](const Config& config) {
    return std::string(FormatChoice(config.*field, choices));
  };
  return key;
}

Key PathKey(absl::string_view name, absl::string_view section, absl::string_view help,
            std::string Config::*field, bool allow_empty) {
  Key key{name, section, "PATH", help, nullptr, nullptr};
  key.set = [name, field, allow_empty](absl::string_view value, Config& config) {
    if (value.empty() ? !allow_empty : !absl::StartsWith(value, "/")) {
      return KeyError(name, absl::StrCat("must be an absolute path, got '", value, "'"));
    }
    if (absl::Status text = CheckPathText(value); !text.ok()) return KeyError(name, text);
    config.*field = std::string(value);
    return absl::OkStatus();
  };
  key.print = [field](const Config& config) { return config.*field; };
  return key;
}

// Any other value: `parse` turns the text into the field's value (its error is prefixed with the
// key's name), `format` turns it back.
template <typename T>
Key ValueKey(absl::string_view name, absl::string_view section, absl::string_view hint,
             absl::string_view help, T Config::*field,
             absl::StatusOr<T> (*parse)(absl::string_view value),
             std::string (*format)(const T& value), bool flag_only = false) {
  Key key{name, section, std::string(hint), help, nullptr, nullptr, flag_only};
  key.set = [name, field, parse](absl::string_view value, Config& config) {
    absl::StatusOr<T> parsed = parse(value);
    if (!parsed.ok()) return KeyError(name, parsed.status());
    config.*field = *std::move(parsed);
    return absl::OkStatus();
  };
  key.print = [field, format](const Config& config) { return format(config.*field); };
  return key;
}

// The value syntaxes of the ValueKeys below.
absl::StatusOr<std::string> AnyText(absl::string_view value) { return std::string(value); }
std::string SameText(const std::string& value) { return value; }
std::string CommaList(const std::vector<std::string>& values) { return absl::StrJoin(values, ","); }
std::string FormatModeOf(const uint32_t& mode) { return FormatMode(mode); }
std::string FormatDoubleOf(const double& value) { return FormatDouble(value); }

absl::StatusOr<std::string> GroupName(absl::string_view value) {
  for (char c : value) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c)) ||
        absl::ascii_iscntrl(static_cast<unsigned char>(c)) || c == ':' || c == '/') {
      return absl::InvalidArgumentError(absl::StrCat("'", value, "' is not a group name"));
    }
  }
  return std::string(value);
}

absl::StatusOr<double> Fraction(absl::string_view value) {
  absl::StatusOr<double> fraction = ParseDouble(value);
  if (!fraction.ok()) return fraction.status();
  if (!(*fraction > 0 && *fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("must be in (0, 1], got ", value));
  }
  return *fraction;
}

absl::StatusOr<PoolNuma> ParsePoolNuma(absl::string_view value) {
  if (value == "auto") return PoolNuma{PoolNuma::Mode::kAuto, {}};
  if (value == "off") return PoolNuma{PoolNuma::Mode::kOff, {}};
  absl::StatusOr<std::vector<int>> nodes = ParseNodeNumbers(value);
  if (!nodes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("must be auto, off or NUMA nodes (0,1): ", nodes.status().message()));
  }
  return PoolNuma{PoolNuma::Mode::kNodes, *std::move(nodes)};
}

std::string FormatPoolNuma(const PoolNuma& numa) {
  switch (numa.mode) {
    case PoolNuma::Mode::kAuto:
      return "auto";
    case PoolNuma::Mode::kOff:
      return "off";
    case PoolNuma::Mode::kNodes:
      return absl::StrJoin(numa.nodes, ",");
  }
  return "auto";
}

absl::StatusOr<FaultInjection> FaultRules(absl::string_view value) {
  absl::StatusOr<std::vector<storage::FaultRule>> rules =
      storage::ParseFaultRules(std::string(value));
  if (!rules.ok()) return rules.status();
  return FaultInjection{std::string(value), *std::move(rules)};
}
std::string FaultRulesText(const FaultInjection& faults) { return faults.text; }

absl::StatusOr<std::string> MetricsAddress(absl::string_view value) {
  absl::Status valid = CheckMetricsListen(std::string_view(value.data(), value.size()));
  if (!valid.ok()) return valid;
  return std::string(value);
}

// The table, a section at a time, in the order --help, --print-config and the shipped tierd.conf
// show the keys.
constexpr absl::string_view kPaths = "Paths and sockets";
constexpr absl::string_view kPool = "Host pool";
constexpr absl::string_view kSpill = "NVMe tier";
constexpr absl::string_view kSessions = "Sessions";
constexpr absl::string_view kLimits = "Client limits";
constexpr absl::string_view kEngine = "Copy engine";
constexpr absl::string_view kService = "Service";

std::vector<Key> PathKeys() {
  return {
      PathKey("socket", kPaths, "gRPC control socket", &Config::socket_path, false),
      PathKey("session_socket", kPaths,
              "session socket; empty: <dir of socket>/tierd.session.sock",
              &Config::session_socket_path, true),
      PathKey("state_dir", kPaths, "state directory", &Config::state_dir, false),
      ValueKey("spill_dir", kPaths, "PATH[,PATH...]",
               "NVMe spill directories, one per device, comma-separated; empty: <state_dir>/spill",
               &Config::spill_dirs, ParsePathList, CommaList),
      ValueKey("socket_mode", kPaths, "MODE", "permissions of both sockets (octal)",
               &Config::socket_mode, ParseMode, FormatModeOf),
      ValueKey("socket_group", kPaths, "GROUP",
               "group given both sockets, so its members can use Tierd; empty: leave as is",
               &Config::socket_group, GroupName, SameText),
      PathKey("admin_token_file", kPaths,
              "where the admin token goes (Drain, ListObjects); empty: "
              "<socket>.admin-token. Keep it out of what clients mount",
              &Config::admin_token_file, /*allow_empty=*/true),
  };
}

std::vector<Key> PoolKeys() {
  return {
      SizeKey("pool_bytes", kPool,
              "pinned host pool size; 0: pool_fraction of MemAvailable, up to pool_max_bytes",
              &Config::pool_bytes, /*allow_zero=*/true, kPoolGranuleBytes),
      ValueKey("pool_fraction", kPool, "F",
               "share of MemAvailable the pool takes when pool_bytes is 0", &Config::pool_fraction,
               Fraction, FormatDoubleOf),
      SizeKey("pool_max_bytes", kPool, "cap on the derived pool size", &Config::pool_max_bytes,
              /*allow_zero=*/false, kMinDerivedPoolBytes),
      IntegerKey("pool_numa_node", kPool, "NUMA node the pool is bound to; -1: none",
                 &Config::pool_numa_node, -1, 1023),
      ValueKey("pool_numa", kPool, "auto|off|N,N,...",
               "split the pool over NUMA nodes: auto (one part per node with GPUs, when several "
               "nodes have GPUs), off (one part), or one part per listed node",
               &Config::pool_numa, ParsePoolNuma, FormatPoolNuma),
      EnumKey("pool_lock", kPool, "mlock the pool: off, best-effort (warn on failure) or required",
              &Config::pool_lock, kPoolLockNames),
  };
}

std::vector<Key> SpillKeys() {
  return {
      SizeKey("spill_bytes", kSpill, "size of the spill file in each spill_dir; 0: no NVMe tier",
              &Config::spill_bytes, true, 0),
      IntegerKey("spill_high_pct", kSpill,
                 "spill objects to NVMe while the host pool is fuller than this (%)",
                 &Config::spill_high_pct, 1, 100),
      IntegerKey("spill_low_pct", kSpill, "... until it is no fuller than this (%)",
                 &Config::spill_low_pct, 0, 100),
      EnumKey("spill_io", kSpill,
              "spill I/O: auto (io_uring, else a pread/pwrite thread pool), io_uring "
              "or thread_pool",
              &Config::spill_io, kSpillIoNames),
      IntegerKey("spill_queue_depth", kSpill,
                 "spill I/O requests in flight per spill directory (device)",
                 &Config::spill_queue_depth, 1, 1024),
      SizeKey("spill_io_bytes", kSpill, "largest single spill I/O (multiple of 4 KiB)",
              &Config::spill_io_bytes, false, 4096),
      IntegerKey("spill_prefetch", kSpill,
                 "prefetch reads of spilled objects in flight; 0: no prefetching",
                 &Config::spill_prefetch, 0, 64),
      ValueKey("spill_inject_faults", kSpill, "RULES",
               "TEST ONLY: inject I/O faults, OP:FAULT[:SKIP[:TIMES]],...; empty: off",
               &Config::spill_inject_faults, FaultRules, FaultRulesText),
  };
}

std::vector<Key> SessionKeys() {
  return {
      SizeKey("default_quota_bytes", kSessions,
          "bytes (all tiers) a session may hold unless it asks otherwise; 0: all the daemon holds",
          &Config::default_quota_bytes, true, 0),
      SizeKey("max_quota_bytes", kSessions,
          "most bytes (all tiers) any one session may hold; 0: all the daemon holds",
          &Config::max_quota_bytes, true, 0),
      SizeKey("persistent_quota_bytes_per_uid", kSessions,
          "most bytes (all tiers) the persistent objects of one user may hold; 0: "
          "1/16 of all the daemon holds",
          &Config::persistent_quota_bytes_per_uid, true, 0),
      SizeKey("persistent_max_bytes", kSessions,
          "most bytes (all tiers) the persistent objects of every user hold "
          "together; 0: 1/4 of all the daemon holds",
          &Config::persistent_max_bytes, true, 0),
      IntegerKey("persistent_max_objects_per_uid", kSessions,
          "most persistent objects (and names reserved) of one user",
          &Config::persistent_max_objects_per_uid, 1, 1 << 24),
      IntegerKey("persistent_max_objects", kSessions,
          "most persistent objects (and names reserved) of every user together",
          &Config::persistent_max_objects, 1, 1 << 24),
      SizeKey("persistent_journal_max_bytes", kSessions,
          "most bytes the journal of persistent objects takes on NVMe (beside the "
          "spill file); 0: twice persistent_max_bytes, and 64 MiB",
          &Config::persistent_journal_max_bytes, true, 0),
      IntegerKey("ring_entries", kSessions,
          "job ring entries per session (power of two, 8..65536)",
          &Config::ring_entries, 8, 65536, /*power_of_two=*/true),
      IntegerKey("max_sessions", kSessions, "most sessions at once",
          &Config::max_sessions, 1, 65536),
      IntegerKey("attach_timeout_ms", kSessions,
          "time a new session, or a new connection to the session socket, has "
          "to attach",
          &Config::attach_timeout_ms, 1, 3600 * 1000),
  };
}

std::vector<Key> LimitKeys() {
  return {
      IntegerKey("max_sessions_per_uid", kLimits,
          "most attached sessions of one user (uid)",
          &Config::max_sessions_per_uid, 1, 65536),
      IntegerKey("max_buffers_per_session", kLimits,
          "most buffers one session may have registered",
          &Config::max_buffers_per_session, 1, 1 << 20),
      IntegerKey("max_buffers_per_uid", kLimits,
          "most buffers the sessions of one user may have registered",
          &Config::max_buffers_per_uid, 1, 1 << 20),
      IntegerKey("max_buffers", kLimits,
          "most buffers registered in all (each is a mapping: keep it well "
          "below vm.max_map_count)",
          &Config::max_buffers, 1, 1 << 20),
      SizeKey("max_mapped_bytes_per_session", kLimits,
          "most bytes of host memory one session may have registered",
          &Config::max_mapped_bytes_per_session, false, 4096),
      SizeKey("max_mapped_bytes_per_uid", kLimits,
          "most bytes of host memory the sessions of one user may have registered",
          &Config::max_mapped_bytes_per_uid, false, 4096),
      SizeKey("max_mapped_bytes", kLimits,
          "most bytes of host memory registered in all (tierd's page tables grow "
          "by 1/512 of it); 0: a quarter of the node's memory (MemTotal)",
          &Config::max_mapped_bytes, /*allow_zero=*/true, 4096),
      SizeKey("max_reserved_bytes_per_session", kLimits,
          "most GPU address space tierd reserves for one session's VMM buffers "
          "(an expandable segment reserves about its GPU's memory, up to 1.125 times it)",
          &Config::max_reserved_bytes_per_session, false, 4096),
      SizeKey("max_reserved_bytes_per_uid", kLimits,
          "most GPU address space tierd reserves for the VMM buffers of one user's "
          "sessions (all users together: 32 TiB)",
          &Config::max_reserved_bytes_per_uid, false, 4096),
      IntegerKey("max_connections", kLimits,
          "most connections to the session socket at once",
          &Config::max_connections, 1, 1 << 20),
      IntegerKey("max_connections_per_uid", kLimits,
          "most connections of one user to the session socket at once",
          &Config::max_connections_per_uid, 1, 1 << 20),
  };
}

std::vector<Key> EngineKeys() {
  return {
      EnumKey("engine", kEngine,
          "copy engine: auto (GPU if present, else host), host, cuda or hip",
          &Config::engine, kEngineNames),
      IntegerKey("host_engine_threads", kEngine,
          "host engine worker threads per direction",
          &Config::host_engine_threads, 1, 64),
      IntegerKey("copy_delay_us", kEngine,
          "TEST ONLY: delay every copy this long (delay injection); 0: off",
          &Config::copy_delay_us, 0, 60 * 1000 * 1000),
      IntegerKey("poll_idle_us", kEngine, "ring poller spins this long before sleeping",
          &Config::poll_idle_us, 0, 1000 * 1000),
      IntegerKey("gpu_poll_spin_us", kEngine,
          "GPU engine: a GPU's worker spins this long after progress (tickets "
          "and completions) before it backs off to short sleeps",
          &Config::gpu_poll_spin_us, 0, 1000 * 1000),
      SizeKey("gpu_lane_window_bytes", kEngine,
          "GPU engine: while sessions share a GPU's link in one direction, each "
          "one's lane keeps at most this much copying on the GPU and issues larger "
          "copies in quarters of it, so they take turns; 0: no limit",
          &Config::gpu_lane_window_bytes, /*allow_zero=*/true, 64 * 1024),
      IntegerKey("lane_wait_warn_ms", kEngine,
          "a GPU lane that waits this long for a client's ticket logs it once",
          &Config::lane_wait_warn_ms, 1, 3600 * 1000),
  };
}

std::vector<Key> ServiceKeys() {
  return {
      EnumKey("log_level", kService, "debug, info, warning or error",
          &Config::log_level, kLogLevelNames),
      IntegerKey("drain_timeout_ms", kService,
          "on SIGTERM, wait this long for in-flight jobs; 0: no limit",
          &Config::drain_timeout_ms, 0, 3600 * 1000),
      IntegerKey("drain_handback_idle_ms", kService,
          "draining: clients give back what they offloaded (reloads and frees "
          "go on, offloads are refused); stop waiting once none did for this long",
          &Config::drain_handback_idle_ms, 0, 3600 * 1000),
      IntegerKey("health_stall_ms", kService,
          "health fails when jobs without a GPU ticket are in flight and none "
          "completed for this long; 0: watch the ring poller only",
          &Config::health_stall_ms, 0, 3600 * 1000),
      ValueKey("metrics_listen", kService, "HOST:PORT",
          "serve Prometheus metrics (GET /metrics) on this TCP address, e.g. 127.0.0.1:9477; "
          "empty: off",
          &Config::metrics_listen, MetricsAddress, SameText),
      EnumKey("metrics_uid_labels", kService,
          "on: the per-user metrics name each uid (anyone who can reach "
          "metrics_listen sees every user's activity); off: all users together "
          "under uid=\"all\"",
          &Config::metrics_uid_labels,
          std::vector<Choice<bool>>{{"off", false}, {"on", true}}),
      PathKey("topology_sysfs_root", kService,
          "TEST ONLY: read NUMA and PCI topology under this directory, not /sys",
          &Config::topology_sysfs_root, /*allow_empty=*/false),
      ValueKey("config", kService, "FILE", "config file to read (flag only; or $TIERD_CONFIG)",
          &Config::config_file, AnyText, SameText, /*flag_only=*/true),
  };
}

std::vector<Key> BuildKeys() {
  std::vector<Key> keys;
  for (std::vector<Key> (*section)() :
       {PathKeys, PoolKeys, SpillKeys, SessionKeys, LimitKeys, EngineKeys, ServiceKeys}) {
    for (Key& key : section()) keys.push_back(std::move(key));
  }
  return keys;
}

}  // namespace

const std::vector<Key>& Keys() {
  static const std::vector<Key>* const keys = new std::vector<Key>(BuildKeys());
  return *keys;
}

const Key* FindKey(absl::string_view name) {
  for (const Key& key : Keys()) {
    if (key.name == name) return &key;
  }
  return nullptr;
}

}  // namespace tier::daemon::config
