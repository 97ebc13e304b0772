// Copies queued into the host pool (offloads), so that a reload of the same pool bytes is ordered
// after them on the GPU. A write is registered when its offload is accepted (Add), marked issued
// with the writer lane's completion word and seq once its copy is on the stream (Issued), and
// ends when that copy completed or failed (End). A reload is issued only once every overlapping
// write registered before it is issued, and then waits on the GPU for the writer lane's
// completion word: a wait for a tierd copy already issued, the one kind of GPU wait the rule of
// engine/stream_engine.h allows.
#ifndef TIER_ENGINE_POOL_WRITES_H_
#define TIER_ENGINE_POOL_WRITES_H_

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
    uint64_t id = 0;
    bool issued = false;
    uint64_t completed_addr = 0;              // the writer lane's completion word, on the GPU
    const uint64_t* completed_host = nullptr;  // and on the host
    uint64_t seq = 0;                         // the write is done once the word reaches it
  };

  // Registers a write of [pool, +len); its id (never 0).
  uint64_t Add(char* pool, uint64_t len);
  // The id of the newest write registered so far: a reload is ordered after the writes up to it.
  uint64_t Newest();
  void Issued(uint64_t id, char* pool, uint64_t completed_addr, const uint64_t* completed_host,
              uint64_t seq);
  // The write is over (id 0: none, nothing to do).
  void End(uint64_t id, char* pool);
  // The writes up to id `newest` overlapping [pool, +len) into *out; false if one of them is not
  // issued yet.
  bool Overlapping(char* pool, uint64_t len, uint64_t newest, std::vector<Write>* out);

 private:
  friend struct Lane;  // Lane::mu is taken before mu_ (its lock-order annotation names mu_)

  Mutex mu_;  // a leaf: nothing is locked or called back under it
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::multimap<char*, Write> writes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tier::engine

#endif  // TIER_ENGINE_POOL_WRITES_H_
