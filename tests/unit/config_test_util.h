// What the config tests share (config_text_test.cc, config_load_test.cc): a temporary directory,
// the environment of root, and two checks over every key of the config.
#ifndef TIER_TESTS_UNIT_CONFIG_TEST_UTIL_H_
#define TIER_TESTS_UNIT_CONFIG_TEST_UTIL_H_

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

namespace tier::daemon::config_testing {

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

inline ConfigEnv RootEnv() {
  ConfigEnv env;
  env.root = true;
  return env;
}

// Every field, so a printer or parser that loses information fails here.
inline void ExpectSameConfig(const Config& a, const Config& b) {
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
  EXPECT_EQ(a.max_reserved_bytes_per_session, b.max_reserved_bytes_per_session);
  EXPECT_EQ(a.max_reserved_bytes_per_uid, b.max_reserved_bytes_per_uid);
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
inline std::vector<std::string> DescribedKeys(const std::string& text) {
  std::vector<std::string> keys;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    keys.push_back(line.substr(0, line.find(' ')));
  }
  return keys;
}

}  // namespace tier::daemon::config_testing

#endif  // TIER_TESTS_UNIT_CONFIG_TEST_UTIL_H_
