// The config's defaults (root, XDG, systemd's directories, the process environment) and its text:
// comments, suffixes, octal modes, NUMA lists, persistent limits, bad input named by its line,
// paths that would not round trip, metrics addresses, and a file applied.
#include "unit/config_test_util.h"

namespace tier::daemon::config_testing {
namespace {

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

}  // namespace
}  // namespace tier::daemon::config_testing
