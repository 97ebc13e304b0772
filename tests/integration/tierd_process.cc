#include "tierd_process.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <grpcpp/grpcpp.h>

namespace tier::testing {
namespace {

template <typename Response, typename Call>
bool CallOnce(Call call, Response* response) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return call(&context, response).ok();
}

}  // namespace

TierdProcess::TierdProcess(std::vector<std::string> flags, TierdOptions options) {
  char pattern[] = "/tmp/tierd-test-XXXXXX";
  if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = pattern;
  socket_ = dir_ + "/tierd.sock";
  // $TIERD_BIN overrides the binary built beside the tests (a bundle copied to another machine).
  const char* bin = std::getenv("TIERD_BIN");
  std::vector<std::string> args = {bin != nullptr && *bin != '\0' ? bin : TIERD_BIN,
                                   "--socket=" + socket_,
                                   "--session_socket=" + dir_ + "/tierd.session.sock",
                                   "--state_dir=" + dir_ + "/state",
                                   "--pool_bytes=64M",
                                   "--pool_lock=off",
                                   "--log_level=warning"};
  args.insert(args.end(), flags.begin(), flags.end());
  if (options.capture_log) log_ = dir_ + "/tierd.log";
  pid_ = ::fork();
  if (pid_ == 0) {
    // A test that crashes must not leave its daemon behind (it would hold CTest's output pipe
    // open until the timeout).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (options.max_open_files > 0) {
      rlimit limit{static_cast<rlim_t>(options.max_open_files),
                   static_cast<rlim_t>(options.max_open_files)};
      if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) ::_exit(126);
    }
    if (!log_.empty()) {
      int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0 || ::dup2(fd, STDERR_FILENO) < 0) ::_exit(126);
    }
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    std::perror("execv tierd");
    ::_exit(127);
  }
  stub_ = v1::Control::NewStub(
      grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials()));
  // Ready when the control API answers (sanitizer builds start slowly: allow a while).
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    int status;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      // What it said (capture_log), so that the failure names the cause.
      throw std::runtime_error("tierd exited during start-up" +
                               (log_.empty() ? std::string() : ": " + Log()));
    }
    v1::GetVersionResponse version;
    if (::access(socket_.c_str(), F_OK) == 0 &&
        CallOnce([&](grpc::ClientContext* c, v1::GetVersionResponse* r) {
          return stub_->GetVersion(c, v1::GetVersionRequest(), r);
        }, &version)) {
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  throw std::runtime_error("tierd did not become ready");
}

TierdProcess::~TierdProcess() {
  if (pid_ > 0) Stop();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

int TierdProcess::Stop() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

int TierdProcess::StopWithin(int timeout_ms) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  int status = 0;
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      Kill();
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  pid_ = -1;
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

std::string TierdProcess::Log() const {
  std::ifstream in(log_);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

uint64_t TierdProcess::CpuMs() const {
  // /proc/PID/stat: fields 14 and 15 (utime, stime) in clock ticks, after the ')' of the name.
  std::ifstream in("/proc/" + std::to_string(pid_) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::string field;
  uint64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return (utime + stime) * 1000 / static_cast<uint64_t>(::sysconf(_SC_CLK_TCK));
}

void TierdProcess::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

v1::GetStatusResponse TierdProcess::Status() {
  v1::GetStatusResponse response;
  if (!CallOnce([&](grpc::ClientContext* c, v1::GetStatusResponse* r) {
        return stub_->GetStatus(c, v1::GetStatusRequest(), r);
      }, &response)) {
    throw std::runtime_error("GetStatus failed");
  }
  return response;
}

v1::ListSessionsResponse TierdProcess::Sessions() {
  v1::ListSessionsResponse response;
  if (!CallOnce([&](grpc::ClientContext* c, v1::ListSessionsResponse* r) {
        return stub_->ListSessions(c, v1::ListSessionsRequest(), r);
      }, &response)) {
    throw std::runtime_error("ListSessions failed");
  }
  return response;
}

bool TierdProcess::WaitForStatus(const std::function<bool(const v1::GetStatusResponse&)>& done,
                                 int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    if (done(Status())) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

const v1::TierStatus& TierdProcess::HostTier(const v1::GetStatusResponse& status) {
  for (const v1::TierStatus& tier : status.tiers()) {
    if (tier.name() == "host") return tier;
  }
  throw std::runtime_error("status has no host tier");
}

ChildProcess::ChildProcess(std::vector<std::string> args) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  int error = ::posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  stdout_fd_ = pipe_fds[0];
  if (error != 0) {
    pid_ = -1;
    ::close(stdout_fd_);
    throw std::runtime_error("posix_spawn " + args[0] + " failed");
  }
}

ChildProcess::~ChildProcess() {
  Kill();
  if (stdout_fd_ >= 0) ::close(stdout_fd_);
}

std::string ChildProcess::ReadLine(int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    size_t newline = buffered_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffered_.substr(0, newline);
      buffered_.erase(0, newline + 1);
      return line;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return "";
    pollfd pfd{stdout_fd_, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[256];
    ssize_t n = ::read(stdout_fd_, buf, sizeof(buf));
    if (n <= 0) return "";
    buffered_.append(buf, static_cast<size_t>(n));
  }
}

void AwaitSpillFileFree(const std::string& spill_dir) {
  const std::string path = spill_dir + "/tierd.spill";
  for (int i = 0; i < 3000; ++i) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    ::close(fd);
    if (free) return;
    ::usleep(10000);
  }
}

void ChildProcess::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

std::pair<int, std::string> RunCommand(const std::string& command) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, ""};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace tier::testing
