// Runs part of a test as another user: a function of the test binary, in a child process that
// has dropped to a test uid (setgroups, setgid, setuid), talking to the test through two pipes.
//
//   TEST(HostileClientX, Y) {
//     TIER_SKIP_UNLESS_ROOT();
//     tier::testing::AsUid peer(tier::testing::kTestUidA, +[](tier::testing::UidChannel& c) {
//       ... c.args()[0] ...; c.Say("ready"); c.Hear(10000); ...; return 0;  // the exit code
//     }, {socket_path});
//     ASSERT_EQ(peer.ReadLine(10000), "ready");
//     ... peer.Tell("go"); ...
//     EXPECT_EQ(peer.Wait(30000).Describe(), "exited 0");
//   }
//
// Why a re-executed child, not a bare fork: the test process runs threads (gRPC's among them),
// and a forked copy of it that uses gRPC or a lock one of them held may hang. So the child execs
// /proc/self/exe, which starts clean; once every static initializer ran (a gtest global
// environment's SetUp), it drops to the uid and calls the function. The function is named by a
// captureless lambda or a plain function (`+[](UidChannel&) { ... }`): its offset from an anchor
// in this binary is the same in the re-executed copy. What it needs from the test (a socket
// path, sizes) comes as `args`, strings without newlines; what it learns goes back as lines
// (Say) and its exit code. gtest assertions inside it are not reported: return a code or Say why.
//
// The child dies with the test (PR_SET_PDEATHSIG, set again after setuid, which clears it),
// inherits only the two pipes and stderr, and is killed and reaped when the AsUid goes out of
// scope. Root only (CI runs as root): TIER_SKIP_UNLESS_ROOT() skips with a message otherwise.
// The uid must reach what it talks to (a daemon's socket directory at mode 0755, its sockets
// 0666): that is the test's to arrange.
#ifndef TIER_TESTS_INTEGRATION_AS_UID_H_
#define TIER_TESTS_INTEGRATION_AS_UID_H_

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tier::testing {

// Unprivileged uids (and gids) no account on a CI machine is expected to have.
inline constexpr uid_t kTestUidA = 61001;
inline constexpr uid_t kTestUidB = 61002;

inline bool CanRunAsOtherUids() { return ::geteuid() == 0; }

#define TIER_SKIP_UNLESS_ROOT()                                                            \
  do {                                                                                     \
    if (!::tier::testing::CanRunAsOtherUids()) {                                           \
      GTEST_SKIP() << "needs root: runs clients as other uids (setuid); CI runs it as root"; \
    }                                                                                      \
  } while (0)

namespace as_uid_internal {

// Both ends of the child's pipes have these numbers in the child.
inline constexpr int kFromTestFd = 3;
inline constexpr int kToTestFd = 4;
inline constexpr char kEnv[] = "TIER_AS_UID_CHILD";

// One line from `fd` into *line (without the newline), keeping what follows in *buffered.
// False on EOF or when timeout_ms (-1: none) passes.
inline bool ReadLineFrom(int fd, std::string* buffered, std::string* line, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    if (size_t nl = buffered->find('\n'); nl != std::string::npos) {
      *line = buffered->substr(0, nl);
      buffered->erase(0, nl + 1);
      return true;
    }
    int wait_ms = -1;
    if (timeout_ms >= 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - std::chrono::steady_clock::now())
                      .count();
      if (left <= 0) return false;
      wait_ms = static_cast<int>(left);
    }
    pollfd pfd{fd, POLLIN, 0};
    int ready = ::poll(&pfd, 1, wait_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    char chunk[4096];
    ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buffered->append(chunk, static_cast<size_t>(n));
  }
}

inline bool WriteLineTo(int fd, const std::string& line) {
  std::string text = line + "\n";
  const char* data = text.data();
  size_t left = text.size();
  while (left > 0) {
    ssize_t n = ::write(fd, data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    left -= static_cast<size_t>(n);
  }
  return true;
}

// Function pointers travel as offsets from this anchor (the same in the re-executed binary).
inline void Anchor() {}

}  // namespace as_uid_internal

// The child's side: its arguments, and lines to and from the test.
class UidChannel {
 public:
  const std::vector<std::string>& args() const { return args_; }
  // A line to the test (AsUid::ReadLine). False when the test is gone.
  bool Say(const std::string& line) {
    return as_uid_internal::WriteLineTo(as_uid_internal::kToTestFd, line);
  }
  // A line from the test (AsUid::Tell); "" on EOF or when timeout_ms (-1: none) passes.
  std::string Hear(int timeout_ms) {
    std::string line;
    if (!as_uid_internal::ReadLineFrom(as_uid_internal::kFromTestFd, &buffered_, &line,
                                       timeout_ms)) {
      return "";
    }
    return line;
  }

 private:
  friend class AsUidChildHook;
  std::vector<std::string> args_;
  std::string buffered_;
};

using UidBody = int (*)(UidChannel&);

// How a child ended.
struct UidExit {
  bool exited = false;     // it returned or called exit: `code`
  int code = -1;
  int signal = 0;          // killed by this signal
  bool timed_out = false;  // Wait's time passed first (it was then killed)
  // "exited 0", "exited 3", "killed by signal 9", "timed out after 5000 ms (killed)"
  std::string Describe() const {
    if (timed_out) return "timed out after " + std::to_string(waited_ms) + " ms (killed)";
    if (exited) return "exited " + std::to_string(code);
    if (signal != 0) return "killed by signal " + std::to_string(signal);
    return "not started";
  }
  int waited_ms = 0;
};

class AsUid {
 public:
  // Starts `body` as `uid` (and gid `uid`, no supplementary groups) with `args`. A child that
  // cannot start exits 126 (see stderr).
  AsUid(uid_t uid, UidBody body, std::vector<std::string> args = {}) {
    int to_child[2];
    int from_child[2];
    if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2: " << std::strerror(errno);
      return;
    }
    // Everything the child needs is built before fork: between fork and exec it may only make
    // async-signal-safe calls (another thread of the test may hold malloc's or gRPC's locks).
    const intptr_t offset = reinterpret_cast<intptr_t>(body) -
                            reinterpret_cast<intptr_t>(&as_uid_internal::Anchor);
    std::string self = "/proc/self/exe";
    std::string env_entry = std::string(as_uid_internal::kEnv) + "=" + std::to_string(uid) + ":" +
                            std::to_string(offset) + ":" + std::to_string(args.size());
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      // (The test's gtest settings would pick which tests the child "runs": it runs none.)
      if (std::strncmp(*e, "GTEST_", 6) == 0 || std::strncmp(*e, as_uid_internal::kEnv, 17) == 0) {
        continue;
      }
      env_strings.emplace_back(*e);
    }
    env_strings.push_back(env_entry);
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string filter = "--gtest_filter=*";
    std::vector<char*> argv = {self.data(), filter.data(), nullptr};
    const int null_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);

    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      // The pipes at fixed numbers (dup2 leaves them open across exec), stdout quiet (gtest's
      // banner), stderr the test's; nothing else of the test's descriptors.
      // (Out of the way first: a pipe may already sit at 3 or 4, and dup2 onto the same number
      // would keep its close-on-exec flag.)
      const int from_test = ::fcntl(to_child[0], F_DUPFD, 16);
      const int to_test = ::fcntl(from_child[1], F_DUPFD, 16);
      if (from_test < 0 || to_test < 0 ||
          ::dup2(from_test, as_uid_internal::kFromTestFd) < 0 ||
          ::dup2(to_test, as_uid_internal::kToTestFd) < 0 ||
          (null_fd >= 0 && ::dup2(null_fd, STDOUT_FILENO) < 0)) {
        ::_exit(126);
      }
      ::syscall(SYS_close_range, as_uid_internal::kToTestFd + 1, ~0U, 0);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(126);
    }
    if (null_fd >= 0) ::close(null_fd);
    ::close(to_child[0]);
    ::close(from_child[1]);
    to_child_ = to_child[1];
    from_child_ = from_child[0];
    if (pid_ < 0) {
      ADD_FAILURE() << "fork: " << std::strerror(errno);
      return;
    }
    for (const std::string& arg : args) {
      if (arg.find('\n') != std::string::npos) ADD_FAILURE() << "an AsUid argument has a newline";
      as_uid_internal::WriteLineTo(to_child_, arg);
    }
  }

  ~AsUid() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (to_child_ >= 0) ::close(to_child_);
    if (from_child_ >= 0) ::close(from_child_);
  }
  AsUid(const AsUid&) = delete;
  AsUid& operator=(const AsUid&) = delete;

  pid_t pid() const { return pid_; }

  // A line the child said; "" on EOF (it ended) or when timeout_ms passes.
  std::string ReadLine(int timeout_ms) {
    std::string line;
    if (!NextLine(&line, timeout_ms)) return "";
    return line;
  }
  // The same, telling an empty line apart from EOF or time passing (false).
  bool NextLine(std::string* line, int timeout_ms) {
    return as_uid_internal::ReadLineFrom(from_child_, &buffered_, line, timeout_ms);
  }
  // A line for the child (UidChannel::Hear).
  void Tell(const std::string& line) { as_uid_internal::WriteLineTo(to_child_, line); }
  // Closes the child's input (its Hear sees EOF).
  void CloseInput() {
    if (to_child_ >= 0) ::close(to_child_);
    to_child_ = -1;
  }

  // Waits up to timeout_ms for the child to end (then kills it: timed_out).
  UidExit Wait(int timeout_ms) {
    UidExit result;
    if (pid_ <= 0) return result;
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + std::chrono::milliseconds(timeout_ms);
    int status = 0;
    for (;;) {
      pid_t done = ::waitpid(pid_, &status, WNOHANG);
      if (done == pid_) break;
      if (done < 0 && errno != EINTR) return result;
      if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        result.timed_out = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    pid_ = -1;
    result.waited_ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                            std::chrono::steady_clock::now() - start)
                                            .count());
    if (WIFEXITED(status)) {
      result.exited = !result.timed_out;
      result.code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
      result.signal = WTERMSIG(status);
    }
    return result;
  }

 private:
  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  std::string buffered_;
};

