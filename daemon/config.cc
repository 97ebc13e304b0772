#include "daemon/config.h"

#include <fcntl.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/log.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "storage/faulty_io_queue.h"
#include "storage/io_queue.h"

namespace tier::daemon {
namespace {

// This Abseil build has its own string_view type; the public header speaks std::string_view.
absl::string_view ToAbsl(std::string_view text) {
  return absl::string_view(text.data(), text.size());
}

// ---- Value syntax -------------------------------------------------------------------------------

absl::Status BadValue(absl::string_view value, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("invalid value '", value, "': expected ", expected));
}

bool AllDigits(absl::string_view text, bool octal = false) {
  if (text.empty()) return false;
  for (char c : text) {
    if (c < '0' || c > (octal ? '7' : '9')) return false;
  }
  return true;
}

// Decimal digits only: no sign, no blanks, no hex (a typo should not turn into a number).
absl::StatusOr<uint64_t> ParseUnsigned(absl::string_view text) {
  uint64_t value = 0;
  if (!AllDigits(text) || !absl::SimpleAtoi(text, &value)) {
    return BadValue(text, "an unsigned decimal integer");
  }
  return value;
}

absl::StatusOr<int64_t> ParseSigned(absl::string_view text) {
  absl::string_view digits = absl::StartsWith(text, "-") ? text.substr(1) : text;
  int64_t value = 0;
  if (!AllDigits(digits) || !absl::SimpleAtoi(text, &value)) return BadValue(text, "an integer");
  return value;
}

struct SizeSuffix {
  absl::string_view short_name;  // K
  absl::string_view long_name;   // KiB (what DescribeConfig prints)
  int shift;
};
constexpr SizeSuffix kSizeSuffixes[] = {
    {"T", "TiB", 40}, {"G", "GiB", 30}, {"M", "MiB", 20}, {"K", "KiB", 10}};

// Plain bytes, or a number with K/M/G/T or KiB/MiB/GiB/TiB (case-insensitive, blanks allowed
// between): all powers of 1024, since every size here is a memory size.
absl::StatusOr<uint64_t> ParseSize(absl::string_view text) {
  constexpr absl::string_view kExpected = "bytes, or a number with K/M/G/T or KiB/MiB/GiB/TiB";
  size_t digits = 0;
  while (digits < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[digits]))) {
    ++digits;
  }
  uint64_t number = 0;
  if (digits == 0 || !absl::SimpleAtoi(text.substr(0, digits), &number)) {
    return BadValue(text, kExpected);
  }
  absl::string_view suffix = absl::StripLeadingAsciiWhitespace(text.substr(digits));
  if (suffix.empty()) return number;
  for (const SizeSuffix& s : kSizeSuffixes) {
    if (absl::EqualsIgnoreCase(suffix, s.short_name) ||
        absl::EqualsIgnoreCase(suffix, s.long_name)) {
      if (number > (std::numeric_limits<uint64_t>::max() >> s.shift)) {
        return absl::InvalidArgumentError(absl::StrCat("size '", text, "' overflows 64 bits"));
      }
      return number << s.shift;
    }
  }
  return BadValue(text, kExpected);
}

// The largest unit that divides the size exactly, so the text reads well and parses back exactly.
std::string FormatSize(uint64_t bytes) {
  for (const SizeSuffix& s : kSizeSuffixes) {
    uint64_t unit = uint64_t{1} << s.shift;
    if (bytes != 0 && bytes % unit == 0) return absl::StrCat(bytes / unit, s.long_name);
  }
  return absl::StrCat(bytes);
}

// File modes are octal whether or not they start with 0 (as in chmod and systemd's UMask=).
absl::StatusOr<uint32_t> ParseMode(absl::string_view text) {
  if (!AllDigits(text, /*octal=*/true) || text.size() > 5)
    return BadValue(text, "an octal mode like 0660");
  uint32_t mode = 0;
  for (char c : text) mode = mode * 8 + static_cast<uint32_t>(c - '0');
  if (mode > 0777) {
    return absl::InvalidArgumentError(absl::StrCat("mode ", text, " has bits beyond 0777"));
  }
  return mode;
}

