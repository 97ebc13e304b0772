#include "daemon/config/config.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scoped_env.h"

namespace tier::daemon {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;

using ::tier::testing::ScopedEnv;

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "tierd-config-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data()) ? pattern : "";
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& text) const {
    std::string file = path_ + "/" + name;
    std::ofstream(file) << text;
    return file;
  }

 private:
  std::string path_;
};

ConfigEnv RootEnv() {
  ConfigEnv env;
  env.root = true;
  return env;
}

// Every field, so a printer or parser that loses information fails here.
void ExpectSameConfig(const Config& a, const Config& b) {
  EXPECT_EQ(a.socket_path, b.socket_path);
  EXPECT_EQ(a.session_socket_path, b.session_socket_path);
  EXPECT_EQ(a.state_dir, b.state_dir);
  EXPECT_EQ(a.spill_dirs, b.spill_dirs);
  EXPECT_EQ(a.socket_mode, b.socket_mode);
  EXPECT_EQ(a.socket_group, b.socket_group);
  EXPECT_EQ(a.pool_bytes, b.pool_bytes);
  EXPECT_EQ(a.pool_fraction, b.pool_fraction);
  EXPECT_EQ(a.pool_max_bytes, b.pool_max_bytes);
  EXPECT_EQ(a.pool_numa_node, b.pool_numa_node);
  EXPECT_EQ(a.pool_numa, b.pool_numa);
  EXPECT_EQ(a.topology_sysfs_root, b.topology_sysfs_root);
  EXPECT_EQ(a.pool_lock, b.pool_lock);
  EXPECT_EQ(a.default_quota_bytes, b.default_quota_bytes);
  EXPECT_EQ(a.max_quota_bytes, b.max_quota_bytes);
  EXPECT_EQ(a.persistent_quota_bytes_per_uid, b.persistent_quota_bytes_per_uid);
  EXPECT_EQ(a.persistent_max_bytes, b.persistent_max_bytes);
  EXPECT_EQ(a.persistent_max_objects_per_uid, b.persistent_max_objects_per_uid);
  EXPECT_EQ(a.persistent_max_objects, b.persistent_max_objects);
  EXPECT_EQ(a.persistent_journal_max_bytes, b.persistent_journal_max_bytes);
  EXPECT_EQ(a.ring_entries, b.ring_entries);
  EXPECT_EQ(a.max_sessions, b.max_sessions);
  EXPECT_EQ(a.attach_timeout_ms, b.attach_timeout_ms);
  EXPECT_EQ(a.max_sessions_per_uid, b.max_sessions_per_uid);
  EXPECT_EQ(a.max_buffers_per_session, b.max_buffers_per_session);
  EXPECT_EQ(a.max_buffers_per_uid, b.max_buffers_per_uid);
  EXPECT_EQ(a.max_buffers, b.max_buffers);
  EXPECT_EQ(a.max_mapped_bytes_per_session, b.max_mapped_bytes_per_session);
  EXPECT_EQ(a.max_mapped_bytes_per_uid, b.max_mapped_bytes_per_uid);
  EXPECT_EQ(a.max_connections, b.max_connections);
  EXPECT_EQ(a.max_connections_per_uid, b.max_connections_per_uid);
  EXPECT_EQ(a.engine, b.engine);
  EXPECT_EQ(a.spill_io, b.spill_io);
  EXPECT_EQ(a.spill_inject_faults.text, b.spill_inject_faults.text);
  EXPECT_EQ(a.host_engine_threads, b.host_engine_threads);
  EXPECT_EQ(a.copy_delay_us, b.copy_delay_us);
  EXPECT_EQ(a.poll_idle_us, b.poll_idle_us);
  EXPECT_EQ(a.gpu_poll_spin_us, b.gpu_poll_spin_us);
  EXPECT_EQ(a.gpu_lane_window_bytes, b.gpu_lane_window_bytes);
  EXPECT_EQ(a.log_level, b.log_level);
  EXPECT_EQ(a.drain_timeout_ms, b.drain_timeout_ms);
  EXPECT_EQ(a.health_stall_ms, b.health_stall_ms);
  EXPECT_EQ(a.metrics_listen, b.metrics_listen);
}

// The `key` of every `key = value` line of DescribeConfig, in order.
std::vector<std::string> DescribedKeys(const std::string& text) {
  std::vector<std::string> keys;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    keys.push_back(line.substr(0, line.find(' ')));
  }
  return keys;
}

// ---- Defaults -----------------------------------------------------------------------------------

TEST(DefaultConfig, RootUsesSystemPathsEvenWithXdg) {
  ConfigEnv env = RootEnv();
  env.xdg_runtime_dir = "/run/user/0";
  env.xdg_state_home = "/root/.local/state";
  env.home = "/root";
  Config config = DefaultConfig(env);
  EXPECT_EQ(config.socket_path, "/run/tierd/tierd.sock");
  EXPECT_EQ(config.state_dir, "/var/lib/tierd");
  EXPECT_EQ(config.session_socket_path, "");  // derived by Finalize
  EXPECT_TRUE(config.spill_dirs.empty());
  EXPECT_EQ(config.socket_mode, 0660u);
  EXPECT_EQ(config.ring_entries, 1024u);
  EXPECT_EQ(config.pool_lock, storage::LockMode::kBestEffort);
  EXPECT_EQ(config.socket_group, "");
}

