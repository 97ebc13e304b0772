#include "engine/pool_writes.h"

#include <algorithm>
#include <iterator>

namespace tier::engine {

PoolWrites::Span PoolWrites::SpanOf(const char* pool, uint64_t len) {
  const uint64_t start = reinterpret_cast<uintptr_t>(pool);
  const uint64_t first = start >> kRegionBits;
  const uint64_t last = (start + std::max<uint64_t>(len, 1) - 1) >> kRegionBits;
  return Span{static_cast<int>(first % kShards),
              static_cast<int>(std::min<uint64_t>(last - first + 1, kShards))};
}

std::multimap<char*, PoolWrites::Write>::iterator PoolWrites::Find(Shard& shard, uint64_t id,
                                                                   char* pool) {
  for (auto it = shard.writes.lower_bound(pool); it != shard.writes.end() && it->first == pool;
       ++it) {
    if (it->second.id == id) return it;
  }
  return shard.writes.end();
}

uint64_t PoolWrites::Add(char* pool, uint64_t len) {
  const Span span = SpanOf(pool, len);
  uint64_t id = 0;
  for (int i = 0; i < span.count; ++i) {
    Shard& shard = shards_[span.at(i)];
    MutexLock lock(&shard.mu);
    const uint64_t order = shard.next_order++;
    if (i == 0) id = MakeId(order, span);  // unique: its first shard's number, and the span
    shard.writes.emplace(pool, Write{pool + len, id, order, false, 0, nullptr, 0});
  }
  return id;
}

PoolWrites::Before PoolWrites::Newest(char* pool, uint64_t len) {
  Before before;
  if (len == 0) return before;  // no copy: never ordered
  const Span span = SpanOf(pool, len);
  before.newest.reserve(span.count);
  for (int i = 0; i < span.count; ++i) {
    Shard& shard = shards_[span.at(i)];
    MutexLock lock(&shard.mu);
    before.newest.push_back(shard.next_order - 1);
  }
  return before;
}

void PoolWrites::Issued(uint64_t id, char* pool, uint64_t completed_addr,
                        const uint64_t* completed_host, uint64_t seq) {
  const Span span = SpanOfId(id);
  for (int i = 0; i < span.count; ++i) {
    Shard& shard = shards_[span.at(i)];
    MutexLock lock(&shard.mu);
    auto it = Find(shard, id, pool);
    if (it == shard.writes.end()) continue;
    it->second.issued = true;
    it->second.completed_addr = completed_addr;
    it->second.completed_host = completed_host;
    it->second.seq = seq;
  }
}

void PoolWrites::End(uint64_t id, char* pool) {
  if (id == 0) return;
  const Span span = SpanOfId(id);
  for (int i = 0; i < span.count; ++i) {
    Shard& shard = shards_[span.at(i)];
    MutexLock lock(&shard.mu);
    auto it = Find(shard, id, pool);
    if (it != shard.writes.end()) shard.writes.erase(it);
  }
}

// Pool extents in use are disjoint, so of the writes of a shard that start before `pool` only the
// last can overlap it. A write in several shards of the reload's span is taken once.
bool PoolWrites::Overlapping(char* pool, uint64_t len, const Before& before,
                             std::vector<Write>* out) {
  out->clear();
  const Span span = SpanOf(pool, len);
  for (int i = 0; i < span.count; ++i) {
    // (A reload accepted without a snapshot of this shard is ordered after all of its writes.)
    const uint64_t newest = static_cast<size_t>(i) < before.newest.size() ? before.newest[i]
                                                                          : ~uint64_t{0};
    Shard& shard = shards_[span.at(i)];
    MutexLock lock(&shard.mu);
    auto take = [&](const Write& w) {
      if (w.order > newest) return true;  // registered after the reload: not its business
      if (!w.issued) return false;
      const bool seen = std::any_of(out->begin(), out->end(),
                                    [&](const Write& o) { return o.id == w.id; });
      if (!seen) out->push_back(w);
      return true;
    };
    auto it = shard.writes.lower_bound(pool);
    if (it != shard.writes.begin()) {
      auto prev = std::prev(it);
      if (prev->second.end > pool && !take(prev->second)) return false;
    }
    for (; it != shard.writes.end() && it->first < pool + len; ++it) {
      if (!take(it->second)) return false;
    }
  }
  return true;
}

}  // namespace tier::engine