std::string FormatMode(uint32_t mode) {
  char text[16];
  std::snprintf(text, sizeof(text), "%04o", mode);
  return text;
}

absl::StatusOr<double> ParseDouble(absl::string_view text) {
  double value = 0;
  // SimpleAtod also takes "nan", "inf" and hex floats; none is a sensible setting.
  if (text.empty() || text.find_first_of("nNxX") != absl::string_view::npos ||
      !absl::SimpleAtod(text, &value)) {
    return BadValue(text, "a decimal number");
  }
  return value;
}

// The shortest of %.15g/%.17g that parses back to the same double.
std::string FormatDouble(double value) {
  char text[40];
  std::snprintf(text, sizeof(text), "%.15g", value);
  double back = 0;
  if (absl::SimpleAtod(text, &back) && back == value) return text;
  std::snprintf(text, sizeof(text), "%.17g", value);
  return text;
}

// ---- The key table ------------------------------------------------------------------------------

// A setter parses and range-checks one value; its error names the key but not where the value came
// from (the caller adds "file:line" or "flag --x").
using Setter = std::function<absl::Status(absl::string_view value, Config& config)>;
using Printer = std::function<std::string(const Config& config)>;

struct Key {
  absl::string_view name;
  absl::string_view section;  // heading in DescribeConfig and the shipped tierd.conf
  std::string hint;           // value placeholder in --help
  absl::string_view help;     // one line
  Setter set;
  Printer print;
  bool flag_only = false;  // `config` names the file, so it cannot be in one
};

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

Key ChoiceKey(absl::string_view name, absl::string_view section, absl::string_view help,
              std::string Config::*field, std::vector<absl::string_view> choices) {
  Key key{name, section, absl::StrJoin(choices, "|"), help, nullptr, nullptr};
  key.set = [name, field, choices](absl::string_view value, Config& config) {
    for (absl::string_view choice : choices) {
      if (value == choice) {
        config.*field = std::string(value);
        return absl::OkStatus();
      }
    }
    return KeyError(
        name, absl::StrCat("must be one of ", absl::StrJoin(choices, ", "), ", got '", value, "'"));
  };
  key.print = [field](const Config& config) { return config.*field; };
  return key;
}

// A path must survive as a C string and as a config line: no NUL or other control characters
// (the system calls would see a shorter path than the one printed), no blank at either end (a
// config line loses it; found by tests/fuzz/config_fuzzer.cc).
absl::Status CheckPathText(absl::string_view path) {
  for (char c : path) {
    if (absl::ascii_iscntrl(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError("a path must not hold control characters");
    }
  }
  if (!path.empty() && (absl::ascii_isspace(static_cast<unsigned char>(path.front())) ||
                        absl::ascii_isspace(static_cast<unsigned char>(path.back())))) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "': a path must not begin or end with a blank"));
  }
  return absl::OkStatus();
}

// Absolute paths; empty only where the key has a derived default.
// "a,b,c": absolute paths, none empty, none twice (after dropping a trailing '/'); "" is none.
absl::StatusOr<std::vector<std::string>> ParsePathList(absl::string_view value) {
  std::vector<std::string> paths;
  if (value.empty()) return paths;
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    part = absl::StripAsciiWhitespace(part);
    if (!absl::StartsWith(part, "/")) {
      return absl::InvalidArgumentError(
          absl::StrCat("must be absolute paths, comma-separated, got '", part, "'"));
    }
    while (part.size() > 1 && absl::EndsWith(part, "/")) part.remove_suffix(1);
    if (absl::Status text = CheckPathText(part); !text.ok()) return text;
    std::string path(part);
    if (std::find(paths.begin(), paths.end(), path) != paths.end()) {
      return absl::InvalidArgumentError(absl::StrCat("'", path, "' is named twice"));
    }
    paths.push_back(std::move(path));
  }
  return paths;
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

