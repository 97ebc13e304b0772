// The test helper that runs part of a test as another user (as_uid.h): the child really is that
// uid, has no way back to root, talks to the test both ways, and never outlives a deadline.
#include "as_uid.h"

#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "gtest/gtest.h"
#include "tier/client.hpp"
#include "tierd_process.h"

namespace tier::testing {
namespace {

TEST(AsUid, RunsTheBodyAsTheUidWithItsArguments) {
  TIER_SKIP_UNLESS_ROOT();
  UidRun run = RunAsUid(kTestUidA, +[](UidChannel& c) {
    c.Say(std::to_string(::getuid()) + " " + std::to_string(::geteuid()) + " " +
          std::to_string(::getgid()) + " " + std::to_string(::getgroups(0, nullptr)));
    for (const std::string& arg : c.args()) c.Say(arg);
    c.Say("");
    return 7;
  }, {"first", "second arg", ""});
  EXPECT_EQ(run.exit.Describe(), "exited 7");
  const std::string uid = std::to_string(kTestUidA);
  ASSERT_EQ(run.lines.size(), 5u);
  EXPECT_EQ(run.lines[0], uid + " " + uid + " " + uid + " 0");
  EXPECT_EQ(run.lines[1], "first");
  EXPECT_EQ(run.lines[2], "second arg");
  EXPECT_EQ(run.lines[3], "");
  EXPECT_EQ(run.lines[4], "");
}

TEST(AsUid, TheChildCannotBecomeRootAgain) {
  TIER_SKIP_UNLESS_ROOT();
  UidRun run = RunAsUid(kTestUidB, +[](UidChannel&) {
    return ::setuid(0) == 0 || ::seteuid(0) == 0 || ::setgid(0) == 0 ? 1 : 0;
  });
  EXPECT_EQ(run.exit.Describe(), "exited 0");
}

TEST(AsUid, LinesGoBothWays) {
  TIER_SKIP_UNLESS_ROOT();
  AsUid child(kTestUidA, +[](UidChannel& c) {
    c.Say("ready");
    for (;;) {
      std::string line = c.Hear(10000);
      if (line.empty()) return 3;
      if (line == "stop") return 0;
      c.Say("echo " + line);
    }
  });
  ASSERT_EQ(child.ReadLine(10000), "ready");
  child.Tell("one");
  EXPECT_EQ(child.ReadLine(10000), "echo one");
  child.Tell("two");
  EXPECT_EQ(child.ReadLine(10000), "echo two");
  child.Tell("stop");
  EXPECT_EQ(child.Wait(10000).Describe(), "exited 0");
}

TEST(AsUid, AChildPastItsDeadlineIsKilled) {
  TIER_SKIP_UNLESS_ROOT();
  AsUid child(kTestUidA, +[](UidChannel& c) {
    c.Say("waiting");
    c.Hear(-1);  // the test never says anything
    return 0;
  });
  ASSERT_EQ(child.ReadLine(10000), "waiting");
  UidExit exit = child.Wait(200);
  EXPECT_TRUE(exit.timed_out) << exit.Describe();
  EXPECT_NE(exit.Describe().find("timed out"), std::string::npos);
}

TEST(AsUid, AnExceptionIsAFailingExitWithItsMessageOnStderr) {
  TIER_SKIP_UNLESS_ROOT();
  UidRun run = RunAsUid(kTestUidA, +[](UidChannel&) -> int {
    throw std::runtime_error("as intended");
  });
  EXPECT_EQ(run.exit.Describe(), "exited 70");
}

// The use it exists for: a client of tierd as another uid, from a test process whose own gRPC
// threads run (TierdProcess's channel), which a bare fork could not use safely.
TEST(AsUid, AChildIsATierdClientAsItsUid) {
  TIER_SKIP_UNLESS_ROOT();
  TierdProcess tierd({"--socket_mode=0666"});
  ASSERT_EQ(::chmod(tierd.dir().c_str(), 0755), 0);
  ASSERT_TRUE(tierd.Status().IsInitialized());
  AsUid child(kTestUidA, +[](UidChannel& c) {
    Session::Options options;
    options.socket_path = c.args()[0];
    options.name = "as-uid";
    Session session(options);
    HostBuffer buffer = session.AllocHost(65536);
    std::memset(buffer.data, 0x3c, 65536);
    auto [object, offload] = session.Offload(buffer.id, 0, 65536);
    session.Wait(offload);
    std::memset(buffer.data, 0, 65536);
    session.Wait(session.Reload(object, buffer.id, 0, 65536));
    c.Say(static_cast<unsigned char*>(buffer.data)[65535] == 0x3c ? "round trip" : "mismatch");
    return c.Hear(20000) == "done" ? 0 : 1;  // its session stays open until the test looked
  }, {tierd.socket()});
  ASSERT_EQ(child.ReadLine(20000), "round trip");
  v1::ListSessionsResponse sessions = tierd.Sessions();
  ASSERT_EQ(sessions.sessions_size(), 1);
  EXPECT_EQ(sessions.sessions(0).uid(), kTestUidA);  // as tierd sees it (SO_PEERCRED)
  child.Tell("done");
  EXPECT_EQ(child.Wait(20000).Describe(), "exited 0");
}

}  // namespace
}  // namespace tier::testing
