// What the C ABI's translation units share (client/c_api*.cc): the object behind tier_session*,
// and how a status crosses the boundary (a tier_status plus the calling thread's message). Not
// installed; nothing here is part of the ABI.
#ifndef TIER_CLIENT_C_API_INTERNAL_H_
#define TIER_CLIENT_C_API_INTERNAL_H_

#include <exception>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "client/client_session.h"
#include "tier/tier.h"

struct tier_session {
  std::unique_ptr<tier::client::ClientSession> impl;
};

namespace tier::client::c_api {

// The calling thread's last error message (tier_last_error).
std::string& LastError();

inline tier_status Fail(const absl::Status& status) {
  LastError() = std::string(status.message());
  return static_cast<tier_status>(status.code());
}

inline tier_status Fail(tier_status code, std::string message) {
  LastError() = std::move(message);
  return code;
}

inline tier_status Report(const absl::Status& status) {
  if (status.ok()) return TIER_OK;
  return Fail(status);
}

// Wraps a body so that no exception (bad_alloc, ...) crosses the C boundary.
template <typename Body>
tier_status Guard(Body body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return Fail(TIER_INTERNAL, e.what());
  } catch (...) {
    return Fail(TIER_INTERNAL, "unknown C++ exception in libtierclient");
  }
}

// The producer streams an offload's options name (none: the current stream), checked.
inline tier_status ProducersOf(const tier_offload_options* options,
                               absl::Span<void* const>* producers) {
  if (options == nullptr || options->num_producer_streams == 0) return TIER_OK;
  if (options->producer_streams == nullptr) {
    return Fail(TIER_INVALID_ARGUMENT, "num_producer_streams > 0 but producer_streams is NULL");
  }
  *producers = absl::MakeConstSpan(options->producer_streams, options->num_producer_streams);
  return TIER_OK;
}

}  // namespace tier::client::c_api

#endif  // TIER_CLIENT_C_API_INTERNAL_H_
