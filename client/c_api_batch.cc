// The C ABI's batches (tier.h): tier_offload_batch and tier_reload_batch over registered
// buffers, and tier_offload_ranges / tier_reload_ranges over raw pointers (registration and the
// batch in one call). Each batch is pushed whole or not at all.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "client/c_api_internal.h"
#include "client/client_session.h"
#include "tier/ring.h"
#include "tier/tier.h"

namespace {

using tier::client::c_api::Fail;
using tier::client::c_api::Guard;
using tier::client::c_api::ProducersOf;

// The jobs of a batch as requests, checked: the array (stride jobs[0].struct_size), the count,
// and that every buffer lies on one GPU (*device), or all in host memory (*device = -1).
tier_status BatchRequests(tier_session* session, tier_batch_job* jobs, size_t count,
                          tier::ring::Opcode opcode,
                          std::vector<tier::client::JobRequest>* requests, int* device) {
  if (session == nullptr || (jobs == nullptr && count > 0)) {
    return Fail(TIER_INVALID_ARGUMENT, "NULL argument");
  }
  if (count > TIER_MAX_BATCH_JOBS) {
    return Fail(TIER_INVALID_ARGUMENT, absl::StrCat("a batch of ", count, " jobs; at most ",
                                                    TIER_MAX_BATCH_JOBS));
  }
  *device = -1;
  if (count == 0) return TIER_OK;
  const uint32_t stride = jobs[0].struct_size;
  if (stride < sizeof(tier_batch_job)) {
    return Fail(TIER_INVALID_ARGUMENT, "tier_batch_job.struct_size too small");
  }
  requests->resize(count);
  for (size_t i = 0; i < count; ++i) {
    const auto& job = *reinterpret_cast<const tier_batch_job*>(
        reinterpret_cast<const char*>(jobs) + i * stride);
    if (job.struct_size != stride) {
      return Fail(TIER_INVALID_ARGUMENT,
                  absl::StrCat("tier_batch_job ", i, " has struct_size ", job.struct_size,
                               "; job 0 has ", stride));
    }
    int on = session->impl->devices().DeviceOf(job.buffer);
    if (i == 0) {
      *device = on;
    } else if (on != *device) {
      return Fail(TIER_INVALID_ARGUMENT,
                  absl::StrCat("a batch mixes buffers of ",
                               *device < 0 ? std::string("host memory")
                                           : absl::StrCat("GPU ", *device),
                               " and ", on < 0 ? std::string("host memory")
                                               : absl::StrCat("GPU ", on),
                               " (job ", i, "); submit one batch per GPU"));
    }
    tier::client::JobRequest& r = (*requests)[i];
    r.opcode = static_cast<uint32_t>(opcode);
    r.buffer_id = job.buffer;
    r.offset = job.offset;
    r.len = job.len;
    r.device = on;
    if (opcode == tier::ring::Opcode::kOffload) {
      r.hint = job.next_use_hint;
    } else {
      r.object_id = job.object;
      if (job.flags & TIER_RELOAD_FREE_AFTER) r.flags |= tier::ring::kFlagFreeAfterReload;
    }
  }
  return TIER_OK;
}

// The batch's GPU jobs are on the ring (or failed to go): each pays the use its registration
// owes (DeviceRegistry::Owe).
void PayBatch(tier_session* session, const std::vector<tier::client::JobRequest>& requests,
              const absl::StatusOr<std::vector<uint64_t>>& submitted) {
  const uint64_t last = submitted.ok() && !submitted->empty() ? submitted->back()
                                                              : session->impl->LastJobPushed();
  for (const auto& r : requests) session->impl->devices().Paid(r.buffer_id, last);
}

// Writes the submitted ids back into the caller's array.
void StoreBatchIds(tier_batch_job* jobs, const std::vector<tier::client::JobRequest>& requests,
                   const std::vector<uint64_t>& ids) {
  const uint32_t stride = jobs[0].struct_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto& job = *reinterpret_cast<tier_batch_job*>(reinterpret_cast<char*>(jobs) + i * stride);
    job.object = requests[i].object_id;
    job.job = ids[i];
  }
}