TEST(DefaultConfig, NonRootUsesXdgDirs) {
  ConfigEnv env;
  env.xdg_runtime_dir = "/run/user/1000";
  env.xdg_state_home = "/home/u/state";
  env.home = "/home/u";
  Config config = DefaultConfig(env);
  EXPECT_EQ(config.socket_path, "/run/user/1000/tierd/tierd.sock");
  EXPECT_EQ(config.state_dir, "/home/u/state/tierd");
}

TEST(DefaultConfig, NonRootWithoutXdgFallsBackToHomeAndRun) {
  ConfigEnv env;
  env.home = "/home/u";
  Config config = DefaultConfig(env);
  EXPECT_EQ(config.socket_path, "/run/tierd/tierd.sock");
  EXPECT_EQ(config.state_dir, "/home/u/.local/state/tierd");

  env.home.clear();
  EXPECT_EQ(DefaultConfig(env).state_dir, "/var/lib/tierd");
}

TEST(DefaultConfig, SystemdDirectoriesWin) {
  ConfigEnv env;  // `User=tierd` under the shipped unit: not root, HOME set, systemd's dirs set
  env.runtime_directory = "/run/tierd";
  env.state_directory = "/var/lib/tierd";
  env.xdg_runtime_dir = "/run/user/990";
  env.home = "/var/lib/tierd";
  Config config = DefaultConfig(env);
  EXPECT_EQ(config.socket_path, "/run/tierd/tierd.sock");
  EXPECT_EQ(config.state_dir, "/var/lib/tierd");
}

TEST(DefaultConfig, ProcessEnvReadsVariablesAndIgnoresRelativeOnes) {
  ScopedEnv runtime("RUNTIME_DIRECTORY", "/run/a:/run/b");
  ScopedEnv state("STATE_DIRECTORY", std::nullopt);
  ScopedEnv xdg_runtime("XDG_RUNTIME_DIR", "relative/dir");
  ScopedEnv xdg_state("XDG_STATE_HOME", "/home/x/state");
  ScopedEnv home("HOME", "/home/x");
  ConfigEnv env = ProcessConfigEnv();
  EXPECT_EQ(env.root, ::geteuid() == 0);
  EXPECT_EQ(env.runtime_directory, "/run/a");  // the first of systemd's ':'-joined list
  EXPECT_EQ(env.state_directory, "");
  EXPECT_EQ(env.xdg_runtime_dir, "");  // relative values are ignored, as the XDG spec says
  EXPECT_EQ(env.xdg_state_home, "/home/x/state");
  EXPECT_EQ(env.home, "/home/x");
  EXPECT_EQ(DefaultConfig().socket_path, "/run/a/tierd.sock");
  EXPECT_EQ(DefaultConfig().state_dir, ::geteuid() == 0 ? "/var/lib/tierd" : "/home/x/state/tierd");
}

// ---- File syntax --------------------------------------------------------------------------------

TEST(ConfigText, CommentsWhitespaceSuffixesAndOctal) {
  Config config = DefaultConfig(RootEnv());
  const char* text =
      "# a comment\n"
      "\n"
      "   # an indented comment\n"
      "socket=/srv/tier#1/tierd.sock\n"  // '#' inside a value is not a comment
      "  pool_bytes   =   4 GiB  \n"
      "\tpool_max_bytes\t=\t16g\r\n"  // tabs, lower case, CRLF
      "default_quota_bytes = 512M\n"
      "max_quota_bytes = 1T\n"
      "socket_mode = 0640\n"
      "pool_numa_node = -1\n"
      "pool_numa_node = 1\n"  // later lines win
      "pool_fraction = 0.5\n"
      "ring_entries = 64\n"
      "engine = host\n"
      "log_level = debug\n"
      "socket_group = tier\n"
      "copy_delay_us = 1500\n";
  ASSERT_TRUE(ApplyConfigText(text, "t.conf", &config).ok());
  EXPECT_EQ(config.socket_path, "/srv/tier#1/tierd.sock");
  EXPECT_EQ(config.pool_bytes, 4 * kGiB);
  EXPECT_EQ(config.pool_max_bytes, 16 * kGiB);
  EXPECT_EQ(config.default_quota_bytes, 512 * kMiB);
  EXPECT_EQ(config.max_quota_bytes, 1ull << 40);
  EXPECT_EQ(config.socket_mode, 0640u);
  EXPECT_EQ(config.pool_numa_node, 1);
  EXPECT_EQ(config.pool_fraction, 0.5);
  EXPECT_EQ(config.ring_entries, 64u);
  EXPECT_EQ(config.engine, engine::EngineKind::kHost);
  EXPECT_EQ(config.log_level, Severity::kDebug);
  EXPECT_EQ(config.socket_group, "tier");
  EXPECT_EQ(config.copy_delay_us, 1500u);
  EXPECT_EQ(config.state_dir, "/var/lib/tierd");  // untouched keys keep their values
}

