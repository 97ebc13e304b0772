#include "common/process_state.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace tier {

char ProcStatState(std::string_view stat_line) {
  const size_t close = stat_line.rfind(')');
  if (close == std::string_view::npos || stat_line.find('(') > close) return '\0';
  // ") S ...": the state is the first field after the command name.
  if (close + 2 >= stat_line.size() || stat_line[close + 1] != ' ') return '\0';
  const char state = stat_line[close + 2];
  const bool alone = close + 3 == stat_line.size() || stat_line[close + 3] == ' ' ||
                     stat_line[close + 3] == '\n';
  return alone && state > ' ' ? state : '\0';
}

std::string DescribeStateLetter(char state) {
  switch (state) {
    case 'R':
      return "running (R)";
    case 'S':
      return "sleeping (S: waiting for an event)";
    case 'D':
      return "in uninterruptible sleep (D: a disk or driver call that has not returned)";
    case 'T':
      return "stopped (T: SIGSTOP or a job-control stop; SIGCONT resumes it)";
    case 't':
      return "stopped by a debugger (t)";
    case 'Z':
      return "a zombie (Z: it exited and was not reaped)";
    case 'X':
      return "dead (X)";
    case 'I':
      return "idle (I)";
    default:
      return absl::StrCat("in state '", std::string(1, state), "'");
  }
}

std::string DescribeProcessState(pid_t pid) {
  if (pid <= 0) return "of unknown state (not visible from this process's PID namespace)";
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  if (!in) return "gone (no /proc entry)";
  std::stringstream text;
  text << in.rdbuf();
  const char state = ProcStatState(text.str());
  if (state == '\0') return "of unknown state (an unreadable /proc entry)";
  return DescribeStateLetter(state);
}

}  // namespace tier
