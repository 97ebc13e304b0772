// The client memory a job names: the buffer range of a ring entry, checked against the session's
// registered buffers, and the copy job between it and a pool extent.
#ifndef TIER_DAEMON_JOBS_CLIENT_RANGE_H_
#define TIER_DAEMON_JOBS_CLIENT_RANGE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "daemon/sessions/session.h"
#include "engine/copy_engine.h"
#include "tier/ring.h"

namespace tier::daemon {

// The checked view of a buffer range named by an entry. Held until the copy ended, so that an
// unregister cannot unmap the buffer mid-copy.
struct ClientRange {
  std::shared_ptr<engine::ImportedBuffer> buffer;
  char* data = nullptr;

  // NOT_FOUND (no such buffer in the session), OUT_OF_RANGE (the entry's offset and length).
  static absl::StatusOr<ClientRange> Of(Session& session, const ring::SubmissionEntry& e);
  int device() const { return buffer->device(); }
};

// The copy of entry `e` between `range` and `pool` (the pool extent's bytes), on the session's
// engine session and the entry's ticket.
engine::CopyJob MakeCopyJob(engine::Direction direction, Session& session,
                            const ring::SubmissionEntry& e, char* pool, const ClientRange& range);

}  // namespace tier::daemon

#endif  // TIER_DAEMON_JOBS_CLIENT_RANGE_H_