TEST(ConfigText, PoolNumaIsAutoOffOrANodeList) {
  Config config = DefaultConfig(RootEnv());
  EXPECT_EQ(config.pool_numa.mode, PoolNuma::Mode::kAuto);  // the default
  EXPECT_EQ(config.topology_sysfs_root, "/sys");
  ASSERT_TRUE(ApplyConfigText("pool_numa = 1, 0,1\n", "t.conf", &config).ok());
  EXPECT_EQ(config.pool_numa, (PoolNuma{PoolNuma::Mode::kNodes, {1, 0, 1}}));  // order, repeats
  EXPECT_THAT(DescribeConfig(config), HasSubstr("\npool_numa = 1,0,1\n"));
  ASSERT_TRUE(ApplyConfigText("pool_numa = off\n", "t.conf", &config).ok());
  EXPECT_EQ(config.pool_numa, (PoolNuma{PoolNuma::Mode::kOff, {}}));
  ASSERT_TRUE(ApplyConfigText("pool_numa = auto\n", "t.conf", &config).ok());
  EXPECT_EQ(config.pool_numa, (PoolNuma{PoolNuma::Mode::kAuto, {}}));
  std::string many = "pool_numa = 0";
  for (int i = 1; i <= 64; ++i) many += ",0";
  absl::Status too_many = ApplyConfigText(many + "\n", "t.conf", &config);
  EXPECT_THAT(std::string(too_many.message()), HasSubstr("at most 64 parts"));
  ASSERT_TRUE(ApplyConfigText("topology_sysfs_root = /tmp/sys\n", "t.conf", &config).ok());
  EXPECT_EQ(config.topology_sysfs_root, "/tmp/sys");
}

TEST(ConfigText, PersistentQuotaPerUidIsASize) {
  Config config = DefaultConfig(RootEnv());
  EXPECT_EQ(config.persistent_quota_bytes_per_uid, 0u);  // 0: 1/16 of pool and NVMe
  ASSERT_TRUE(ApplyConfigText("persistent_quota_bytes_per_uid = 3 GiB\n", "t.conf", &config).ok());
  EXPECT_EQ(config.persistent_quota_bytes_per_uid, 3 * kGiB);
  absl::Status bad = ApplyConfigText("persistent_quota_bytes_per_uid = lots\n", "t.conf", &config);
  EXPECT_TRUE(absl::IsInvalidArgument(bad)) << bad;
  EXPECT_NE(bad.message().find("persistent_quota_bytes_per_uid"), std::string::npos) << bad;
  EXPECT_EQ(config.persistent_quota_bytes_per_uid, 3 * kGiB);
}

// Finding 2 of issue 30: persistent objects are bounded per uid and for the node by default.
TEST(ConfigText, PersistentLimitsHaveDefaultsAndAreChecked) {
  Config config = DefaultConfig(RootEnv());
  EXPECT_EQ(config.persistent_max_bytes, 0u);  // 0: 1/4 of pool and NVMe
  EXPECT_EQ(config.persistent_max_objects_per_uid, 16384u);
  EXPECT_EQ(config.persistent_max_objects, 65536u);
  EXPECT_EQ(config.persistent_journal_max_bytes, 0u);
  ASSERT_TRUE(ApplyConfigText("persistent_max_bytes = 2 GiB\npersistent_max_objects_per_uid = 10\n"
                              "persistent_max_objects = 100\npersistent_journal_max_bytes = 5G\n",
                              "t.conf", &config)
                  .ok());
  EXPECT_EQ(config.persistent_max_bytes, 2 * kGiB);
  EXPECT_EQ(config.persistent_max_objects_per_uid, 10u);
  EXPECT_EQ(config.persistent_max_objects, 100u);
  EXPECT_EQ(config.persistent_journal_max_bytes, 5 * kGiB);
  for (const char* bad : {"persistent_max_objects_per_uid = 0\n", "persistent_max_objects = -1\n",
                          "persistent_max_bytes = lots\n"}) {
    absl::Status status = ApplyConfigText(bad, "t.conf", &config);
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << bad << ": " << status;
  }
}

TEST(ConfigText, EverySizeSuffixIsAPowerOf1024) {
  const std::pair<const char*, uint64_t> kCases[] = {
      {"0", 0},           {"123", 123},         {"1K", 1ull << 10},    {"1KiB", 1ull << 10},
      {"3M", 3ull << 20}, {"3MiB", 3ull << 20}, {"5G", 5ull << 30},    {"5gib", 5ull << 30},
      {"2T", 2ull << 40}, {"2TiB", 2ull << 40}, {"7 MiB", 7ull << 20},
  };
  for (const auto& [text, bytes] : kCases) {
    Config config = DefaultConfig(RootEnv());
    absl::Status status = ApplyConfigText(std::string("max_quota_bytes = ") + text, "t", &config);
    ASSERT_TRUE(status.ok()) << text << ": " << status;
    EXPECT_EQ(config.max_quota_bytes, bytes) << text;
  }
}

