#include "tierctl/socket_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace tier::ctl {
namespace {

class SocketPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/tierctl_socket_path_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    runtime_dir_ = pattern;
  }
  void TearDown() override {
    ::unlink((runtime_dir_ + "/tierd/tierd.sock").c_str());
    ::rmdir((runtime_dir_ + "/tierd").c_str());
    ::rmdir(runtime_dir_.c_str());
  }
  void CreateUserSocketFile() {
    ASSERT_EQ(::mkdir((runtime_dir_ + "/tierd").c_str(), 0700), 0);
    std::ofstream(runtime_dir_ + "/tierd/tierd.sock") << "";
  }

  std::string runtime_dir_;
};

TEST_F(SocketPathTest, FlagWinsOverEverything) {
  CreateUserSocketFile();
  EXPECT_EQ(ResolveSocketPath({"/flag.sock", "/env.sock", runtime_dir_}), "/flag.sock");
}

TEST_F(SocketPathTest, TierSocketEnvironmentComesNext) {
  CreateUserSocketFile();
  EXPECT_EQ(ResolveSocketPath({"", "/env.sock", runtime_dir_}), "/env.sock");
}

TEST_F(SocketPathTest, RuntimeDirSocketOnlyWhenItExists) {
  EXPECT_EQ(ResolveSocketPath({"", "", runtime_dir_}), kSystemSocketPath);
  CreateUserSocketFile();
  EXPECT_EQ(ResolveSocketPath({"", "", runtime_dir_}), runtime_dir_ + "/tierd/tierd.sock");
}

TEST_F(SocketPathTest, SystemPathWhenNothingIsSet) {
  EXPECT_EQ(ResolveSocketPath({"", "", ""}), "/run/tierd/tierd.sock");
}

TEST_F(SocketPathTest, PathExistsOnlyDeniesMissingPaths) {
  EXPECT_TRUE(PathExists(runtime_dir_));
  EXPECT_FALSE(PathExists(runtime_dir_ + "/tierd/tierd.sock"));
  EXPECT_FALSE(PathExists("/nonexistent/x.sock"));
  CreateUserSocketFile();
  EXPECT_TRUE(PathExists(runtime_dir_ + "/tierd/tierd.sock"));
}

TEST_F(SocketPathTest, ReadsTheEnvironment) {
  ASSERT_EQ(::setenv("TIER_SOCKET", "/from/env.sock", 1), 0);
  ASSERT_EQ(::setenv("XDG_RUNTIME_DIR", runtime_dir_.c_str(), 1), 0);
  SocketPathSources sources = SocketPathSourcesFromEnvironment("/flag.sock");
  EXPECT_EQ(sources.flag, "/flag.sock");
  EXPECT_EQ(sources.tier_socket_env, "/from/env.sock");
  EXPECT_EQ(sources.runtime_dir_env, runtime_dir_);
  ASSERT_EQ(::unsetenv("TIER_SOCKET"), 0);
  ASSERT_EQ(::unsetenv("XDG_RUNTIME_DIR"), 0);
  sources = SocketPathSourcesFromEnvironment("");
  EXPECT_EQ(sources.tier_socket_env, "");
  EXPECT_EQ(sources.runtime_dir_env, "");
}

}  // namespace
}  // namespace tier::ctl
