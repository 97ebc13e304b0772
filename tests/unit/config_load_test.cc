// Loading the config (file, environment, flags: which wins, and errors that name their source),
// the host pool's sizing from /proc/meminfo, Finalize's derived values and cross-field checks, and
// the description of every key: it round trips, the usage lists it, and so does the shipped file.
#include "unit/config_test_util.h"

namespace tier::daemon::config_testing {
namespace {

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
}  // namespace tier::daemon::config_testing