TEST(ConfigText, ModeIsOctalWithOrWithoutLeadingZero) {
  Config config = DefaultConfig(RootEnv());
  ASSERT_TRUE(ApplyConfigText("socket_mode = 600", "t", &config).ok());
  EXPECT_EQ(config.socket_mode, 0600u);
  ASSERT_TRUE(ApplyConfigText("socket_mode = 0666", "t", &config).ok());
  EXPECT_EQ(config.socket_mode, 0666u);
}

TEST(ConfigText, EmptyValuesOnlyWhereTheyMeanSomething) {
  Config config = DefaultConfig(RootEnv());
  config.socket_group = "tier";
  ASSERT_TRUE(ApplyConfigText("socket_group =\nsession_socket =\nspill_dir =", "t", &config).ok());
  EXPECT_EQ(config.socket_group, "");
  absl::Status status = ApplyConfigText("socket =", "t", &config);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("t:1: socket: must be an absolute path"));
}

// Each bad value is on line 3 (after a comment and a good line) and the error must say so, name
// the key and explain.
TEST(ConfigText, BadInputNamesTheLine) {
  const std::pair<const char*, const char*> kCases[] = {
      {"no_such_key = 1", "unknown key 'no_such_key'"},
      {"ring_entries 64", "expected 'key = value'"},
      {"ring_entries = 100", "ring_entries: must be a power of two in 8..65536, got 100"},
      {"ring_entries = 4", "ring_entries: must be a power of two in 8..65536"},
      {"ring_entries = 131072", "ring_entries: must be a power of two in 8..65536"},
      {"ring_entries = -8", "ring_entries: invalid value '-8'"},
      {"ring_entries = 0x40", "ring_entries: invalid value '0x40'"},
      {"ring_entries = ", "ring_entries: invalid value ''"},
      {"pool_fraction = 0", "pool_fraction: must be in (0, 1]"},
      {"pool_fraction = 1.5", "pool_fraction: must be in (0, 1]"},
      {"pool_fraction = nan", "pool_fraction: invalid value 'nan'"},
      {"pool_fraction = half", "pool_fraction: invalid value 'half'"},
      {"host_engine_threads = 0", "host_engine_threads: must be in 1..64"},
      {"host_engine_threads = 65", "host_engine_threads: must be in 1..64"},
      {"pool_lock = sometimes", "pool_lock: must be one of off, best-effort, required"},
      {"engine = gpu", "engine: must be one of auto, host, cuda, hip"},
      {"log_level = verbose", "log_level: must be one of debug, info, warning, error"},
      {"state_dir = var/lib/tierd", "state_dir: must be an absolute path"},
      {"spill_dir = ./spill", "spill_dir: must be absolute paths, comma-separated, got './spill'"},
      {"spill_dir = /nvme0/t,,/nvme1/t",
       "spill_dir: must be absolute paths, comma-separated, got ''"},
      {"spill_dir = /nvme0/t, /nvme0/t/", "spill_dir: '/nvme0/t' is named twice"},
      {"socket_mode = 0999", "socket_mode: invalid value '0999'"},
      {"socket_mode = 01777", "socket_mode: mode 01777 has bits beyond 0777"},
      {"socket_group = two words", "socket_group: 'two words' is not a group name"},
      {"pool_bytes = 12X", "pool_bytes: invalid value '12X'"},
      {"pool_bytes = 1.5G", "pool_bytes: invalid value '1.5G'"},
      {"pool_bytes = 99999999999T", "pool_bytes: size '99999999999T' overflows 64 bits"},
      {"pool_bytes = 1M", "pool_bytes: must be 0 or at least 2MiB"},
      {"pool_max_bytes = 32M", "pool_max_bytes: must be at least 64MiB"},
      {"pool_numa_node = -2", "pool_numa_node: must be in -1..1023"},
      {"pool_numa = on", "pool_numa: must be auto, off or NUMA nodes (0,1): expected NUMA "
                         "nodes 0..1023, comma-separated, got 'on'"},
      {"pool_numa = 0,,1", "pool_numa: must be auto, off or NUMA nodes (0,1): expected NUMA "
                           "nodes 0..1023, comma-separated, got ''"},
      {"pool_numa = 0,1024", "pool_numa: must be auto, off or NUMA nodes (0,1): expected NUMA "
                        "nodes 0..1023, comma-separated, got '1024'"},
      {"pool_numa = -1", "pool_numa: must be auto, off or NUMA nodes (0,1): expected NUMA "
                        "nodes 0..1023, comma-separated, got '-1'"},
      {"pool_numa = 0-1", "pool_numa: must be auto, off or NUMA nodes (0,1): expected NUMA "
                        "nodes 0..1023, comma-separated, got '0-1'"},
      {"topology_sysfs_root = sys", "topology_sysfs_root: must be an absolute path"},
      {"max_sessions = 0", "max_sessions: must be in 1..65536"},
      {"config = /etc/tierd/other.conf", "'config' can only be given as a flag"},
  };
  for (const auto& [line, message] : kCases) {
    Config config = DefaultConfig(RootEnv());
    std::string text = std::string("# header\nring_entries = 64\n") + line + "\nengine = host\n";
    absl::Status status = ApplyConfigText(text, "/etc/tierd/tierd.conf", &config);
    ASSERT_FALSE(status.ok()) << line;
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << line;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(std::string("/etc/tierd/tierd.conf:3: ") + message))
        << line;
  }
}

