// Where tierctl finds the daemon's control socket. Kept apart from the gRPC code so that the
// order of precedence can be tested on its own.
#ifndef TIER_TIERCTL_SOCKET_PATH_H_
#define TIER_TIERCTL_SOCKET_PATH_H_

#include <string>

namespace tier::ctl {

inline constexpr char kSystemSocketPath[] = "/run/tierd/tierd.sock";

struct SocketPathSources {
  std::string flag;             // --socket; empty when not given
  std::string tier_socket_env;  // $TIER_SOCKET; empty when unset
  std::string runtime_dir_env;  // $XDG_RUNTIME_DIR; empty when unset
};

// The sources as this process sees them: `flag` plus the two environment variables.
SocketPathSources SocketPathSourcesFromEnvironment(std::string flag);

// --socket, else $TIER_SOCKET, else $XDG_RUNTIME_DIR/tierd/tierd.sock if that file exists,
// else /run/tierd/tierd.sock.
std::string ResolveSocketPath(const SocketPathSources& sources);

// Whether something (a socket, normally) may exist at `path`: false only when `path` or one of
// its parent folders is missing.
bool PathExists(const std::string& path);

}  // namespace tier::ctl

#endif  // TIER_TIERCTL_SOCKET_PATH_H_
