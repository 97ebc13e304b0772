// tierctl: shows and steers the node's tierd over its control socket.
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tierctl/commands.h"
#include "tierctl/object_delete.h"
#include "tierctl/socket_path.h"

namespace tier::ctl {
namespace {

constexpr char kUsage[] = R"(usage: tierctl [--socket PATH] [--timeout-ms N] [--json] COMMAND

Shows and steers the tierd daemon on this node.

commands:
  status    version, state, uptime, tiers, sessions, jobs, traffic
  clients   one row per session (alias: sessions)
  pools     the memory tiers, and the host pool's parts per NUMA node: which GPUs use
            each, local and remote allocations
  spill     the NVMe tier, one row per spill directory: I/O mode, use, traffic, errors
  health    serving, draining or not_serving (jobs stopped moving; exit 1 unless serving)
  version   tierctl's and tierd's versions
  top       live view, refreshed every second: per tier and per session bandwidth in
            each direction and jobs/s, per job kind rate and latency percentiles
            (p50/p90/p99 over the interval), what sessions wait for; Ctrl-C ends it
  drain     stop admitting sessions and jobs, then wait for in-flight jobs (root or
            tierd's user only: it reads the token beside the socket)
            (exit 1 when jobs are still in flight at the timeout)
  objects   persistent (named) objects of every user: name, owner uid, size, tier, age
            (root or tierd's user only, like drain)
  objects delete NAME [--uid U]
            delete a persistent object: your own, or user U's if you are root
  help      this text

options:
  --socket PATH    control socket; default $TIER_SOCKET, else
                   $XDG_RUNTIME_DIR/tierd/tierd.sock if it exists, else /run/tierd/tierd.sock
  --timeout-ms N   deadline of each call (default 5000); for drain, how long tierd waits
                   for in-flight jobs (default: as long as they take)
  --json           print one JSON object instead of tables (top: with --once)
  --once           top: print one frame (two samples an interval apart) and exit
  --interval-ms N  top: refresh interval (default 1000)
  --uid U          objects delete: the owner's uid (default: yours)
  --admin-token PATH  drain, objects: tierd's admin token file; default $TIER_ADMIN_TOKEN,
                   else <socket>.admin-token (tierd's admin_token_file)

exit status: 0 ok, 1 error, 2 usage, 3 tierd not running
)";

struct Args {
  std::string command;
  std::string socket;
  std::optional<uint32_t> timeout_ms;
  bool json = false;
  bool once = false;
  uint32_t interval_ms = 1000;
  std::vector<std::string> operands;  // after the command (objects delete NAME)
  std::optional<uint32_t> uid;
  std::string admin_token;
};

// A positive number of milliseconds, or nothing.
std::optional<uint32_t> ParseMs(std::optional<std::string_view> text) {
  uint32_t ms = 0;
  if (!text) return std::nullopt;
  const char* end = text->data() + text->size();
  if (std::from_chars(text->data(), end, ms).ptr != end || ms == 0) return std::nullopt;
  return ms;
}

// Options may come before or after the command. Returns an error message, or nothing.
std::optional<std::string> ParseArgs(int argc, char** argv, Args& args) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::optional<std::string_view> value;
    if (arg.starts_with("--") && arg.find('=') != std::string_view::npos) {
      value = arg.substr(arg.find('=') + 1);
      arg = arg.substr(0, arg.find('='));
    }
    auto take_value = [&]() -> std::optional<std::string_view> {
      if (value) return value;
      if (i + 1 < argc) return std::string_view(argv[++i]);
      return std::nullopt;
    };
    if (arg == "--json" && !value) {
      args.json = true;
    } else if (arg == "-h" || arg == "--help") {
      args.command = "help";
    } else if (arg == "--socket") {
      auto path = take_value();
      if (!path || path->empty()) return "--socket needs a path";
      args.socket = *path;
    } else if (arg == "--admin-token") {
      auto path = take_value();
      if (!path || path->empty()) return "--admin-token needs a path";
      args.admin_token = *path;
    } else if (arg == "--once" && !value) {
      args.once = true;
    } else if (arg == "--timeout-ms") {
      std::optional<uint32_t> ms = ParseMs(take_value());
      if (!ms) return "--timeout-ms needs a positive number of milliseconds";
      args.timeout_ms = *ms;
    } else if (arg == "--interval-ms") {
      std::optional<uint32_t> ms = ParseMs(take_value());
      if (!ms) return "--interval-ms needs a positive number of milliseconds";
      args.interval_ms = *ms;
    } else if (arg == "--uid") {
      auto text = take_value();
      uint32_t uid = 0;
      const char* end = text ? text->data() + text->size() : nullptr;
      if (!text || text->empty() || std::from_chars(text->data(), end, uid).ptr != end) {
        return "--uid needs a numeric uid";
      }
      args.uid = uid;
    } else if (arg.starts_with("-")) {
      return "unknown option " + std::string(arg);
    } else if (args.command.empty()) {
      args.command = arg;
    } else if (args.command == "objects") {
      args.operands.emplace_back(arg);
    } else if (args.command != "help") {
      return "unexpected argument " + std::string(arg);
    }
  }
  if (args.command == "objects" && !args.operands.empty() &&
      (args.operands[0] != "delete" || args.operands.size() != 2)) {
    return "objects takes no argument, or: delete NAME";
  }
  if (args.uid && (args.command != "objects" || args.operands.empty())) {
    return "--uid goes with objects delete";
  }
  if (args.command.empty()) return "no command given";
  if (args.command != "help" && !IsCommand(args.command)) {
    return "unknown command " + args.command;
  }
  if (args.command == "top" && args.json && !args.once) return "top --json needs --once";
  return std::nullopt;
}

int Main(int argc, char** argv) {
  Args args;
  if (auto error = ParseArgs(argc, argv, args)) {
    std::cerr << "tierctl: " << *error << "\n\n" << kUsage;
    return kExitUsage;
  }
  if (args.command == "help") {
    std::cout << kUsage;
    return kExitOk;
  }
  const std::string socket_path =
      ResolveSocketPath(SocketPathSourcesFromEnvironment(args.socket));
  // A missing socket says plainly that the daemon is not running; gRPC's own message would not.
  if (!PathExists(socket_path)) {
    return ReportNotRunning("no socket at " + socket_path, std::cerr);
  }

  if (args.command == "objects" && !args.operands.empty()) {
    return DeleteObject(socket_path, args.operands[1], args.uid, std::cout, std::cerr);
  }
  auto stub = ConnectControl(socket_path);
  CommandContext ctx;
  ctx.stub = stub.get();
  ctx.socket_path = socket_path;
  ctx.admin_token_path = args.admin_token;
  if (ctx.admin_token_path.empty()) {
    if (const char* env = std::getenv("TIER_ADMIN_TOKEN"); env != nullptr) {
      ctx.admin_token_path = env;
    }
  }
  ctx.json = args.json;
  if (args.command == "drain") {
    ctx.drain_timeout_ms = args.timeout_ms.value_or(0);
  } else if (args.timeout_ms) {
    ctx.call_timeout = std::chrono::milliseconds(*args.timeout_ms);
  }
  ctx.once = args.once;
  ctx.interval = std::chrono::milliseconds(args.interval_ms);
  ctx.terminal = ::isatty(STDOUT_FILENO) == 1;
  ctx.out = &std::cout;
  ctx.err = &std::cerr;
  return RunCommand(args.command, ctx);
}

}  // namespace
}  // namespace tier::ctl

int main(int argc, char** argv) { return tier::ctl::Main(argc, argv); }