std::vector<Key> BuildKeys() {
  constexpr absl::string_view kPaths = "Paths and sockets";
  constexpr absl::string_view kPool = "Host pool";
  constexpr absl::string_view kSessions = "Sessions";
  constexpr absl::string_view kEngine = "Copy engine";
  constexpr absl::string_view kService = "Service";
  std::vector<Key> keys;

  keys.push_back(PathKey("socket", kPaths, "gRPC control socket", &Config::socket_path, false));
  keys.push_back(PathKey("session_socket", kPaths,
                         "session socket; empty: <dir of socket>/tierd.session.sock",
                         &Config::session_socket_path, true));
  keys.push_back(PathKey("state_dir", kPaths, "state directory", &Config::state_dir, false));
  {
    Key key{"spill_dir", kPaths, "PATH[,PATH...]",
            "NVMe spill directories, one per device, comma-separated; empty: <state_dir>/spill",
            nullptr, nullptr};
    key.set = [](absl::string_view value, Config& config) {
      absl::StatusOr<std::vector<std::string>> dirs = ParsePathList(value);
      if (!dirs.ok()) return KeyError("spill_dir", dirs.status());
      config.spill_dirs = *std::move(dirs);
      return absl::OkStatus();
    };
    key.print = [](const Config& config) { return absl::StrJoin(config.spill_dirs, ","); };
    keys.push_back(std::move(key));
  }
  {
    Key key{"socket_mode", kPaths, "MODE", "permissions of both sockets (octal)", nullptr, nullptr};
    key.set = [](absl::string_view value, Config& config) {
      absl::StatusOr<uint32_t> mode = ParseMode(value);
      if (!mode.ok()) return KeyError("socket_mode", mode.status());
      config.socket_mode = *mode;
      return absl::OkStatus();
    };
    key.print = [](const Config& config) { return FormatMode(config.socket_mode); };
    keys.push_back(std::move(key));
  }
  {
    Key key{"socket_group",
            kPaths,
            "GROUP",
            "group given both sockets, so its members can use Tierd; empty: leave as is",
            nullptr,
            nullptr};
    key.set = [](absl::string_view value, Config& config) {
      for (char c : value) {
        if (absl::ascii_isspace(static_cast<unsigned char>(c)) ||
            absl::ascii_iscntrl(static_cast<unsigned char>(c)) || c == ':' || c == '/') {
          return KeyError("socket_group", absl::StrCat("'", value, "' is not a group name"));
        }
      }
      config.socket_group = std::string(value);
      return absl::OkStatus();
    };
    key.print = [](const Config& config) { return config.socket_group; };
    keys.push_back(std::move(key));
  }

  keys.push_back(
      SizeKey("pool_bytes", kPool,
              "pinned host pool size; 0: pool_fraction of MemAvailable, up to pool_max_bytes",
              &Config::pool_bytes, /*allow_zero=*/true, kPoolGranuleBytes));
  {
    Key key{
        "pool_fraction", kPool,  "F", "share of MemAvailable the pool takes when pool_bytes is 0",
        nullptr,         nullptr};
    key.set = [](absl::string_view value, Config& config) {
      absl::StatusOr<double> fraction = ParseDouble(value);
      if (!fraction.ok()) return KeyError("pool_fraction", fraction.status());
      if (!(*fraction > 0 && *fraction <= 1)) {
        return KeyError("pool_fraction", absl::StrCat("must be in (0, 1], got ", value));
      }
      config.pool_fraction = *fraction;
      return absl::OkStatus();
    };
    key.print = [](const Config& config) { return FormatDouble(config.pool_fraction); };
    keys.push_back(std::move(key));
  }
  keys.push_back(SizeKey("pool_max_bytes", kPool, "cap on the derived pool size",
                         &Config::pool_max_bytes, /*allow_zero=*/false, kMinDerivedPoolBytes));
  keys.push_back(IntegerKey("pool_numa_node", kPool, "NUMA node the pool is bound to; -1: none",
                            &Config::pool_numa_node, -1, 1023));
  keys.push_back(ChoiceKey("pool_lock", kPool,
                           "mlock the pool: off, best-effort (warn on failure) or required",
                           &Config::pool_lock, {"off", "best-effort", "required"}));

  constexpr absl::string_view kSpill = "NVMe tier";
  keys.push_back(SizeKey("spill_bytes", kSpill,
                         "size of the spill file in each spill_dir; 0: no NVMe tier",
                         &Config::spill_bytes, true, 0));
  keys.push_back(IntegerKey("spill_high_pct", kSpill,
                            "spill objects to NVMe while the host pool is fuller than this (%)",
                            &Config::spill_high_pct, 1, 100));
  keys.push_back(IntegerKey("spill_low_pct", kSpill, "... until it is no fuller than this (%)",
                            &Config::spill_low_pct, 0, 100));
  keys.push_back(ChoiceKey("spill_io", kSpill,
                           "spill I/O: auto (io_uring, else a pread/pwrite thread pool), io_uring "
                           "or thread_pool",
                           &Config::spill_io, {"auto", "io_uring", "thread_pool"}));
  keys.push_back(IntegerKey("spill_queue_depth", kSpill,
                            "spill I/O requests in flight per spill directory (device)",
                            &Config::spill_queue_depth, 1, 1024));
  keys.push_back(SizeKey("spill_io_bytes", kSpill, "largest single spill I/O (multiple of 4 KiB)",
                         &Config::spill_io_bytes, false, 4096));
  keys.push_back(IntegerKey("spill_prefetch", kSpill,
                            "prefetch reads of spilled objects in flight; 0: no prefetching",
                            &Config::spill_prefetch, 0, 64));
  {
    Key key{"spill_inject_faults", kSpill, "RULES",
            "TEST ONLY: inject I/O faults, OP:FAULT[:SKIP[:TIMES]],...; empty: off", nullptr,
            nullptr};
    key.set = [](absl::string_view value, Config& config) {
      absl::StatusOr<std::vector<storage::FaultRule>> rules =
          storage::ParseFaultRules(std::string(value));
      if (!rules.ok()) return KeyError("spill_inject_faults", rules.status());
      config.spill_inject_faults = std::string(value);
      return absl::OkStatus();
    };
    key.print = [](const Config& config) { return config.spill_inject_faults; };
    keys.push_back(std::move(key));
  }

  keys.push_back(
      SizeKey("default_quota_bytes", kSessions,
              "bytes (all tiers) a session may hold unless it asks otherwise; 0: all the daemon holds",
              &Config::default_quota_bytes, true, 0));
  keys.push_back(SizeKey("max_quota_bytes", kSessions,
                         "most bytes (all tiers) any one session may hold; 0: all the daemon holds",
                         &Config::max_quota_bytes, true, 0));
  keys.push_back(IntegerKey("ring_entries", kSessions,
                            "job ring entries per session (power of two, 8..65536)",
                            &Config::ring_entries, 8, 65536, /*power_of_two=*/true));
  keys.push_back(IntegerKey("max_sessions", kSessions, "most sessions at once",
                            &Config::max_sessions, 1, 65536));
  keys.push_back(IntegerKey("attach_timeout_ms", kSessions,
                            "time a new session, or a new connection to the session socket, has "
                            "to attach",
                            &Config::attach_timeout_ms, 1, 3600 * 1000));

  constexpr absl::string_view kLimits = "Client limits";
  keys.push_back(IntegerKey("max_sessions_per_uid", kLimits,
                            "most attached sessions of one user (uid)",
                            &Config::max_sessions_per_uid, 1, 65536));
  keys.push_back(IntegerKey("max_buffers_per_session", kLimits,
                            "most buffers one session may have registered",
                            &Config::max_buffers_per_session, 1, 1 << 20));
  keys.push_back(IntegerKey("max_buffers_per_uid", kLimits,
                            "most buffers the sessions of one user may have registered",
                            &Config::max_buffers_per_uid, 1, 1 << 20));
  keys.push_back(IntegerKey("max_buffers", kLimits,
                            "most buffers registered in all (each is a mapping: keep it well "
                            "below vm.max_map_count)",
                            &Config::max_buffers, 1, 1 << 20));
  keys.push_back(SizeKey("max_mapped_bytes_per_session", kLimits,
                         "most bytes of host memory one session may have registered",
                         &Config::max_mapped_bytes_per_session, false, 4096));
  keys.push_back(SizeKey("max_mapped_bytes_per_uid", kLimits,
                         "most bytes of host memory the sessions of one user may have registered",
                         &Config::max_mapped_bytes_per_uid, false, 4096));
  keys.push_back(IntegerKey("max_connections", kLimits,
                            "most connections to the session socket at once",
                            &Config::max_connections, 1, 1 << 20));
  keys.push_back(IntegerKey("max_connections_per_uid", kLimits,
                            "most connections of one user to the session socket at once",
                            &Config::max_connections_per_uid, 1, 1 << 20));

  keys.push_back(ChoiceKey("engine", kEngine,
                           "copy engine: auto (GPU if present, else host), host, cuda or hip",
                           &Config::engine, {"auto", "host", "cuda", "hip"}));
  keys.push_back(IntegerKey("host_engine_threads", kEngine,
                            "host engine worker threads per direction",
                            &Config::host_engine_threads, 1, 64));
  keys.push_back(IntegerKey("copy_delay_us", kEngine,
                            "TEST ONLY: delay every copy this long (delay injection); 0: off",
                            &Config::copy_delay_us, 0, 60 * 1000 * 1000));
  keys.push_back(IntegerKey("poll_idle_us", kEngine, "ring poller spins this long before sleeping",
                            &Config::poll_idle_us, 0, 1000 * 1000));
  keys.push_back(IntegerKey("lane_wait_warn_ms", kEngine,
                            "a GPU lane that waits this long for a client's ticket logs it once",
                            &Config::lane_wait_warn_ms, 1, 3600 * 1000));

  {
    Key key{"log_level", kService, "debug|info|warning|error", "debug, info, warning or error",
            nullptr,     nullptr};
    key.set = [](absl::string_view value, Config& config) {
      Severity severity;
      if (!ParseSeverity(value, &severity)) {
        return KeyError(
            "log_level",
            absl::StrCat("must be one of debug, info, warning, error, got '", value, "'"));
      }
      config.log_level = std::string(value);
      return absl::OkStatus();
    };
    key.print = [](const Config& config) { return config.log_level; };
    keys.push_back(std::move(key));
  }
  keys.push_back(IntegerKey("drain_timeout_ms", kService,
                            "on SIGTERM, wait this long for in-flight jobs; 0: no limit",
                            &Config::drain_timeout_ms, 0, 3600 * 1000));
  keys.push_back(IntegerKey("health_stall_ms", kService,
                            "health fails when jobs without a GPU ticket are in flight and none "
                            "completed for this long; 0: watch the ring poller only",
                            &Config::health_stall_ms, 0, 3600 * 1000));
  {
    Key key{"metrics_listen",
            kService,
            "HOST:PORT",
            "serve Prometheus metrics (GET /metrics) on this TCP address, e.g. 127.0.0.1:9477; "
            "empty: off",
            nullptr,
            nullptr};
    key.set = [](absl::string_view value, Config& config) {
      absl::Status valid = CheckMetricsListen(std::string_view(value.data(), value.size()));
      if (!valid.ok()) return KeyError("metrics_listen", valid);
      config.metrics_listen = std::string(value);
      return absl::OkStatus();
    };
    key.print = [](const Config& config) { return config.metrics_listen; };
    keys.push_back(std::move(key));
  }
  {
    Key key{"config",
            kService,
            "FILE",
            "config file to read (flag only; or $TIERD_CONFIG)",
            nullptr,
            nullptr,
            /*flag_only=*/true};
    key.set = [](absl::string_view value, Config& config) {
      config.config_file = std::string(value);
      return absl::OkStatus();
    };
    key.print = [](const Config& config) { return config.config_file; };
    keys.push_back(std::move(key));
  }
  return keys;
}

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