// Found by tests/fuzz/config_fuzzer.cc: a path with a NUL in it (the system calls would see a
// shorter one than the printed one), or one that ends in a blank once its trailing '/' is dropped
// (a config line loses the blank), was accepted and did not survive --print-config.
TEST(ConfigText, PathsThatWouldNotRoundTripAreRefused) {
  const std::pair<std::string, std::string> kCases[] = {
      {"spill_dir = /nvme0/ti /",
       "spill_dir: '/nvme0/ti ': a path must not begin or end with a blank"},
      {std::string("spill_dir = /nvme0/t\0x", 22),
       "spill_dir: a path must not hold control characters"},
      {std::string("state_dir = /var/\0lib", 21),
       "state_dir: a path must not hold control characters"},
      {"socket = /run/\ttierd.sock", "socket: a path must not hold control characters"},
  };
  for (const auto& [line, message] : kCases) {
    Config config = DefaultConfig(RootEnv());
    absl::Status status = ApplyConfigText(line, "t", &config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << line;
    EXPECT_THAT(std::string(status.message()), HasSubstr(message)) << line;
  }
  Config config = DefaultConfig(RootEnv());
  EXPECT_EQ(LoadConfig({"--socket=/run/tierd/tierd.sock "}).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(ApplyConfigText("spill_dir = /nvme0/t /nvme1", "t", &config).ok());  // inner blank
}

TEST(ConfigText, MetricsListenTakesTcpAddressesOnly) {
  for (const char* good : {"127.0.0.1:9477", "0.0.0.0:9477", "[::1]:9477", "node-7.example:80",
                           ""}) {
    Config config = DefaultConfig(RootEnv());
    absl::Status status =
        ApplyConfigText(std::string("metrics_listen = ") + good + "\n", "t", &config);
    EXPECT_TRUE(status.ok()) << good << ": " << status;
    EXPECT_EQ(config.metrics_listen, good);
  }
  const std::pair<const char*, const char*> bad[] = {
      {"/run/tierd/metrics.sock", "a Unix socket is not supported"},
      {"unix:/run/tierd/metrics.sock", "a Unix socket is not supported"},
      {"9477", "no port"},
      {"127.0.0.1:", "the port must be 1..65535"},
      {"127.0.0.1:0", "the port must be 1..65535"},
      {"127.0.0.1:65536", "the port must be 1..65535"},
      {":9477", "no host"},
      {"[::1:9477", "an unclosed [IPv6] address"},
      {"[zz]:9477", "not an IPv6 address"},
      {"host name:9477", "not a host name"},
  };
  for (const auto& [value, message] : bad) {
    Config config = DefaultConfig(RootEnv());
    absl::Status status =
        ApplyConfigText(std::string("metrics_listen = ") + value + "\n", "t", &config);
    EXPECT_THAT(std::string(status.message()), HasSubstr(message)) << value;
    EXPECT_THAT(std::string(status.message()), HasSubstr("t:1: metrics_listen: ")) << value;
  }
}

TEST(ConfigFile, AppliesFileAndRecordsIt) {
  TempDir dir;
  std::string path = dir.Write("tierd.conf", "ring_entries = 256\n");
  Config config = DefaultConfig(RootEnv());
  ASSERT_TRUE(ApplyConfigFile(path, &config).ok());
  EXPECT_EQ(config.ring_entries, 256u);
  EXPECT_EQ(config.config_file, path);

  absl::Status missing = ApplyConfigFile(dir.path() + "/missing.conf", &config);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.message()), HasSubstr("missing.conf"));
}

// ---- Flags and precedence -----------------------------------------------------------------------

