// A client buffer as the engine's import would give it, held in process memory: the daemon-side
// unit tests (job executor, ring pollers) hand it to a session instead of importing GPU or shared
// memory.
#ifndef TIER_TESTS_UNIT_FAKE_BUFFER_H_
#define TIER_TESTS_UNIT_FAKE_BUFFER_H_

#include <cstdint>
#include <vector>

#include "engine/copy_engine.h"

namespace tier::daemon {

class FakeBuffer : public engine::ImportedBuffer {
 public:
  // `bytes` of `fill`, on GPU `device` (-1: host memory).
  explicit FakeBuffer(uint64_t bytes, int device = -1, char fill = 0)
      : bytes_(bytes, fill), device_(device) {}
  char* base() const override { return bytes_.data(); }
  uint64_t bytes() const override { return bytes_.size(); }
  int device() const override { return device_; }

 private:
  mutable std::vector<char> bytes_;
  const int device_;
};

}  // namespace tier::daemon

#endif  // TIER_TESTS_UNIT_FAKE_BUFFER_H_
