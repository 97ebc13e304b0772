// tierd's settings. Every setting has an embedded default (the daemon runs with no file), can be
// set in a config file (`key = value` lines, `#` comments; see deploy/tierd.conf) and from a flag
// `--key=value` (flags win over the file). One table of keys serves both, so they cannot drift
// (daemon/config/config_keys.h; the value syntax in config_values.h, the rules between settings in
// config_rules.cc). Every value is parsed once, into its type: the daemon reads enums, not text.
#ifndef TIER_DAEMON_CONFIG_CONFIG_H_
#define TIER_DAEMON_CONFIG_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/log.h"
#include "engine/engine_kind.h"
#include "storage/faulty_io_queue.h"
#include "storage/host_pool.h"
#include "storage/io_queue.h"

namespace tier::daemon {

// spill_inject_faults: the rules (test only), with the text they were parsed from.
struct FaultInjection {
  std::string text;  // empty: off
  std::vector<storage::FaultRule> rules;
};

// pool_numa: how the host pool is split over NUMA nodes (docs/architecture.md, "The host pool").
struct PoolNuma {
  enum class Mode {
    kAuto,   // one part per NUMA node that has GPUs, when more than one node has; else one part
    kOff,    // one part (bound to pool_numa_node when that is set)
    kNodes,  // one part per entry of `nodes`, in that order (a node may appear more than once)
  };
  Mode mode = Mode::kAuto;
  std::vector<int> nodes;  // kNodes only
  friend bool operator==(const PoolNuma&, const PoolNuma&) = default;
};

struct Config {
  // Paths. Defaults: $XDG_RUNTIME_DIR/tierd when set (non-root use), else /run/tierd; state under
  // $XDG_STATE_HOME/tierd or /var/lib/tierd. Under systemd, $RUNTIME_DIRECTORY/$STATE_DIRECTORY
  // (set by RuntimeDirectory=/StateDirectory=) come first, so `User=tierd` gets /run/tierd and
  // /var/lib/tierd rather than paths under its home. All paths must be absolute.
  std::string socket_path;          // socket      gRPC control socket
  std::string session_socket_path;  // session_socket  (default: <socket dir>/tierd.session.sock)
  std::string state_dir;            // state_dir
  // spill_dir: one or more spill directories, comma-separated (one per NVMe device), one spill
  // file of spill_bytes in each. Default: <state_dir>/spill.
  std::vector<std::string> spill_dirs;
  uint32_t socket_mode = 0660;      // socket_mode (octal in the file: 0660)
  // socket_group: group both sockets are chown'ed to, so its members can use Tierd (with
  // socket_mode 0660). Empty: leave the daemon's own group (under the shipped unit: `tier`).
  std::string socket_group;
  // admin_token_file: where tierd writes its admin token (mode 0600; Drain and ListObjects need
  // it). Empty: <socket>.admin-token, beside the sockets; elsewhere when the sockets' directory is
  // shared with clients (a hostPath mounted into training pods).
  std::string admin_token_file;

  // Host pool.
  uint64_t pool_bytes = 0;          // pool_bytes  (0: pool_fraction of MemAvailable, <= pool_max_bytes)
  double pool_fraction = 0.25;      // pool_fraction
  uint64_t pool_max_bytes = 8ull << 30;  // pool_max_bytes
  int pool_numa_node = -1;          // pool_numa_node: bind the one part to this node; -1: none
  PoolNuma pool_numa;               // pool_numa: auto | off | N,N,...
  storage::LockMode pool_lock = storage::LockMode::kBestEffort;  // pool_lock: off | best-effort | required