class LoadConfigTest : public ::testing::Test {
 protected:
  // Flags that make the result independent of who runs the test and of the machine's memory.
  std::vector<std::string> Args(std::vector<std::string> extra) const {
    std::vector<std::string> args = {"--socket=" + dir_.path() + "/s.sock",
                                     "--state_dir=" + dir_.path(), "--pool_bytes=64M"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  TempDir dir_;
  ScopedEnv no_env_file_{"TIERD_CONFIG", std::nullopt};
};

TEST_F(LoadConfigTest, FlagsOverrideTheFileWhereverTheyStand) {
  std::string file = dir_.Write("c.conf", "ring_entries = 64\nmax_sessions = 7\nengine = host\n");
  absl::StatusOr<Config> config =
      LoadConfig(Args({"--ring_entries=128", "--config=" + file, "--max-sessions", "9"}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->ring_entries, 128u);  // flag before --config still wins
  EXPECT_EQ(config->max_sessions, 9u);    // `--key value` with dashes
  EXPECT_EQ(config->engine, engine::EngineKind::kHost);      // from the file
  EXPECT_EQ(config->config_file, file);
  // Finalized: derived paths filled in.
  EXPECT_EQ(config->session_socket_path, dir_.path() + "/tierd.session.sock");
  EXPECT_EQ(config->spill_dirs, std::vector<std::string>{dir_.path() + "/spill"});
  EXPECT_EQ(config->pool_bytes, 64 * kMiB);
}

TEST_F(LoadConfigTest, NoFileMeansEmbeddedDefaults) {
  absl::StatusOr<Config> config = LoadConfig(Args({}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->config_file, "");
  EXPECT_EQ(config->ring_entries, 1024u);
  EXPECT_EQ(config->engine, engine::EngineKind::kAuto);
}

TEST_F(LoadConfigTest, EnvironmentNamesTheFileAndTheFlagOverridesIt) {
  std::string env_file = dir_.Write("env.conf", "ring_entries = 32\n");
  std::string flag_file = dir_.Write("flag.conf", "ring_entries = 16\n");
  ScopedEnv env("TIERD_CONFIG", env_file);

  absl::StatusOr<Config> config = LoadConfig(Args({}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->ring_entries, 32u);
  EXPECT_EQ(config->config_file, env_file);

  config = LoadConfig(Args({"--config", flag_file}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->ring_entries, 16u);

  config = LoadConfig(Args({"--config="}));  // explicitly no file
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->ring_entries, 1024u);
  EXPECT_EQ(config->config_file, "");
}

TEST_F(LoadConfigTest, MissingNamedFileIsAnError) {
  absl::StatusOr<Config> config = LoadConfig(Args({"--config=" + dir_.path() + "/nope.conf"}));
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("nope.conf"));

  ScopedEnv env("TIERD_CONFIG", dir_.path() + "/gone.conf");
  config = LoadConfig(Args({}));
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("gone.conf"));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("$TIERD_CONFIG"));
}

TEST_F(LoadConfigTest, FileErrorsNameTheFileAndLine) {
  std::string file = dir_.Write("bad.conf", "# ok\n\nring_entries = 48\n");
  absl::StatusOr<Config> config = LoadConfig(Args({"--config=" + file}));
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(std::string(config.status().message()),
              HasSubstr(file + ":3: ring_entries: must be a power of two"));
}

TEST_F(LoadConfigTest, FlagErrorsNameTheFlag) {
  const std::pair<std::vector<std::string>, const char*> kCases[] = {
      {{"--ring_entries=48"}, "flag --ring_entries=48: ring_entries: must be a power of two"},
      {{"--pool_lock", "maybe"}, "flag --pool_lock maybe: pool_lock: must be one of"},
      {{"--socket_mode=8"}, "flag --socket_mode=8: socket_mode: invalid value '8'"},
      {{"--frobnicate=1"}, "unknown flag --frobnicate"},
      {{"--engine"}, "flag --engine needs a value"},
      {{"--engine", "--ring_entries=64"}, "flag --engine needs a value"},
      {{"stray"}, "unexpected argument 'stray'"},
  };
  for (const auto& [flags, message] : kCases) {
    absl::StatusOr<Config> config = LoadConfig(Args(flags));
    ASSERT_FALSE(config.ok()) << flags[0];
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(config.status().message()), HasSubstr(message)) << flags[0];
  }
}

// ---- Finalize, meminfo and pool sizing ----------------------------------------------------------

TEST(Meminfo, ParsesMemAvailable) {
  const char* kMeminfo =
      "MemTotal:       65843868 kB\n"
      "MemFree:         1234567 kB\n"
      "MemAvailable:   48213496 kB\n"
      "Buffers:          262144 kB\n";
  absl::StatusOr<uint64_t> bytes = ParseMemAvailable(kMeminfo);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, 48213496ull * 1024);
}

