// `tierctl objects delete NAME [--uid U]`: deletes a persistent object. Not a control-API call:
// gRPC over a Unix socket does not say who calls, so tierctl opens a session like any client and
// asks on the session socket, where tierd takes the caller's uid from SO_PEERCRED. The owner may
// delete its objects, root anyone's; other uids get NOT_FOUND, as for names that do not exist.
#ifndef TIER_TIERCTL_OBJECT_DELETE_H_
#define TIER_TIERCTL_OBJECT_DELETE_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

namespace tier::ctl {

// Returns tierctl's exit status (0, or 1 with one line on `err`). `uid`: the owner's namespace
// (none: the caller's own).
int DeleteObject(const std::string& socket_path, const std::string& name,
                 std::optional<uint32_t> uid, std::ostream& out, std::ostream& err);

}  // namespace tier::ctl

#endif  // TIER_TIERCTL_OBJECT_DELETE_H_