  // Sessions.
  // Quotas stay 0 after Finalize() when unset: 0 means "the whole pool" and the daemon resolves it
  // against the pool it actually built (Finalize checks default <= max when both are set).
  // NVMe tier (spill). spill_bytes 0: no spill tier.
  uint64_t spill_bytes = 0;          // spill_bytes: size of the spill file in each spill_dir
  uint32_t spill_high_pct = 90;      // spill_high_pct: spill while the host pool is fuller than this
  uint32_t spill_low_pct = 75;       // spill_low_pct: ... until it is this full
  storage::IoQueueKind spill_io = storage::IoQueueKind::kAuto;  // spill_io: auto | io_uring | thread_pool
  uint32_t spill_queue_depth = 16;   // spill_queue_depth
  uint64_t spill_io_bytes = 1 << 20; // spill_io_bytes: largest single I/O
  uint32_t spill_prefetch = 2;       // spill_prefetch: prefetch reads in flight (0: none)
  // spill_inject_faults: test-only fault injection in the spill I/O (storage::ParseFaultRules).
  FaultInjection spill_inject_faults;
  uint64_t default_quota_bytes = 0;  // default_quota_bytes (0: the whole pool)
  uint64_t max_quota_bytes = 0;      // max_quota_bytes (0: the whole pool)
  // Named objects that outlive sessions (daemon/persistent/persistent_store.h). Sizes 0: a share of what the
  // daemon holds (pool + NVMe), resolved at start.
  uint64_t persistent_quota_bytes_per_uid = 0;  // 0: 1/16 of what the daemon holds
  uint64_t persistent_max_bytes = 0;            // every uid together; 0: 1/4 of it
  uint32_t persistent_max_objects_per_uid = 16384;  // names (reservations too) of one uid
  uint32_t persistent_max_objects = 65536;          // names of every uid together
  uint64_t persistent_journal_max_bytes = 0;    // the journal file on NVMe; 0: 2 x persistent_max_bytes
  uint32_t ring_entries = 1024;      // ring_entries
  uint32_t max_sessions = 256;       // max_sessions
  uint32_t attach_timeout_ms = 10000;  // attach_timeout_ms

  // Limits on what clients may hold in the daemon (RESOURCE_EXHAUSTED beyond them, naming the
  // setting), so that one careless or hostile client cannot take the node (issue 16).
  uint32_t max_sessions_per_uid = 64;         // max_sessions_per_uid (attached sessions)
  uint32_t max_buffers_per_session = 4096;    // max_buffers_per_session
  uint32_t max_buffers_per_uid = 16384;       // max_buffers_per_uid
  uint32_t max_buffers = 32768;               // max_buffers (all sessions; vm.max_map_count)
  uint64_t max_mapped_bytes_per_session = 64ull << 30;  // max_mapped_bytes_per_session (host)
  uint64_t max_mapped_bytes_per_uid = 256ull << 30;     // max_mapped_bytes_per_uid (host)
  // max_mapped_bytes: all sessions (0: a quarter of MemTotal, derived at start)
  uint64_t max_mapped_bytes = 0;
  // GPU address space reserved for VMM registrations (expandable segments): one session's, one
  // uid's (all sessions: the engine's 32 TiB).
  uint64_t max_reserved_bytes_per_session = uint64_t{8} << 40;  // max_reserved_bytes_per_session
  uint64_t max_reserved_bytes_per_uid = uint64_t{16} << 40;     // max_reserved_bytes_per_uid
  uint32_t max_connections = 1024;            // max_connections (session socket)
  uint32_t max_connections_per_uid = 128;     // max_connections_per_uid

  // Copy engine.
  engine::EngineKind engine = engine::EngineKind::kAuto;  // engine: auto | host | cuda | hip
  uint32_t host_engine_threads = 2;  // host_engine_threads (per direction)
  uint64_t copy_delay_us = 0;        // copy_delay_us: test-only delay injection per copy
  uint32_t poll_idle_us = 50;        // poll_idle_us: ring poller spins this long before sleeping
  uint32_t gpu_poll_spin_us = 50;    // gpu_poll_spin_us: GPU workers spin this long after progress
  uint32_t lane_wait_warn_ms = 10000;  // lane_wait_warn_ms: log a lane waiting this long
  uint64_t gpu_lane_window_bytes = 4 << 20;  // gpu_lane_window_bytes: a shared lane's copying

  // Service.
  Severity log_level = Severity::kInfo;  // log_level: debug | info | warning | error
  uint32_t drain_timeout_ms = 30000; // drain_timeout_ms: SIGTERM waits this long for jobs
  // drain_handback_idle_ms: while draining, clients give back what they offloaded; tierd stops
  // waiting for that once none has given anything back for this long.
  uint32_t drain_handback_idle_ms = 5000;
  // health_stall_ms: Health says NOT_SERVING when jobs the daemon alone must finish are in
  // flight and none completed for this long (0: only the ring poller is watched).
  uint32_t health_stall_ms = 60000;
  // metrics_listen: serve Prometheus metrics (GET /metrics) on this TCP address, HOST:PORT
  // (e.g. 127.0.0.1:9477, [::1]:9477); empty: off. TCP only (see ParseMetricsListen).
  std::string metrics_listen;
  // metrics_uid_labels: per-user series (label uid: each user's sessions, bytes, jobs, lanes). Off:
  // every user's together, under uid="all" (the endpoint has no authentication).
  bool metrics_uid_labels = false;
  // topology_sysfs_root: where tierd reads NUMA and PCI topology (TEST ONLY: a fake tree).
  std::string topology_sysfs_root = "/sys";