TEST(Meminfo, RejectsMissingOrMalformedLine) {
  EXPECT_EQ(ParseMemAvailable("MemTotal: 1 kB\nMemFree: 1 kB\n").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(ParseMemAvailable("MemAvailable: lots kB\n").ok());
  EXPECT_FALSE(ParseMemAvailable("MemAvailable: 12 MB\n").ok());
  EXPECT_FALSE(ParseMemAvailable("").ok());
}

TEST(PoolSizing, FractionCapRoundingAndFloor) {
  // A quarter of 16 GiB.
  EXPECT_EQ(DerivePoolBytes(0.25, 16 * kGiB, 8 * kGiB), 4 * kGiB);
  // Capped at pool_max_bytes.
  EXPECT_EQ(DerivePoolBytes(0.25, 64 * kGiB, 8 * kGiB), 8 * kGiB);
  // Rounded down to 2 MiB, both the share and a cap that is not a multiple.
  EXPECT_EQ(DerivePoolBytes(1.0, 1001 * kMiB + 123, 8 * kGiB), 1000 * kMiB);
  EXPECT_EQ(DerivePoolBytes(1.0, 8 * kGiB, 101 * kMiB + 1), 100 * kMiB);
  // Never under 64 MiB, even on a tiny machine.
  EXPECT_EQ(DerivePoolBytes(0.25, 100 * kMiB, 8 * kGiB), 64 * kMiB);
  EXPECT_EQ(DerivePoolBytes(0.25, 0, 8 * kGiB), 64 * kMiB);
}

TEST(Finalize, DerivesPathsAndPoolAndIsIdempotent) {
  Config config = DefaultConfig(RootEnv());
  ASSERT_TRUE(Finalize(&config).ok());
  EXPECT_EQ(config.session_socket_path, "/run/tierd/tierd.session.sock");
  EXPECT_EQ(config.spill_dirs, std::vector<std::string>{"/var/lib/tierd/spill"});
  // pool_bytes came from this machine's /proc/meminfo by the documented rule.
  absl::StatusOr<std::string> meminfo = [] {
    std::ifstream in("/proc/meminfo");
    std::stringstream text;
    text << in.rdbuf();
    return absl::StatusOr<std::string>(text.str());
  }();
  absl::StatusOr<uint64_t> available = ParseMemAvailable(*meminfo);
  ASSERT_TRUE(available.ok());
  uint64_t expected = DerivePoolBytes(0.25, *available, 8 * kGiB);
  // MemAvailable moves between the two reads; allow a few granules either way.
  EXPECT_NEAR(static_cast<double>(config.pool_bytes), static_cast<double>(expected), 64.0 * kMiB);
  EXPECT_EQ(config.pool_bytes % kPoolGranuleBytes, 0u);
  EXPECT_GE(config.pool_bytes, kMinDerivedPoolBytes);
  EXPECT_LE(config.pool_bytes, 8 * kGiB);
  EXPECT_EQ(config.default_quota_bytes, 0u);  // left 0: the daemon reads it as the whole pool

  Config again = config;
  ASSERT_TRUE(Finalize(&again).ok());
  ExpectSameConfig(again, config);
}

TEST(Finalize, KeepsExplicitValues) {
  Config config = DefaultConfig(RootEnv());
  ASSERT_TRUE(
      ApplyConfigText("pool_bytes = 100M\nsession_socket = /tmp/x.sock\nspill_dir = /nvme/spill",
                      "t", &config)
          .ok());
  ASSERT_TRUE(Finalize(&config).ok());
  EXPECT_EQ(config.pool_bytes, 100 * kMiB);
  EXPECT_EQ(config.session_socket_path, "/tmp/x.sock");
  EXPECT_EQ(config.spill_dirs, std::vector<std::string>{"/nvme/spill"});
}

TEST(ApplyConfigText, SpillDirTakesOneDirectoryPerDevice) {
  Config config = DefaultConfig(RootEnv());
  ASSERT_TRUE(ApplyConfigText("spill_dir = /nvme0/tierd, /nvme1/tierd/", "t", &config).ok());
  EXPECT_EQ(config.spill_dirs, (std::vector<std::string>{"/nvme0/tierd", "/nvme1/tierd"}));
  ASSERT_TRUE(ApplyConfigText("spill_dir =", "t", &config).ok());
  ASSERT_TRUE(Finalize(&config).ok());
  EXPECT_EQ(config.spill_dirs, std::vector<std::string>{config.state_dir + "/spill"});
}

TEST(Finalize, RejectsCrossFieldProblems) {
  Config config = DefaultConfig(RootEnv());
  config.pool_bytes = 64 * kMiB;
  config.socket_path = "/" + std::string(120, 'a') + "/tierd.sock";
  absl::Status status = Finalize(&config);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("socket: "));
  EXPECT_THAT(std::string(status.message()), HasSubstr("Unix socket path"));

  config = DefaultConfig(RootEnv());
  config.pool_bytes = 64 * kMiB;
  config.session_socket_path = config.socket_path;
  EXPECT_THAT(std::string(Finalize(&config).message()),
              HasSubstr("socket and session_socket are both"));

  config = DefaultConfig(RootEnv());
  config.pool_bytes = 64 * kMiB;
  config.default_quota_bytes = 2 * kGiB;
  config.max_quota_bytes = 1 * kGiB;
  EXPECT_THAT(std::string(Finalize(&config).message()),
              HasSubstr("default_quota_bytes (2GiB) exceeds max_quota_bytes (1GiB)"));

  config = DefaultConfig(RootEnv());
  config.pool_bytes = 64 * kMiB;
  config.spill_queue_depth = 1024;  // per directory: 5 of them need more than one io queue holds
  config.spill_dirs = {"/nvme0/t", "/nvme1/t", "/nvme2/t", "/nvme3/t", "/nvme4/t"};
  EXPECT_THAT(std::string(Finalize(&config).message()),
              HasSubstr("spill_queue_depth (1024) x 5 spill directories exceeds the 4096"));
  config.spill_dirs.pop_back();
  EXPECT_TRUE(Finalize(&config).ok());

  config = DefaultConfig(RootEnv());
  config.pool_bytes = 64 * kMiB;
  config.pool_numa = PoolNuma{PoolNuma::Mode::kNodes, {0, 1}};
  config.pool_numa_node = 1;
  EXPECT_THAT(std::string(Finalize(&config).message()),
              HasSubstr("pool_numa_node (1) and a pool_numa node list (0,1) both place the pool"));
  config.pool_numa_node = -1;
  EXPECT_TRUE(Finalize(&config).ok());
  config.pool_numa.nodes.clear();  // a list with no nodes, set in code
  EXPECT_THAT(std::string(Finalize(&config).message()), HasSubstr("pool_numa: "));

  config = DefaultConfig(RootEnv());
  config.state_dir = "relative";  // set in code, not parsed: Finalize still checks
  EXPECT_THAT(std::string(Finalize(&config).message()),
              HasSubstr("state_dir: must be an absolute path"));
}