// Runs `body` as `uid` to its end: how it ended, and every line it said.
struct UidRun {
  UidExit exit;
  std::vector<std::string> lines;
};
inline UidRun RunAsUid(uid_t uid, UidBody body, std::vector<std::string> args = {},
                       int timeout_ms = 60000) {
  AsUid child(uid, body, std::move(args));
  UidRun run;
  child.CloseInput();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) break;
    std::string line;
    if (!child.NextLine(&line, static_cast<int>(left))) break;  // EOF: it ended
    run.lines.push_back(std::move(line));
  }
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                  deadline - std::chrono::steady_clock::now())
                  .count();
  run.exit = child.Wait(static_cast<int>(std::max<int64_t>(left, 1)));
  return run;
}

// In the re-executed child: once static initialization is over (gtest sets up global
// environments before the first test), becomes the uid and runs the body; never returns there.
class AsUidChildHook : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* spec = std::getenv(as_uid_internal::kEnv);
    if (spec == nullptr) return;  // the test itself
    unsigned long uid = 0;
    long long offset = 0;
    unsigned long nargs = 0;
    if (std::sscanf(spec, "%lu:%lld:%lu", &uid, &offset, &nargs) != 3) Die("bad " + std::string(spec));
    const pid_t parent = ::getppid();
    const gid_t gid = static_cast<gid_t>(uid);
    if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(static_cast<uid_t>(uid)) != 0) {
      Die(std::string("setuid: ") + std::strerror(errno));
    }
    if (::getuid() != uid || ::geteuid() != uid || ::getegid() != gid) Die("still privileged");
    // (A change of credentials clears the parent-death signal.)
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(126);  // the test is gone already
    UidChannel channel;
    for (unsigned long i = 0; i < nargs; ++i) {
      std::string arg;
      if (!as_uid_internal::ReadLineFrom(as_uid_internal::kFromTestFd, &channel.buffered_, &arg,
                                         30000)) {
        Die("arguments did not come");
      }
      channel.args_.push_back(std::move(arg));
    }
    auto body = reinterpret_cast<UidBody>(reinterpret_cast<intptr_t>(&as_uid_internal::Anchor) +
                                          static_cast<intptr_t>(offset));
    int code = 70;
    try {
      code = body(channel);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "as uid %lu: exception: %s\n", uid, e.what());
    } catch (...) {
      std::fprintf(stderr, "as uid %lu: unknown exception\n", uid);
    }
    std::fflush(stderr);
    // No static destructors, no gtest summary: the test's process owns those.
    ::_exit(code);
  }

 private:
  [[noreturn]] static void Die(const std::string& why) {
    std::fprintf(stderr, "as_uid child: %s\n", why.c_str());
    ::_exit(126);
  }
};

namespace as_uid_internal {
inline ::testing::Environment* const kChildHook =
    ::testing::AddGlobalTestEnvironment(new AsUidChildHook);
}  // namespace as_uid_internal

}  // namespace tier::testing

#endif  // TIER_TESTS_INTEGRATION_AS_UID_H_