// Where a value came from, prefixed to its error: "tierd.conf:12: " or "flag --x=y: ".
absl::Status WithOrigin(absl::string_view origin, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(origin, ": ", status.message()));
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(absl::StrCat("cannot open ", path));
  std::string text;
  char buffer[8192];
  // /proc files report size 0, so read to EOF rather than trusting fstat.
  while (true) {
    ssize_t n = ::read(fd.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(absl::StrCat("cannot read ", path));
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  return text;
}

// Environment values that name directories count only when absolute (as the XDG spec says).
std::string AbsoluteEnv(const char* name, bool first_of_list = false) {
  const char* value = std::getenv(name);
  if (value == nullptr || value[0] != '/') return "";
  std::string text = value;
  // systemd joins several RuntimeDirectory=/StateDirectory= entries with ':'.
  if (first_of_list) text = text.substr(0, text.find(':'));
  return text;
}

}  // namespace

ConfigEnv ProcessConfigEnv() {
  ConfigEnv env;
  env.root = ::geteuid() == 0;
  env.runtime_directory = AbsoluteEnv("RUNTIME_DIRECTORY", /*first_of_list=*/true);
  env.state_directory = AbsoluteEnv("STATE_DIRECTORY", /*first_of_list=*/true);
  env.xdg_runtime_dir = AbsoluteEnv("XDG_RUNTIME_DIR");
  env.xdg_state_home = AbsoluteEnv("XDG_STATE_HOME");
  env.home = AbsoluteEnv("HOME");
  return env;
}