// ---- DescribeConfig and usage -------------------------------------------------------------------

TEST(DescribeConfig, RoundTripsEveryKey) {
  Config config = DefaultConfig(RootEnv());
  // A value different from the default for every key, including ones that print in the fallback
  // forms (sizes that are not whole units, fractions that need 17 digits).
  config.socket_path = "/srv/tier/ctl.sock";
  config.session_socket_path = "/srv/tier/data.sock";
  config.state_dir = "/srv/state";
  config.spill_dirs = {"/nvme0/tierd", "/nvme1/tierd"};
  config.socket_mode = 0604;
  config.socket_group = "gpu-users";
  config.pool_bytes = 3 * kMiB + 5;
  config.pool_fraction = 1.0 / 3.0;
  config.pool_max_bytes = 96 * kGiB;
  config.pool_numa_node = 1;
  config.pool_numa = PoolNuma{PoolNuma::Mode::kOff, {}};
  config.topology_sysfs_root = "/tmp/fake-sys";
  config.pool_lock = storage::LockMode::kRequired;
  config.persistent_quota_bytes_per_uid = 7 * kGiB + 3;
  config.default_quota_bytes = 1536 * kMiB;
  config.max_quota_bytes = 2 * kGiB + 4096;
  config.ring_entries = 65536;
  config.max_sessions = 17;
  config.attach_timeout_ms = 2500;
  config.engine = engine::EngineKind::kHip;
  config.host_engine_threads = 64;
  config.copy_delay_us = 20000;
  config.poll_idle_us = 0;
  config.log_level = Severity::kWarning;
  config.drain_timeout_ms = 0;
  config.metrics_listen = "127.0.0.1:9477";
  config.config_file = "/etc/tierd/tierd.conf";

  std::string text = DescribeConfig(config);
  EXPECT_THAT(text, HasSubstr("# tierd settings (config file: /etc/tierd/tierd.conf)"));
  EXPECT_THAT(text, HasSubstr("socket_mode = 0604\n"));
  EXPECT_THAT(text, HasSubstr("default_quota_bytes = 1536MiB\n"));
  EXPECT_THAT(text, HasSubstr("pool_max_bytes = 96GiB\n"));

  Config parsed = DefaultConfig(ConfigEnv{});  // a different starting point on purpose
  absl::Status status = ApplyConfigText(text, "described", &parsed);
  ASSERT_TRUE(status.ok()) << status << "\n" << text;
  ExpectSameConfig(parsed, config);
  parsed.config_file = config.config_file;  // a comment in the text, not a setting
  EXPECT_EQ(DescribeConfig(parsed), text);
}

TEST(DescribeConfig, DefaultsRoundTripAfterFinalize) {
  Config config = DefaultConfig(RootEnv());
  ASSERT_TRUE(Finalize(&config).ok());
  Config parsed = DefaultConfig(ConfigEnv{});
  ASSERT_TRUE(ApplyConfigText(DescribeConfig(config), "described", &parsed).ok());
  ExpectSameConfig(parsed, config);
}

TEST(ConfigUsage, ListsEveryKeyWithItsDefault) {
  std::string usage = ConfigUsage();
  for (const std::string& key : DescribedKeys(DescribeConfig(DefaultConfig()))) {
    EXPECT_THAT(usage, HasSubstr("--" + key + "=")) << key;
  }
  EXPECT_THAT(usage, HasSubstr("--config=FILE"));
  EXPECT_THAT(usage, HasSubstr("[1024]"));
  EXPECT_THAT(usage, HasSubstr("--pool_lock=off|best-effort|required"));
}

// deploy/tierd.conf is plain text an operator edits: it must list every key, commented out as
// `#key = value`, with the embedded default for a root daemon under the shipped unit.
TEST(ShippedConfigFile, ListsEveryKeyWithItsDefault) {
  std::ifstream in(std::string(TIER_SOURCE_DIR) + "/deploy/tierd.conf");
  ASSERT_TRUE(in.good());
  std::string uncommented;
  std::vector<std::string> keys;
  for (std::string line; std::getline(in, line);) {
    // `#key = value` (no blank after '#') is a setting; `# text` is prose.
    if (line.size() > 1 && line[0] == '#' && line[1] >= 'a' && line[1] <= 'z') {
      uncommented += line.substr(1) + "\n";
      keys.push_back(line.substr(1, line.find(' ') - 1));
    } else {
      EXPECT_TRUE(line.empty() || line[0] == '#') << "active setting in the shipped file: " << line;
    }
  }
  Config defaults = DefaultConfig(RootEnv());
  EXPECT_EQ(keys, DescribedKeys(DescribeConfig(defaults)));
  Config parsed = DefaultConfig(ConfigEnv{});
  parsed.socket_group = "changed";  // so a missing line could not pass by accident
  absl::Status status = ApplyConfigText(uncommented, "tierd.conf", &parsed);
  ASSERT_TRUE(status.ok()) << status;
  ExpectSameConfig(parsed, defaults);
}

}  // namespace
}  // namespace tier::daemon
