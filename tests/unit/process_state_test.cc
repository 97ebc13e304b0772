// A process's state in words: the /proc/<pid>/stat parser, and live processes (this one, a
// stopped child, a reaped one) as a long wait's warning names tierd's.
#include "common/process_state.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace tier {
namespace {

TEST(ProcStatState, TheFieldAfterTheLastParenthesis) {
  EXPECT_EQ(ProcStatState("123 (tierd) S 1 123 123 0 -1"), 'S');
  EXPECT_EQ(ProcStatState("7 (a) b) (c) T 1 7\n"), 'T');  // a command name with parentheses
  EXPECT_EQ(ProcStatState("9 (x y) D"), 'D');
  EXPECT_EQ(ProcStatState("9 (x) t 1"), 't');
}

TEST(ProcStatState, ALineThatIsNotOneGivesNothing) {
  EXPECT_EQ(ProcStatState(""), '\0');
  EXPECT_EQ(ProcStatState("123 tierd S 1"), '\0');   // no parentheses
  EXPECT_EQ(ProcStatState("123 (tierd)"), '\0');     // nothing after the name
  EXPECT_EQ(ProcStatState("123 (tierd)S 1"), '\0');  // no space before the state
  EXPECT_EQ(ProcStatState("123 (tierd) SS 1"), '\0');  // not one letter
  EXPECT_EQ(ProcStatState(") S ("), '\0');           // '(' after the last ')'
}

TEST(DescribeProcessState, LettersInWords) {
  EXPECT_EQ(DescribeStateLetter('R'), "running (R)");
  EXPECT_NE(DescribeStateLetter('T').find("stopped (T"), std::string::npos);
  EXPECT_NE(DescribeStateLetter('D').find("uninterruptible"), std::string::npos);
  EXPECT_EQ(DescribeStateLetter('?'), "in state '?'");
}

TEST(DescribeProcessState, ThisProcessRuns) {
  EXPECT_EQ(DescribeProcessState(::getpid()), "running (R)");
}

TEST(DescribeProcessState, AStoppedChildIsStoppedAndAReapedOneIsGone) {
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (;;) ::pause();
  }
  ASSERT_EQ(::kill(child, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, WUNTRACED), child);
  ASSERT_TRUE(WIFSTOPPED(status));
  EXPECT_NE(DescribeProcessState(child).find("stopped (T"), std::string::npos)
      << DescribeProcessState(child);
  ASSERT_EQ(::kill(child, SIGCONT), 0);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_EQ(DescribeProcessState(child), "gone (no /proc entry)");
}

TEST(DescribeProcessState, PidZeroIsNotVisible) {
  EXPECT_NE(DescribeProcessState(0).find("not visible"), std::string::npos);
}

}  // namespace
}  // namespace tier
