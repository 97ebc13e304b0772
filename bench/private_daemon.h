// A tierd started for one benchmark run: a private socket and state directory under /tmp, the
// binary built beside the benchmark unless named, stopped with SIGTERM (and its directory removed)
// when this object goes. Header-only: shared by the benchmark programs.
#ifndef TIER_BENCH_PRIVATE_DAEMON_H_
#define TIER_BENCH_PRIVATE_DAEMON_H_

#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tier.grpc.pb.h"

namespace tier::bench {

class PrivateDaemon {
 public:
  // <build>/daemon/tierd for a program in <build>/bench/.
  static std::string DefaultBinary() {
    return (std::filesystem::canonical("/proc/self/exe").parent_path().parent_path() / "daemon" /
            "tierd")
        .string();
  }

  // Starts `binary` (empty: DefaultBinary()) with the private paths, --log_level=warning and
  // `flags` (which win), and waits until it answers on its socket.
  static absl::StatusOr<std::unique_ptr<PrivateDaemon>> Start(std::string binary,
                                                              const std::vector<std::string>& flags) {
    if (binary.empty()) binary = DefaultBinary();
    if (::access(binary.c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat("no tierd at ", binary));
    }
    auto daemon = std::unique_ptr<PrivateDaemon>(new PrivateDaemon());
    char pattern[] = "/tmp/tier-bench-XXXXXX";
    if (::mkdtemp(pattern) == nullptr) return absl::InternalError("mkdtemp failed");
    daemon->dir_ = pattern;
    daemon->socket_ = daemon->dir_ + "/tierd.sock";
    std::vector<std::string> args = {binary, "--socket=" + daemon->socket_,
                                     "--session_socket=" + daemon->dir_ + "/s.sock",
                                     "--state_dir=" + daemon->dir_ + "/state",
                                     "--log_level=warning"};
    args.insert(args.end(), flags.begin(), flags.end());
    daemon->pid_ = ::fork();
    if (daemon->pid_ < 0) return absl::InternalError("fork failed");
    if (daemon->pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // never outlive the benchmark
      std::vector<char*> argv;
      for (std::string& arg : args) argv.push_back(arg.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    daemon->stub_ = v1::Control::NewStub(
        grpc::CreateChannel("unix:" + daemon->socket_, grpc::InsecureChannelCredentials()));
    for (int i = 0; i < 3000; ++i) {
      if (daemon->Status().ok()) return daemon;
      int wstatus = 0;
      if (::waitpid(daemon->pid_, &wstatus, WNOHANG) == daemon->pid_) {
        daemon->pid_ = -1;
        return absl::UnavailableError(absl::StrCat("tierd exited at start (", args[0], ")"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return absl::DeadlineExceededError("tierd did not answer within 30 s");
  }

  ~PrivateDaemon() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
    std::error_code ignored;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }

  absl::StatusOr<v1::GetStatusResponse> Status() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::GetStatusResponse response;
    grpc::Status status = stub_->GetStatus(&context, v1::GetStatusRequest(), &response);
    if (!status.ok()) return absl::UnavailableError(status.error_message());
    return response;
  }

  const std::string& socket() const { return socket_; }
  pid_t pid() const { return pid_; }
  v1::Control::Stub& stub() { return *stub_; }

 private:
  PrivateDaemon() = default;
  pid_t pid_ = -1;
  std::string dir_;
  std::string socket_;
  std::unique_ptr<v1::Control::Stub> stub_;
};

}  // namespace tier::bench

#endif  // TIER_BENCH_PRIVATE_DAEMON_H_
