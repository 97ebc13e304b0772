#include "tierctl/object_delete.h"

#include "absl/status/status.h"
#include "client/client_session.h"
#include "tier/session_wire.h"
#include "tierctl/commands.h"

namespace tier::ctl {

int DeleteObject(const std::string& socket_path, const std::string& name,
                 std::optional<uint32_t> uid, std::ostream& out, std::ostream& err) {
  client::SessionOptions options;
  options.socket_path = socket_path;
  options.name = "tierctl";
  absl::StatusOr<std::unique_ptr<client::ClientSession>> session =
      client::ClientSession::Open(options);
  absl::Status status = session.status();
  if (status.ok()) {
    status = (*session)->DeletePersistent(name, uid.value_or(wire::kCallerUid));
  }
  if (!status.ok()) {
    err << "tierctl: objects delete " << name << ": " << absl::StatusCodeToString(status.code())
        << ": " << status.message() << "\n";
    return kExitFailure;
  }
  out << "Deleted " << name << ".\n";
  return kExitOk;
}

}  // namespace tier::ctl
