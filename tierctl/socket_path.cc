#include "tierctl/socket_path.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <utility>

namespace tier::ctl {
namespace {

std::string EnvOrEmpty(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

}  // namespace

SocketPathSources SocketPathSourcesFromEnvironment(std::string flag) {
  return {std::move(flag), EnvOrEmpty("TIER_SOCKET"), EnvOrEmpty("XDG_RUNTIME_DIR")};
}

std::string ResolveSocketPath(const SocketPathSources& sources) {
  if (!sources.flag.empty()) return sources.flag;
  if (!sources.tier_socket_env.empty()) return sources.tier_socket_env;
  if (!sources.runtime_dir_env.empty()) {
    std::string user_socket = sources.runtime_dir_env + "/tierd/tierd.sock";
    if (PathExists(user_socket)) return user_socket;
  }
  return kSystemSocketPath;
}

bool PathExists(const std::string& path) {
  struct stat st;
  // EACCES on a parent folder proves nothing is missing; connecting will say what is wrong.
  return ::stat(path.c_str(), &st) == 0 || (errno != ENOENT && errno != ENOTDIR);
}

}  // namespace tier::ctl
