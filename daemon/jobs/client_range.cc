#include "daemon/jobs/client_range.h"

#include "absl/strings/str_cat.h"
#include "daemon/jobs/entry_validator.h"

namespace tier::daemon {

absl::StatusOr<ClientRange> ClientRange::Of(Session& session, const ring::SubmissionEntry& e) {
  std::shared_ptr<engine::ImportedBuffer> buffer = session.FindBuffer(e.buffer_id);
  if (buffer == nullptr) {
    return absl::NotFoundError(absl::StrCat("no buffer ", e.buffer_id, " in this session"));
  }
  if (absl::Status in_range = CheckBufferRange(e.offset, e.len, buffer->bytes(), e.buffer_id);
      !in_range.ok()) {
    return in_range;
  }
  char* data = buffer->base() + e.offset;
  return ClientRange{std::move(buffer), data};
}

engine::CopyJob MakeCopyJob(engine::Direction direction, Session& session,
                            const ring::SubmissionEntry& e, char* pool, const ClientRange& range) {
  engine::CopyJob job;
  job.direction = direction;
  job.client = range.data;
  job.pool = pool;
  job.len = e.len;
  job.session = session.engine_session();
  job.sync = e.sync;
  job.batch_size = ring::BatchSizeOf(e.flags);
  return job;
}

}  // namespace tier::daemon
