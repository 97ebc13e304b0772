// Runs a real tierd for a test: its own directory for sockets and state, a small pool, started
// from the binary built alongside the tests, stopped with SIGTERM (and its exit status checked).
#ifndef TIER_TESTS_INTEGRATION_TIERD_PROCESS_H_
#define TIER_TESTS_INTEGRATION_TIERD_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tier.grpc.pb.h"
#include "tier/client.hpp"

namespace tier::testing {

struct TierdOptions {
  // RLIMIT_NOFILE (soft and hard) of the daemon; 0: the test's own.
  int max_open_files = 0;
  // Its stderr goes to <dir>/tierd.log (see Log()) instead of the test's.
  bool capture_log = false;
};

class TierdProcess {
 public:
  // Extra --key=value flags are appended after the test defaults (so they win).
  explicit TierdProcess(std::vector<std::string> flags = {}, TierdOptions options = {});
  ~TierdProcess();

  const std::string& dir() const { return dir_; }
  const std::string& socket() const { return socket_; }
  pid_t pid() const { return pid_; }
  // Options for a tier::Session on this tierd, named `name` (its sessions list shows the name).
  tier::Session::Options SessionOptions(std::string name = "test", uint64_t quota_bytes = 0) const {
    tier::Session::Options options;
    options.socket_path = socket_;
    options.name = std::move(name);
    options.quota_bytes = quota_bytes;
    return options;
  }

  // SIGTERM, then the exit status (as from waitpid's WEXITSTATUS, or 128+signal).
  int Stop();
  // Stop(), but -1 (and SIGKILL) when it has not exited within timeout_ms.
  int StopWithin(int timeout_ms);
  // What it wrote to stderr so far (capture_log only).
  std::string Log() const;
  // CPU time (user + system) it has used so far, in milliseconds.
  uint64_t CpuMs() const;
  void Kill();

  v1::GetStatusResponse Status();
  v1::ListSessionsResponse Sessions();
  v1::Control::Stub& stub() { return *stub_; }
  // Re-reads the status until `done` holds or timeout_ms passes. Returns whether it held.
  bool WaitForStatus(const std::function<bool(const v1::GetStatusResponse&)>& done,
                     int timeout_ms = 20000);
  // The host tier of a status.
  static const v1::TierStatus& HostTier(const v1::GetStatusResponse& status);

 private:
  std::string dir_;
  std::string socket_;
  std::string log_;
  pid_t pid_ = -1;
  std::unique_ptr<v1::Control::Stub> stub_;
};

// Another program run beside the test (posix_spawn: safe after gRPC started threads), its stdout
// read through a pipe. Killed with SIGKILL and reaped when it goes out of scope.
// After a tierd was SIGKILLed: waits (at most 30 s) until the spill file it held in `spill_dir`
// is free again. The kernel drops a killed process's io_uring, and the file references it holds,
// a moment after the process is reaped; a tierd started before that finds the file locked.
void AwaitSpillFileFree(const std::string& spill_dir);

class ChildProcess {
 public:
  explicit ChildProcess(std::vector<std::string> argv);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // One line of its stdout without the newline; "" on EOF or when timeout_ms passes.
  std::string ReadLine(int timeout_ms);
  // SIGKILL and wait for it.
  void Kill();
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string buffered_;
};

// Runs a command line, returns {exit status, stdout}.
std::pair<int, std::string> RunCommand(const std::string& command);

}  // namespace tier::testing

#endif  // TIER_TESTS_INTEGRATION_TIERD_PROCESS_H_
