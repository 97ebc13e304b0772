// The source of a copy that is still arriving: a reload of an object being read back from NVMe
// into its pool extent. The producer (the NVMe read) says how many leading bytes are in place and
// verified; the engine copies each chunk onward as soon as it is, so the NVMe -> pool and
// pool -> destination legs overlap instead of running one after the other.
//
// Producer: Advance(bytes) with whole chunks (or len) as they are in place; at most one End()
// call ends the feed: End(OK) after every byte is in place, End(error) when the rest will not
// come. Before End(error) the producer zeroes the pool bytes past ready(), so an engine that must
// copy them anyway (a GPU stream cannot skip a queued copy) hands the destination zeros, never
// unverified data; the job then fails with that error.
//
// Consumer (one per feed, the engine): Subscribe(fn) once; fn runs at once with the current state
// and again after every change, on the producer's thread, in order, under the feed's lock: it must
// be short and must not call back into the feed. Unsubscribe() before the consumer's state goes.
#ifndef TIER_ENGINE_SOURCE_FEED_H_
#define TIER_ENGINE_SOURCE_FEED_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "common/mutex.h"

namespace tier::engine {

class SourceFeed {
 public:
  // (ready bytes, ended, the end's status: OK until an error end)
  using Progress = std::function<void(uint64_t ready, bool ended, const absl::Status& status)>;

  SourceFeed(uint64_t len, uint64_t chunk_bytes);
  SourceFeed(const SourceFeed&) = delete;
  SourceFeed& operator=(const SourceFeed&) = delete;

  uint64_t len() const { return len_; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  uint64_t chunks() const { return (len_ + chunk_bytes_ - 1) / chunk_bytes_; }
  // Chunks of `bytes` ready bytes that are wholly in place.
  uint64_t ChunksIn(uint64_t bytes) const {
    return bytes >= len_ ? chunks() : bytes / chunk_bytes_;
  }

  void Advance(uint64_t bytes);
  void End(absl::Status status);
  void Subscribe(Progress progress);
  // After this returns the consumer's function never runs again (and may be destroyed).
  void Unsubscribe();

  uint64_t ready() const;
  absl::Status status() const;

 private:
  friend struct Lane;  // a GPU lane's lock is taken before mu_ (its lock order names mu_)

  const uint64_t len_;
  const uint64_t chunk_bytes_;
  // Held while the consumer's function runs.
  mutable Mutex mu_;
  uint64_t ready_ ABSL_GUARDED_BY(mu_) = 0;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  Progress progress_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tier::engine

#endif  // TIER_ENGINE_SOURCE_FEED_H_