  // Files the settings came from, for the log.
  std::string config_file;           // config (flag only)
};

// What the default paths depend on; ProcessConfigEnv() reads it from this process (geteuid and
// the variables named below), tests build it by hand.
struct ConfigEnv {
  bool root = false;               // effective uid 0
  std::string runtime_directory;   // $RUNTIME_DIRECTORY (systemd RuntimeDirectory=; first entry)
  std::string state_directory;     // $STATE_DIRECTORY (systemd StateDirectory=; first entry)
  std::string xdg_runtime_dir;     // $XDG_RUNTIME_DIR
  std::string xdg_state_home;      // $XDG_STATE_HOME
  std::string home;                // $HOME
};
ConfigEnv ProcessConfigEnv();

// Embedded defaults with paths resolved from the environment. Socket dir: $RUNTIME_DIRECTORY,
// else $XDG_RUNTIME_DIR/tierd when not root, else /run/tierd. State dir: $STATE_DIRECTORY, else
// (not root) $XDG_STATE_HOME/tierd or $HOME/.local/state/tierd, else /var/lib/tierd. Derived
// paths (session socket, spill dir) and the pool size are left for Finalize().
Config DefaultConfig(const ConfigEnv& env);
Config DefaultConfig();  // DefaultConfig(ProcessConfigEnv())

// Applies `key = value` lines. Unknown keys, malformed values and out-of-range values are errors
// that name the line ("<origin>:<line>: ..."). `#` starts a comment only at the start of a line
// (after blanks), so values may contain it. Later lines win. Sizes take plain bytes or a suffix
// K/M/G/T or KiB/MiB/GiB/TiB (all powers of 1024); socket_mode is octal. A missing file is
// NOT_FOUND.
absl::Status ApplyConfigText(std::string_view text, std::string_view origin, Config* config);
absl::Status ApplyConfigFile(const std::string& path, Config* config);

// Builds the config: defaults, then the file named by --config=PATH (or $TIERD_CONFIG), then the
// remaining flags (`--key=value` or `--key value`; `-` and `_` are the same in flag names), then
// Finalize(). No file is read unless one is named, and a named file that is missing is an error.
// `--config=` (empty) reads no file even when $TIERD_CONFIG is set. `--help` is handled by the
// caller.
absl::StatusOr<Config> LoadConfig(const std::vector<std::string>& args);

// Fills derived defaults (session socket, spill dir, pool size from MemAvailable in /proc/meminfo)
// and checks cross-field rules (socket path lengths, distinct sockets, quota default <= max).
// Idempotent: a finalized config finalizes to itself.
absl::Status Finalize(Config* config);

// Checks a metrics_listen value: HOST:PORT with HOST an IPv4 address, a [bracketed] IPv6 address
// or a host name, PORT 1..65535; "" (off) passes. A Unix socket path is refused with a message that
// says why: the exporter (daemon/metrics/metrics_exporter.h) listens on TCP only.
absl::Status CheckMetricsListen(std::string_view value);

// MemAvailable from the text of /proc/meminfo, in bytes.
absl::StatusOr<uint64_t> ParseMemAvailable(std::string_view meminfo_text);
// The pool size for pool_bytes = 0: fraction * mem_available_bytes, at most max_bytes, rounded down
// to 2 MiB, at least 64 MiB.
uint64_t DerivePoolBytes(double fraction, uint64_t mem_available_bytes, uint64_t max_bytes);
inline constexpr uint64_t kPoolGranuleBytes = 2ull << 20;
inline constexpr uint64_t kMinDerivedPoolBytes = 64ull << 20;

// Text of all keys with their current values, in file syntax (for --print-config and the log);
// ApplyConfigText() of it reproduces `config` (except config_file, printed as a comment).
std::string DescribeConfig(const Config& config);
// One line per key for --help.
std::string ConfigUsage();

}  // namespace tier::daemon

#endif  // TIER_DAEMON_CONFIG_CONFIG_H_