Config DefaultConfig(const ConfigEnv& env) {
  auto absolute = [](const std::string& path) { return absl::StartsWith(path, "/"); };
  std::string socket_dir = "/run/tierd";
  if (absolute(env.runtime_directory)) {
    socket_dir = env.runtime_directory;
  } else if (!env.root && absolute(env.xdg_runtime_dir)) {
    socket_dir = env.xdg_runtime_dir + "/tierd";
  }
  std::string state_dir = "/var/lib/tierd";
  if (absolute(env.state_directory)) {
    state_dir = env.state_directory;
  } else if (!env.root && absolute(env.xdg_state_home)) {
    state_dir = env.xdg_state_home + "/tierd";
  } else if (!env.root && absolute(env.home)) {
    state_dir = env.home + "/.local/state/tierd";
  }
  Config config;
  config.socket_path = socket_dir + "/tierd.sock";
  config.state_dir = state_dir;
  return config;
}

Config DefaultConfig() { return DefaultConfig(ProcessConfigEnv()); }

absl::Status ApplyConfigText(std::string_view text_in, std::string_view origin_in, Config* config) {
  absl::string_view text = ToAbsl(text_in);
  absl::string_view origin = ToAbsl(origin_in);
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);  // also drops a '\r' of CRLF files
    if (line.empty() || line[0] == '#') continue;
    std::string where = absl::StrCat(origin, ":", line_number);
    size_t equals = line.find('=');
    if (equals == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected 'key = value', got '", line, "'"));
    }
    absl::string_view name = absl::StripTrailingAsciiWhitespace(line.substr(0, equals));
    absl::string_view value = absl::StripLeadingAsciiWhitespace(line.substr(equals + 1));
    const Key* key = FindKey(name);
    if (key == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown key '", name, "'"));
    }
    if (key->flag_only) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": '", name, "' can only be given as a flag (--", name, "=...)"));
    }
    if (absl::Status status = key->set(value, *config); !status.ok())
      return WithOrigin(where, status);
  }
  return absl::OkStatus();
}

