// tierd: the Tierd node daemon. Runs on embedded defaults with no arguments; see --help.
#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/log.h"
#include "daemon/config/config.h"
#include "daemon/daemon.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& arg : args) {
    if (arg == "--help" || arg == "-h") {
      std::printf("usage: tierd [--config=FILE] [--KEY=VALUE ...]\n\nSettings (file key = flag):\n%s",
                  tier::daemon::ConfigUsage().c_str());
      return 0;
    }
    if (arg == "--version") {
      std::printf("tierd %s\n", tier::daemon::kVersion);
      return 0;
    }
  }
  bool print_config = false;
  std::erase_if(args, [&](const std::string& a) { return a == "--print-config" && (print_config = true); });

  absl::StatusOr<tier::daemon::Config> config = tier::daemon::LoadConfig(args);
  if (!config.ok()) {
    std::fprintf(stderr, "tierd: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  if (print_config) {
    std::printf("%s", tier::daemon::DescribeConfig(*config).c_str());
    return 0;
  }
  tier::SetMinLogSeverity(config->log_level);

  // Block the stop signals in every thread (threads inherit this mask); Run() waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  absl::StatusOr<std::unique_ptr<tier::daemon::Daemon>> daemon =
      tier::daemon::Daemon::Create(*config);
  if (!daemon.ok()) {
    tier::LogError("tierd cannot start: ", daemon.status().ToString());
    return 1;
  }
  return (*daemon)->Run();
}
