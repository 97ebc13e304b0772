// Who shares one GPU's link, for the lane window (engine/stream_engine.h, "Sharing a GPU's
// link"): a pure policy object fed by the GPU's worker with the lanes it sees copying, and asked
// per lane and pass what window that lane gets. Unit-tested without a device.
//
// Rules:
//  - A lane counts as on the link while it has copies issued and not complete, and for
//    kMemoryNs after; a lane that only waits for a client's ticket does not count (it used to,
//    so a lane whose client never raised its ticket forced the window on every other session
//    for ever: issue 30, finding 17).
//  - A lane alone on its direction has no window (0: no limit), nor does one that shares it
//    only with lanes of its own uid beyond the plain window each.
//  - While lanes of another uid share the direction, the window is divided among the lanes of
//    the lane's uid on the link: a uid's sessions together get one share, not one each (a user
//    opening eight sessions took eight shares of the link from a user with one).
#ifndef TIER_ENGINE_LINK_SHARE_H_
#define TIER_ENGINE_LINK_SHARE_H_

#include <cstdint>
#include <vector>

namespace tier::engine {

class LinkShare {
 public:
  static constexpr uint64_t kMemoryNs = 2'000'000;

  // `lane` (any stable identity) of `uid` has copies on the link in `direction` (0 or 1) now.
  void Saw(const void* lane, uint32_t uid, int direction, uint64_t now);
  // The window `lane` gets this pass: 0 (no limit) or at most `window_bytes`; at least 1.
  uint64_t Window(const void* lane, uint32_t uid, int direction, uint64_t now,
                  uint64_t window_bytes);

 private:
  struct Seen {
    const void* lane;
    uint32_t uid;
    uint64_t at;
  };
  std::vector<Seen> recent_[2];
};

}  // namespace tier::engine

#endif  // TIER_ENGINE_LINK_SHARE_H_