// A batch call's first checks: its options' size, then every job (BatchRequests).
template <typename Options>
tier_status StartBatch(tier_session* session, tier_batch_job* jobs, size_t count,
                       const Options* options, tier::ring::Opcode opcode,
                       std::vector<tier::client::JobRequest>* requests, int* device) {
  if (options != nullptr && options->struct_size < sizeof(Options)) {
    return Fail(TIER_INVALID_ARGUMENT,
                opcode == tier::ring::Opcode::kOffload
                    ? "tier_offload_options.struct_size too small"
                    : "tier_reload_options.struct_size too small");
  }
  return BatchRequests(session, jobs, count, opcode, requests, device);
}


// Pushes offload requests (fresh object ids set) as one batch: on a GPU with one ticket after the
// options' producer streams, each registration's use paid; in host memory with none.
absl::StatusOr<std::vector<uint64_t>> SubmitOffloads(
    tier_session* session, std::vector<tier::client::JobRequest>& requests, int device,
    absl::Span<void* const> producers) {
  if (device < 0) {
    return session->impl->SubmitBatch(absl::MakeSpan(requests),
                                      []() -> absl::StatusOr<uint64_t> { return 0; });
  }
  tier::client::gpu::DeviceSync* sync = session->impl->devices().Sync(device);
  absl::StatusOr<std::vector<uint64_t>> submitted = session->impl->SubmitBatch(
      absl::MakeSpan(requests), [&] { return sync->TicketOffload(producers); });
  PayBatch(session, requests, submitted);
  return submitted;
}

// ranges[i] of an array whose stride is ranges[0].struct_size (tier_offload_range,
// tier_reload_range).
template <typename Range>
Range& RangeAt(Range* ranges, uint32_t stride, size_t i) {
  return *reinterpret_cast<Range*>(reinterpret_cast<char*>(ranges) + i * stride);
}

// A range call's first checks: the session, the array, the count (at most a batch), the options'
// and every element's struct_size. *stride: the array's.
template <typename Range, typename Options>
tier_status CheckRanges(tier_session* session, Range* ranges, size_t count, const Options* options,
                        uint32_t* stride) {
  if (session == nullptr || (ranges == nullptr && count > 0)) {
    return Fail(TIER_INVALID_ARGUMENT, "NULL argument");
  }
  if (options != nullptr && options->struct_size < sizeof(Options)) {
    return Fail(TIER_INVALID_ARGUMENT, "the options' struct_size is too small");
  }
  const size_t limit = std::min<size_t>(TIER_MAX_BATCH_JOBS, session->impl->ring_entries());
  if (count > limit) {
    return Fail(TIER_INVALID_ARGUMENT,
                absl::StrCat(count, " ranges in one call; at most ", limit,
                             " (TIER_MAX_BATCH_JOBS and the session's ring entries)"));
  }
  if (count == 0) return TIER_OK;
  *stride = ranges[0].struct_size;
  if (*stride < sizeof(Range)) {
    return Fail(TIER_INVALID_ARGUMENT, "a range's struct_size is too small");
  }
  for (size_t i = 1; i < count; ++i) {
    if (RangeAt(ranges, *stride, i).struct_size != *stride) {
      return Fail(TIER_INVALID_ARGUMENT,
                  absl::StrCat("range ", i, " has struct_size ",
                               RangeAt(ranges, *stride, i).struct_size, "; range 0 has ",
                               *stride));
    }
  }
  return TIER_OK;
}

// Range i's buffer and offset: in a host buffer of the session, else registered GPU memory
// (tier_buffer_register_device_range's rules). TIER_OK or why not (the last error says it).
tier_status LocateRange(tier_session* session, const void* ptr, uint64_t len, size_t i,
                        tier::client::JobRequest* request) {
  if (ptr == nullptr || len == 0) {
    return Fail(TIER_INVALID_ARGUMENT,
                absl::StrCat("range ", i, ": ", ptr == nullptr ? "NULL ptr" : "len 0"));
  }
  absl::StatusOr<tier::client::ClientSession::HostRange> host =
      session->impl->FindHostRange(ptr, len);
  if (host.ok()) {
    request->buffer_id = host->buffer_id;
    request->offset = host->offset;
    request->device = -1;
    return TIER_OK;
  }
  if (!absl::IsNotFound(host.status())) return Fail(host.status());
  tier_status s = tier_buffer_register_device_range(session, ptr, len, &request->buffer_id,
                                                    &request->offset);
  if (s != TIER_OK) return s;
  request->device = session->impl->devices().DeviceOf(request->buffer_id);
  return TIER_OK;
}

