// The thread rule of engine/stream_engine.h ("which thread makes which runtime call",
// common/thread_role.h), checked where the engine makes a setup call. A violation is a bug in
// tierd: it is logged once per thread role and call class (the tests' fake runtime fails on it).
#ifndef TIER_ENGINE_RUNTIME_CALL_RULE_H_
#define TIER_ENGINE_RUNTIME_CALL_RULE_H_

#include "common/thread_role.h"

namespace tier::engine {

void CheckCall(GpuCallClass call);

}  // namespace tier::engine

#endif  // TIER_ENGINE_RUNTIME_CALL_RULE_H_