absl::Status ApplyConfigFile(const std::string& path, Config* config) {
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok())
    return absl::Status(text.status().code(),
                        absl::StrCat("config file: ", text.status().message()));
  if (absl::Status status = ApplyConfigText(*text, path, config); !status.ok()) return status;
  config->config_file = path;
  return absl::OkStatus();
}

absl::StatusOr<Config> LoadConfig(const std::vector<std::string>& args) {
  // One pass to split the flags into (flag text, key, value); the file goes in before any of them
  // applies, so flags win wherever they stand relative to --config.
  struct Flag {
    std::string text;
    const Key* key;
    std::string value;
  };
  std::vector<Flag> flags;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!absl::StartsWith(arg, "--") || arg.size() == 2) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    size_t equals = arg.find('=');
    std::string name = arg.substr(2, equals == std::string::npos ? std::string::npos : equals - 2);
    for (char& c : name) {
      if (c == '-') c = '_';
    }
    const Key* key = FindKey(name);
    if (key == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (see --help)"));
    }
    Flag flag{arg, key, ""};
    if (equals != std::string::npos) {
      flag.value = arg.substr(equals + 1);
    } else if (i + 1 < args.size() && !absl::StartsWith(args[i + 1], "--")) {
      flag.value = args[++i];
      flag.text = absl::StrCat(arg, " ", flag.value);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("flag ", arg, " needs a value (--", name, "=VALUE)"));
    }
    flags.push_back(std::move(flag));
  }

  std::string file;
  bool file_named_by_flag = false;
  for (const Flag& flag : flags) {
    if (flag.key->flag_only) {
      file = flag.value;  // the last --config wins; --config= reads none
      file_named_by_flag = true;
    }
  }
  if (!file_named_by_flag) {
    if (const char* env = std::getenv("TIERD_CONFIG"); env != nullptr) file = env;
  }

  Config config = DefaultConfig();
  if (!file.empty()) {
    if (absl::Status status = ApplyConfigFile(file, &config); !status.ok()) {
      if (!file_named_by_flag && absl::IsNotFound(status)) {
        return absl::Status(status.code(),
                            absl::StrCat(status.message(), " (named by $TIERD_CONFIG)"));
      }
      return status;
    }
  }
  for (const Flag& flag : flags) {
    if (flag.key->flag_only) continue;
    if (absl::Status status = flag.key->set(flag.value, config); !status.ok()) {
      return WithOrigin(absl::StrCat("flag ", flag.text), status);
    }
  }
  if (absl::Status status = Finalize(&config); !status.ok()) return status;
  return config;
}