// Every located request lies on one GPU, or all in host memory: TIER_OK, or why not.
tier_status OneDevice(const std::vector<tier::client::JobRequest>& requests) {
  const int device = requests[0].device;
  for (const auto& r : requests) {
    if (r.device == device) continue;
    auto where = [](int d) {
      return d < 0 ? std::string("host memory") : absl::StrCat("GPU ", d);
    };
    return Fail(TIER_INVALID_ARGUMENT,
                absl::StrCat("the ranges lie in ", where(device), " and ", where(r.device),
                             "; one GPU's ranges per call"));
  }
  return TIER_OK;
}

// Pushes reload requests as one batch: on a GPU with one ticket after the consumer's work so far,
// and (unless TIER_RELOAD_DEFER_WAIT) the consumer made to wait for the batch's completion value;
// in host memory with none. `store` gets the job ids once pushed (before the consumer's wait).
tier_status SubmitReloads(tier_session* session, std::vector<tier::client::JobRequest>& requests,
                          int device, const tier_reload_options* options,
                          absl::FunctionRef<void(const std::vector<uint64_t>&)> store) {
  if (options != nullptr && (options->flags & TIER_RELOAD_FREE_AFTER)) {
    for (auto& r : requests) r.flags |= tier::ring::kFlagFreeAfterReload;
  }
  if (device < 0) {
    absl::StatusOr<std::vector<uint64_t>> submitted = session->impl->SubmitBatch(
        absl::MakeSpan(requests), []() -> absl::StatusOr<uint64_t> { return 0; });
    if (!submitted.ok()) return Fail(submitted.status());
    store(*submitted);
    return TIER_OK;
  }
  // As tier_reload: the copies wait for the consumer's work so far, and the consumer waits for
  // the batch's one completion value.
  void* consumer = options != nullptr ? options->consumer_stream : nullptr;
  tier::client::gpu::DeviceSync* sync = session->impl->devices().Sync(device);
  absl::StatusOr<std::vector<uint64_t>> submitted = session->impl->SubmitBatch(
      absl::MakeSpan(requests), [&] { return sync->TicketReload(consumer); });
  PayBatch(session, requests, submitted);
  if (!submitted.ok()) return Fail(submitted.status());
  store(*submitted);
  if (options != nullptr && (options->flags & TIER_RELOAD_DEFER_WAIT)) return TIER_OK;
  if (absl::Status waited = sync->WaitReloadDone(consumer, requests[0].sync); !waited.ok()) {
    return Fail(waited);
  }
  return TIER_OK;
}

}  // namespace

