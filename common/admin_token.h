// The admin token: proof that a control call comes from root or from tierd's own user.
//
// gRPC over a Unix socket does not tell the server who is calling (no SO_PEERCRED), yet some
// calls must not be open to every user who may reach the socket: Drain stops admission for good.
// So tierd writes a random token at start to a file that only its own user can read (mode 0600;
// root reads it anyway): beside its control socket, or at admin_token_file when the sockets'
// directory is shared with clients (a hostPath mounted into training pods). Such calls carry
// it; tierctl reads it (--admin-token, $TIER_ADMIN_TOKEN, else beside the socket).
#ifndef TIER_COMMON_ADMIN_TOKEN_H_
#define TIER_COMMON_ADMIN_TOKEN_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tier {

// <socket_path>.admin-token
std::string AdminTokenPath(const std::string& socket_path);
// A fresh random token (hex), written to `path` with mode 0600 (replacing an older file).
absl::StatusOr<std::string> WriteAdminToken(const std::string& path);
absl::StatusOr<std::string> ReadAdminToken(const std::string& path);
// Compares in constant time (for equal lengths), so the token cannot be guessed byte by byte.
bool AdminTokenMatches(std::string_view expected, std::string_view given);

}  // namespace tier

#endif  // TIER_COMMON_ADMIN_TOKEN_H_
