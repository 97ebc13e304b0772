#include "daemon/metrics/submit_times.h"

namespace tier::daemon {

// Zeroed (value-initialized atomics): an empty slot matches no job.
SubmitTimes::SubmitTimes() : slots_(std::make_unique<std::atomic<uint64_t>[]>(kSlots)) {}

}  // namespace tier::daemon
