// A private tierd for a GPU benchmark that talks to it only through libtierclient: started with
// fork/exec (no gRPC in the benchmark, so it may fork workers afterwards), a socket and state
// directory under /tmp, stopped with SIGTERM and the directory removed when this object goes.
// (bench/private_daemon.h is the same for benchmarks that also use tierd's gRPC API.)
#ifndef TIER_BENCH_TIERD_PROCESS_H_
#define TIER_BENCH_TIERD_PROCESS_H_

#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "tier/tier.h"

namespace tier::bench {

class TierdProcess {
 public:
  // `binary` empty: <build>/daemon/tierd for a program in <build>/bench/. `flags` follow the
  // private paths and --log_level=warning (later flags win). Does not wait for it to serve: a
  // client's session open retries until the pool is pinned.
  TierdProcess(std::string binary, const std::vector<std::string>& flags) {
    if (binary.empty()) {
      binary = (std::filesystem::canonical("/proc/self/exe").parent_path().parent_path() /
                "daemon" / "tierd")
                   .string();
    }
    char pattern[] = "/tmp/tier-gpu-bench-XXXXXX";
    if (::mkdtemp(pattern) == nullptr) {
      std::perror("mkdtemp");
      std::exit(1);
    }
    dir_ = pattern;
    socket_ = dir_ + "/tierd.sock";
    std::vector<std::string> args = {binary, "--socket=" + socket_,
                                     "--session_socket=" + dir_ + "/session.sock",
                                     "--state_dir=" + dir_ + "/state", "--log_level=warning"};
    args.insert(args.end(), flags.begin(), flags.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // never outlive the benchmark
      std::vector<char*> argv;
      for (std::string& arg : args) argv.push_back(arg.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      std::perror("exec tierd");
      ::_exit(127);
    }
  }
  ~TierdProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  TierdProcess(const TierdProcess&) = delete;
  TierdProcess& operator=(const TierdProcess&) = delete;

  const std::string& socket() const { return socket_; }

 private:
  pid_t pid_ = -1;
  std::string dir_;
  std::string socket_;
};

// Opens a session named `name` on `socket`, retrying for up to a minute while tierd starts (it
// answers once its pool is pinned). The last status.
inline tier_status OpenSessionWhenReady(const std::string& socket, const char* name,
                                        tier_session** session) {
  tier_session_options options;
  tier_session_options_init(&options);
  options.socket_path = socket.c_str();
  options.name = name;
  options.connect_timeout_ms = 60000;
  tier_status opened = TIER_UNAVAILABLE;
  for (int tries = 0; tries < 600 && opened != TIER_OK; ++tries) {
    opened = tier_session_open(&options, session);
    if (opened != TIER_OK) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return opened;
}

}  // namespace tier::bench

#endif  // TIER_BENCH_TIERD_PROCESS_H_
