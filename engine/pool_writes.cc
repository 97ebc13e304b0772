#include "engine/pool_writes.h"

#include <iterator>

namespace tier::engine {

uint64_t PoolWrites::Add(char* pool, uint64_t len) {
  MutexLock lock(&mu_);
  uint64_t id = next_id_++;
  writes_.emplace(pool, Write{pool + len, id, false, 0, 0});
  return id;
}

uint64_t PoolWrites::Newest() {
  MutexLock lock(&mu_);
  return next_id_ - 1;
}

void PoolWrites::Issued(uint64_t id, char* pool, uint64_t completed_addr,
                        const uint64_t* completed_host, uint64_t seq) {
  MutexLock lock(&mu_);
  for (auto it = writes_.lower_bound(pool); it != writes_.end() && it->first == pool; ++it) {
    if (it->second.id == id) {
      it->second.issued = true;
      it->second.completed_addr = completed_addr;
      it->second.completed_host = completed_host;
      it->second.seq = seq;
    }
  }
}

void PoolWrites::End(uint64_t id, char* pool) {
  if (id == 0) return;
  MutexLock lock(&mu_);
  for (auto it = writes_.lower_bound(pool); it != writes_.end() && it->first == pool; ++it) {
    if (it->second.id == id) {
      writes_.erase(it);
      return;
    }
  }
}

// Pool extents in use are disjoint, so of the writes that start before `pool` only the last can
// overlap it.
bool PoolWrites::Overlapping(char* pool, uint64_t len, uint64_t newest, std::vector<Write>* out) {
  MutexLock lock(&mu_);
  out->clear();
  auto take = [&](const Write& w) {
    if (w.id > newest) return true;  // registered after the reload: not its business
    if (!w.issued) return false;
    out->push_back(w);
    return true;
  };
  auto it = writes_.lower_bound(pool);
  if (it != writes_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.end > pool && !take(prev->second)) return false;
  }
  for (; it != writes_.end() && it->first < pool + len; ++it) {
    if (!take(it->second)) return false;
  }
  return true;
}

}  // namespace tier::engine