absl::Status CheckMetricsListen(std::string_view value_in) {
  absl::string_view value = ToAbsl(value_in);
  if (value.empty()) return absl::OkStatus();
  const auto bad = [value](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", value, "': ", why, "; expected HOST:PORT, e.g. 127.0.0.1:9477"));
  };
  if (absl::StartsWith(value, "/") || absl::StartsWith(value, "unix:")) {
    return bad(
        "a Unix socket is not supported: the metrics exporter (prometheus-cpp's civetweb "
        "server) listens on TCP only");
  }
  const size_t colon = value.rfind(':');
  if (colon == absl::string_view::npos) return bad("no port");
  absl::string_view host = value.substr(0, colon);
  absl::string_view port = value.substr(colon + 1);
  absl::StatusOr<uint64_t> number = ParseUnsigned(port);
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
    if (fields.empty() || fields.size() > 2 || !AllDigits(fields[0]) ||
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
  for (absl::string_view name : {"socket", "session_socket", "state_dir", "spill_dir"}) {
    const Key* key = FindKey(name);
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
        absl::StrCat("default_quota_bytes (", FormatSize(config->default_quota_bytes),
                     ") exceeds max_quota_bytes (", FormatSize(config->max_quota_bytes), ")"));
  }

  if (config->pool_bytes == 0) {
    absl::StatusOr<std::string> meminfo = ReadWholeFile("/proc/meminfo");
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

std::string DescribeConfig(const Config& config) {
  std::string text =
      config.config_file.empty()
          ? "# tierd settings (no config file)\n"
          : absl::StrCat("# tierd settings (config file: ", config.config_file, ")\n");
  absl::string_view section;
  for (const Key& key : Keys()) {
    if (key.flag_only) continue;
    if (key.section != section) {
      section = key.section;
      absl::StrAppend(&text, "\n# ", section, "\n");
    }
    std::string value = key.print(config);
    absl::StrAppend(&text, key.name, value.empty() ? " =" : " = ", value, "\n");
  }
  return text;
}

std::string ConfigUsage() {
  const Config defaults = DefaultConfig();
  std::string text;
  for (const Key& key : Keys()) {
    std::string flag = absl::StrCat("--", key.name, "=", key.hint);
    if (flag.size() < 30) flag.resize(30, ' ');
    std::string value = key.print(defaults);
    absl::StrAppend(&text, "  ", flag, " ", key.help);
    if (!value.empty()) absl::StrAppend(&text, " [", value, "]");
    absl::StrAppend(&text, "\n");
  }
  return text;
}

}  // namespace tier::daemon
