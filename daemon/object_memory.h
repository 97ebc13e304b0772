// The end of an object's memory: its last unpin after the client freed it.
#ifndef TIER_DAEMON_OBJECT_MEMORY_H_
#define TIER_DAEMON_OBJECT_MEMORY_H_

#include "daemon/session.h"
#include "storage/host_pool.h"
#include "storage/spill_store.h"

namespace tier::daemon {

enum class Released {
  kNothing,  // still pinned, or not freed
  kHost,     // its host extent went back to the pool
  kNvme,     // its spill record went back to the store
};

// Drops one pin. When the object has been freed and nothing pins it any more, returns its memory
// (host extent to `pool`, or spill record to `store`) and its charge to the session's quota, and
// says which. `store` may be null when there is no NVMe tier. Caller holds session.mu().
Released UnpinObjectLocked(Session& session, Object& object, storage::HostPool& pool,
                           storage::SpillStore* store);

}  // namespace tier::daemon

#endif  // TIER_DAEMON_OBJECT_MEMORY_H_