extern "C" {

tier_status tier_offload_batch(tier_session* session, tier_batch_job* jobs, size_t count,
                               const tier_offload_options* options) {
  return Guard([&] {
    std::vector<tier::client::JobRequest> requests;
    int device = -1;
    if (tier_status s = StartBatch(session, jobs, count, options, tier::ring::Opcode::kOffload,
                                   &requests, &device);
        s != TIER_OK || count == 0) {
      return s;
    }
    absl::Span<void* const> producers;
    if (tier_status s = ProducersOf(options, &producers); s != TIER_OK) return s;
    for (auto& r : requests) r.object_id = session->impl->NewObjectId();
    absl::StatusOr<std::vector<uint64_t>> submitted =
        SubmitOffloads(session, requests, device, producers);
    if (!submitted.ok()) return Fail(submitted.status());
    StoreBatchIds(jobs, requests, *submitted);
    return TIER_OK;
  });
}

tier_status tier_reload_batch(tier_session* session, tier_batch_job* jobs, size_t count,
                              const tier_reload_options* options) {
  return Guard([&] {
    std::vector<tier::client::JobRequest> requests;
    int device = -1;
    if (tier_status s = StartBatch(session, jobs, count, options, tier::ring::Opcode::kReload,
                                   &requests, &device);
        s != TIER_OK || count == 0) {
      return s;
    }
    return SubmitReloads(session, requests, device, options,
                         [&](const std::vector<uint64_t>& ids) {
                           StoreBatchIds(jobs, requests, ids);
                         });
  });
}

tier_status tier_offload_ranges(tier_session* session, tier_offload_range* ranges, size_t count,
                                const tier_offload_options* options) {
  return Guard([&] {
    uint32_t stride = 0;
    if (tier_status s = CheckRanges(session, ranges, count, options, &stride);
        s != TIER_OK || count == 0) {
      return s;
    }
    absl::Span<void* const> producers;
    if (tier_status s = ProducersOf(options, &producers); s != TIER_OK) return s;
    std::vector<tier::client::JobRequest> requests;
    std::vector<size_t> located;  // the range of each request
    requests.reserve(count);
    located.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      tier_offload_range& range = RangeAt(ranges, stride, i);
      range.object = 0;
      range.job = 0;
      tier::client::JobRequest request;
      range.status = LocateRange(session, range.ptr, range.len, i, &request);
      if (range.status != TIER_OK) continue;  // left out; the others still go
      request.opcode = static_cast<uint32_t>(tier::ring::Opcode::kOffload);
      request.len = range.len;
      request.hint = range.next_use_hint;
      requests.push_back(request);
      located.push_back(i);
    }
    if (requests.empty()) return TIER_OK;
    auto fail_all = [&](tier_status code) {
      for (size_t i : located) RangeAt(ranges, stride, i).status = code;
      return code;
    };
    if (tier_status s = OneDevice(requests); s != TIER_OK) return fail_all(s);
    for (auto& r : requests) r.object_id = session->impl->NewObjectId();
    absl::StatusOr<std::vector<uint64_t>> submitted =
        SubmitOffloads(session, requests, requests[0].device, producers);
    if (!submitted.ok()) return fail_all(Fail(submitted.status()));
    for (size_t k = 0; k < requests.size(); ++k) {
      tier_offload_range& range = RangeAt(ranges, stride, located[k]);
      range.object = requests[k].object_id;
      range.job = (*submitted)[k];
    }
    return TIER_OK;
  });
}

tier_status tier_reload_ranges(tier_session* session, tier_reload_range* ranges, size_t count,
                               const tier_reload_options* options) {
  return Guard([&] {
    uint32_t stride = 0;
    if (tier_status s = CheckRanges(session, ranges, count, options, &stride);
        s != TIER_OK || count == 0) {
      return s;
    }
    std::vector<tier::client::JobRequest> requests(count);
    tier_status failed = TIER_OK;
    std::string why;  // the first failure's message (LocateRange's; a later one overwrites it)
    for (size_t i = 0; i < count; ++i) {
      tier_reload_range& range = RangeAt(ranges, stride, i);
      range.job = 0;
      tier::client::JobRequest& request = requests[i];
      range.status = LocateRange(session, range.ptr, range.len, i, &request);
      if (range.status != TIER_OK && failed == TIER_OK) {
        failed = static_cast<tier_status>(range.status);
        why = absl::StrCat("range ", i, ": ", tier::client::c_api::LastError());
      }
      request.opcode = static_cast<uint32_t>(tier::ring::Opcode::kReload);
      request.object_id = range.object;
      request.len = range.len;
      if (range.flags & TIER_RELOAD_FREE_AFTER) request.flags |= tier::ring::kFlagFreeAfterReload;
    }
    auto fail_all = [&](tier_status code) {
      for (size_t i = 0; i < count; ++i) {
        tier_reload_range& range = RangeAt(ranges, stride, i);
        if (range.status == TIER_OK) range.status = code;
      }
      return code;
    };
    if (failed != TIER_OK) {
      // A reload must land: a destination that cannot be named holds the whole call back, so
      // the caller never has half a batch in flight. The others say TIER_ABORTED.
      fail_all(TIER_ABORTED);
      return Fail(failed, std::move(why));
    }
    if (tier_status s = OneDevice(requests); s != TIER_OK) return fail_all(s);
    tier_status s = SubmitReloads(session, requests, requests[0].device, options,
                                  [&](const std::vector<uint64_t>& ids) {
                                    for (size_t i = 0; i < count; ++i) {
                                      RangeAt(ranges, stride, i).job = ids[i];
                                    }
                                  });
    // Pushed and then the consumer's wait failed: the jobs are in flight (their ids are set).
    bool pushed = RangeAt(ranges, stride, 0).job != 0;
    return pushed || s == TIER_OK ? s : fail_all(s);
  });
}

}  // extern "C"
