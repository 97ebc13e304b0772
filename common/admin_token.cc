#include "common/admin_token.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace tier {
namespace {

constexpr size_t kTokenBytes = 32;

}  // namespace

std::string AdminTokenPath(const std::string& socket_path) {
  return socket_path + ".admin-token";
}

absl::StatusOr<std::string> WriteAdminToken(const std::string& path) {
  unsigned char random[kTokenBytes];
  if (::getrandom(random, sizeof(random), 0) != static_cast<ssize_t>(sizeof(random))) {
    return ErrnoStatus("getrandom for the admin token");
  }
  std::string token;
  for (unsigned char byte : random) {
    char hex[3];
    std::snprintf(hex, sizeof(hex), "%02x", byte);
    token += hex;
  }
  // A new file (O_EXCL, never through a link) with mode 0600 from its creation, then renamed over
  // the old one: the token is never readable by anyone else, not even for a moment.
  std::string temp = path + ".new";
  ::unlink(temp.c_str());
  UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return ErrnoStatus(absl::StrCat("cannot create ", temp));
  if (::fchmod(fd.get(), 0600) != 0 ||
      ::write(fd.get(), token.data(), token.size()) != static_cast<ssize_t>(token.size())) {
    int error = errno;
    ::unlink(temp.c_str());
    return ErrnoStatus(absl::StrCat("cannot write ", temp), error);
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    int error = errno;
    ::unlink(temp.c_str());
    return ErrnoStatus(absl::StrCat("cannot rename ", temp, " to ", path), error);
  }
  return token;
}

absl::StatusOr<std::string> ReadAdminToken(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(absl::StrCat("cannot read the admin token ", path));
  char buffer[2 * kTokenBytes + 1];
  ssize_t n = ::read(fd.get(), buffer, sizeof(buffer));
  if (n < 0) return ErrnoStatus(absl::StrCat("cannot read the admin token ", path));
  return std::string(buffer, static_cast<size_t>(n));
}

bool AdminTokenMatches(std::string_view expected, std::string_view given) {
  if (expected.empty() || expected.size() != given.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff |= static_cast<unsigned char>(expected[i] ^ given[i]);
  }
  return diff == 0;
}

}  // namespace tier
