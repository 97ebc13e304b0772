// Validates ring entries and runs them: offload (client buffer -> new object), reload (object ->
// client buffer), free. Every entry ends in exactly one completion on the session's ring, with a
// canonical status code; a bad entry fails alone and touches nothing else.
//
// Each job reads top-down through three layers, and only calls down:
//   the session's ObjectTable  - the object's state: create, pin, fill ended, free (and quota);
//   the TierManager            - where its bytes live: room in the host pool for a new object,
//                                an object brought back from NVMe for a reload;
//   the CopyEngine             - the copy itself, completed by callback.
//
// Ordering between jobs on the same object: a reload of an object whose offload is still copying
// starts from the fill's end on the host engine, and is submitted at once on GPU engines, which
// order it after the fill on the GPU (CopyEngine::orders_pool_reads); either way its completion
// reports the fill's failure. An object's memory returns to its tier only once it has been freed
// and no accepted job still uses it (the table's pins).
#ifndef TIER_DAEMON_JOBS_JOB_EXECUTOR_H_
#define TIER_DAEMON_JOBS_JOB_EXECUTOR_H_

#include <atomic>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/jobs/offload_order.h"
#include "daemon/metrics/metrics.h"
#include "daemon/persistent/persistent_store.h"
#include "daemon/sessions/session.h"
#include "daemon/tiers/object_table.h"
#include "daemon/tiers/tier_manager.h"
#include "engine/copy_engine.h"
#include "tier/ring.h"

namespace tier::daemon {

class JobExecutor {
 public:
  // `persistent`: the named objects that outlive sessions (null: none, as in unit tests).
  JobExecutor(TierManager& tiers, engine::CopyEngine& engine, DaemonMetrics& metrics,
              PersistentStore* persistent = nullptr)
      : tiers_(tiers), engine_(engine), metrics_(metrics), persistent_(persistent) {}

  // Starts one entry taken from the session's submission queue. Never waits for a copy.
  void Start(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& entry);
  // Completes an entry with `status` without running it (daemon draining).
  void Reject(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& entry,
              absl::Status status);
  // After the session is idle and closing: returns all its objects' memory to the tiers.
  void ReleaseAll(Session& session);

 private:
  // The checked view of a buffer range named by an entry. Held by the copy's callback, so that
  // an unregister cannot unmap the buffer mid-copy.
  struct Range {
    std::shared_ptr<engine::ImportedBuffer> buffer;
    char* data = nullptr;
  };
  absl::StatusOr<Range> CheckRange(Session& session, const ring::SubmissionEntry& entry);

  // Each returns an error only when the job did not start (the caller fails it); a job that
  // started completes from a callback.
  absl::Status Offload(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& e);
  absl::Status Reload(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& e);
  absl::Status Free(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& e);

  // Offload, once the object has its host extent.
  // (`table` is where the object lives: the session's, or a persistent object's uid table.)
  void CopyIn(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& e,
              const std::shared_ptr<ObjectTable>& table, const std::shared_ptr<Object>& object,
              Range range);
  // The fill ended before any copy (no host room): the table's transition, then the reloads that
  // waited for it. (A fill whose copy ran ends through TierManager::FillEnded.)
  void EndFill(ObjectTable& table, Object& object, const absl::Status& status);

  // Reload, once the fill it must follow (if any) is known to have succeeded.
  void FetchThenCopyOut(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& e,
                        const std::shared_ptr<ObjectTable>& table,
                        const ObjectTable::Pinned& pinned, Range range);
  // Reload, once the bytes are readable in host memory (or a feed fills them from NVMe).
  void CopyOut(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& e,
               const std::shared_ptr<ObjectTable>& table, const std::shared_ptr<Object>& object,
               Range range, Readable from);
  // The reload's copy ended; its result stands once the fill it may have run beside succeeded.
  void FinishReload(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& e,
                    const std::shared_ptr<ObjectTable>& table,
                    const std::shared_ptr<Object>& object, absl::Status copy);
  // A reload that pinned `object` ends before its copy was submitted: unpins, and fails it (its
  // ticket to the GPU of `range`, the buffer it was accepted for).
  void AbandonReload(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& e,
                     const Range& range, ObjectTable& table, Object& object,
                     absl::Status status);

  engine::CopyJob MakeCopyJob(engine::Direction direction, Session& session,
                           const ring::SubmissionEntry& e, storage::Extent extent,
                           const Range& range);
  // Completes a job that will not run with `status`; a ticketed one first passes its ticket to the
  // engine as a ticket-only job, so the client's streams waiting on it are released: on the GPU
  // of the buffer the entry names (Fail), or on `device` (FailOnDevice: a job that holds its
  // checked buffer, which the client may have unregistered since).
  void Fail(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& entry,
            absl::Status status);
  void FailOnDevice(const std::shared_ptr<Session>& session, const ring::SubmissionEntry& entry,
                    absl::Status status, int device);
  void Complete(Session& session, const ring::SubmissionEntry& entry, const absl::Status& status);
  // The daemon-wide counts of a job of session `session_id` accepted (Complete undoes them).
  void CountStart(uint64_t session_id, const ring::SubmissionEntry& entry);

  TierManager& tiers_;
  engine::CopyEngine& engine_;
  DaemonMetrics& metrics_;
  PersistentStore* const persistent_;
  OffloadOrder offload_order_;  // each object's seq
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_JOBS_JOB_EXECUTOR_H_
