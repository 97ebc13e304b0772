#include "daemon/object_memory.h"

namespace tier::daemon {

Released UnpinObjectLocked(Session& session, Object& object, storage::HostPool& pool,
                           storage::SpillStore* store) {
  if (--object.pins > 0 || !object.dropped) return Released::kNothing;
  Released released = Released::kNothing;
  if (object.where == Object::Where::kNvme) {
    if (store != nullptr) (void)store->Free(object.spill);
    object.spill = {};
    released = Released::kNvme;
  } else if (object.extent.bytes != 0) {
    pool.Free(object.extent);
    object.extent = {};
    released = Released::kHost;
  }
  session.used_bytes() -= object.charged;
  object.charged = 0;
  return released;
}

}  // namespace tier::daemon
