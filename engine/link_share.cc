#include "engine/link_share.h"

#include <algorithm>

namespace tier::engine {

void LinkShare::Saw(const void* lane, uint32_t uid, int direction, uint64_t now) {
  for (Seen& s : recent_[direction]) {
    if (s.lane == lane) {
      s.at = now;
      s.uid = uid;
      return;
    }
  }
  recent_[direction].push_back(Seen{lane, uid, now});
}

uint64_t LinkShare::Window(const void* lane, uint32_t uid, int direction, uint64_t now,
                           uint64_t window_bytes) {
  std::vector<Seen>& recent = recent_[direction];
  std::erase_if(recent, [&](const Seen& s) { return now - s.at > kMemoryNs; });
  bool others = false;       // another lane shares the direction
  bool other_uids = false;   // a lane of another uid does
  uint64_t mine = 1;         // lanes of this uid on the link, this one counted
  for (const Seen& s : recent) {
    if (s.lane == lane) continue;
    others = true;
    if (s.uid == uid) {
      ++mine;
    } else {
      other_uids = true;
    }
  }
  if (!others || window_bytes == 0) return 0;
  if (!other_uids) return window_bytes;
  return std::max<uint64_t>(window_bytes / mine, 1);
}

}  // namespace tier::engine
