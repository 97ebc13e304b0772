// What the kernel says another process is doing, in words a log line can carry. A client that has
// waited long for tierd names tierd's state, which tells a hang's causes apart: a stopped tierd
// (SIGSTOP, a debugger), one stuck in a disk or driver call (uninterruptible sleep), one that is
// gone, or one that runs and is only slow.
#ifndef TIER_COMMON_PROCESS_STATE_H_
#define TIER_COMMON_PROCESS_STATE_H_

#include <sys/types.h>

#include <string>
#include <string_view>

namespace tier {

// The state letter of a /proc/<pid>/stat line ("R", "S", "D", "T", "t", "Z", ...), or '\0' when
// the line is not one (the command name may hold spaces and parentheses: the state follows the
// last ')').
char ProcStatState(std::string_view stat_line);

// The state letter in words, e.g. 'T' -> "stopped (T: SIGSTOP or a job-control stop; SIGCONT
// resumes it)".
std::string DescribeStateLetter(char state);

// "tierd (pid 123) is stopped (...)"-ready text for `pid`: its state in words, or why it cannot be
// told (pid 0: not visible from this PID namespace; no /proc entry: the process is gone).
std::string DescribeProcessState(pid_t pid);

}  // namespace tier

#endif  // TIER_COMMON_PROCESS_STATE_H_
