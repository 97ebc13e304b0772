// Copies queued into the host pool (offloads), so that a reload of the same pool bytes is ordered
// after them on the GPU. A write is registered when its offload is accepted (Add), marked issued
// with the writer lane's completion word and seq once its copy is on the stream (Issued), and
// ends when that copy completed or failed (End). A reload is issued only once every overlapping
// write registered before it (Before, taken when the reload is accepted) is issued, and then
// waits on the GPU for the writer lane's completion word: a wait for a tierd copy already issued,
// the one kind of GPU wait the rule of engine/stream_engine.h allows.
//
// Every GPU's ring poller and worker registers and ends writes, several times per job; behind one
// lock, a flood of small jobs on one GPU would hold every other GPU's jobs (issue 26). So the
// writes are kept in shards by pool address: the pool is cut into 256 KiB regions, region r
// belongs to shard r % kShards, and a write is registered in the shard of every region it covers
// (all of them for a write of 32 MiB or more). A reload looks only in the shards of its own
// bytes, where every write overlapping them is; jobs on different pool bytes (different objects, so
// different GPUs' jobs unless they are the same object's) mostly take different locks. Each shard
// numbers its writes in the order registered there; a reload remembers, per shard of its bytes,
// the number of the newest write registered before it (Before).
#ifndef TIER_ENGINE_POOL_WRITES_H_
#define TIER_ENGINE_POOL_WRITES_H_

#include <array>
#include <cstdint>
#include <map>
#include <vector>

#include "common/mutex.h"

namespace tier::engine {

struct Lane;

class PoolWrites {
 public:
  struct Write {
    char* end = nullptr;
    uint64_t id = 0;     // as Add returned it: the same in every shard of the write
    uint64_t order = 0;  // registered as its shard's order-th write
    bool issued = false;
    uint64_t completed_addr = 0;              // the writer lane's completion word, on the GPU
    const uint64_t* completed_host = nullptr;  // and on the host
    uint64_t seq = 0;                         // the write is done once the word reaches it
  };
  // What a reload was accepted after: per shard of its bytes, in order from the first, the order
  // of the newest write registered there.
  struct Before {
    std::vector<uint64_t> newest;
  };

  static constexpr int kShardBits = 7;
  static constexpr int kShards = 1 << kShardBits;
  static constexpr int kRegionBits = 18;  // 256 KiB

  // Registers a write of [pool, +len); its id (never 0).
  uint64_t Add(char* pool, uint64_t len);
  // The writes registered so far that a reload of [pool, +len) is ordered after.
  Before Newest(char* pool, uint64_t len);
  void Issued(uint64_t id, char* pool, uint64_t completed_addr, const uint64_t* completed_host,
              uint64_t seq);
  // The write is over (id 0: none, nothing to do).
  void End(uint64_t id, char* pool);
  // The writes registered before `before` overlapping [pool, +len) into *out (each once); false
  // if one of them is not issued yet.
  bool Overlapping(char* pool, uint64_t len, const Before& before, std::vector<Write>* out);

 private:
  friend struct Lane;  // Lane::mu is taken before a shard's mu (its lock-order annotation names it)
  friend struct PoolWritesPeer;  // tests: hold one shard's lock

  struct alignas(64) Shard {
    Mutex mu;  // a leaf: nothing is locked or called back under it; one shard's at a time
    uint64_t next_order ABSL_GUARDED_BY(mu) = 1;
    std::multimap<char*, Write> writes ABSL_GUARDED_BY(mu);
  };
  // The shards of [pool, +len): `count` of them from `first`, wrapping (all of them for a range of
  // kShards regions or more).
  struct Span {
    int first = 0;
    int count = 1;
    int at(int i) const { return (first + i) % kShards; }
  };
  static Span SpanOf(const char* pool, uint64_t len);
  // A write's id carries its span, so that Issued and End find its shards from (id, pool).
  static uint64_t MakeId(uint64_t order, Span span) {
    return order << (2 * kShardBits) | uint64_t(span.count - 1) << kShardBits |
           uint64_t(span.first);
  }
  static Span SpanOfId(uint64_t id) {
    return Span{static_cast<int>(id & (kShards - 1)),
                static_cast<int>((id >> kShardBits) & (kShards - 1)) + 1};
  }
  // The write `id` at `pool` in `shard` (writes.end() if not there).
  static std::multimap<char*, Write>::iterator Find(Shard& shard, uint64_t id, char* pool)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);

  std::array<Shard, kShards> shards_;
};

}  // namespace tier::engine

#endif  // TIER_ENGINE_POOL_WRITES_H_
