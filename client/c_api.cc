// The C ABI (tier.h) over ClientSession: sessions, buffers, lone jobs, waits. Batches are in
// c_api_batch.cc. Nothing C++ crosses it: statuses become tier_status plus a thread-local
// message, exceptions never escape.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "client/c_api_internal.h"
#include "client/client_session.h"
#include "common/status.h"
#include "common/version.h"
#include "tier/ring.h"
#include "tier/tier.h"

namespace tier::client::c_api {

std::string& LastError() {
  thread_local std::string last_error;
  return last_error;
}

}  // namespace tier::client::c_api

using tier::client::c_api::Fail;
using tier::client::c_api::Guard;
using tier::client::c_api::ProducersOf;
using tier::client::c_api::Report;

extern "C" {

const char* tier_status_name(tier_status status) { return tier::StatusCodeName(status); }
const char* tier_last_error(void) { return tier::client::c_api::LastError().c_str(); }
const char* tier_version(void) { return tier::kTierVersion; }

void tier_session_options_init(tier_session_options* options) {
  std::memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
}

void tier_offload_options_init(tier_offload_options* options) {
  std::memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
}

void tier_reload_options_init(tier_reload_options* options) {
  std::memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(*options);
}

tier_status tier_session_open(const tier_session_options* options, tier_session** out) {
  return Guard([&] {
    if (out == nullptr) return Fail(TIER_INVALID_ARGUMENT, "out is NULL");
    *out = nullptr;
    tier::client::SessionOptions opts;
    if (options != nullptr) {
      static_assert(offsetof(tier_session_options, daemon_wait_ms) ==
                    TIER_SESSION_OPTIONS_V1_SIZE);
      if (options->struct_size < TIER_SESSION_OPTIONS_V1_SIZE) {
        return Fail(TIER_INVALID_ARGUMENT, "tier_session_options.struct_size too small");
      }
      if (options->socket_path != nullptr) opts.socket_path = options->socket_path;
      if (options->name != nullptr) opts.name = options->name;
      opts.quota_bytes = options->quota_bytes;
      opts.ring_entries = options->ring_entries;
      if (options->connect_timeout_ms > 0) opts.connect_timeout_ms = options->connect_timeout_ms;
      if (options->struct_size >= sizeof(tier_session_options) && options->daemon_wait_ms != 0) {
        opts.daemon_wait_ms = std::max(options->daemon_wait_ms, 0);
      }
    }
    if (opts.name.empty()) opts.name = program_invocation_short_name;
    absl::StatusOr<std::unique_ptr<tier::client::ClientSession>> session =
        tier::client::ClientSession::Open(opts);
    if (!session.ok()) return Fail(session.status());
    *out = new tier_session{*std::move(session)};
    return TIER_OK;
  });
}

void tier_session_close(tier_session* session) {
  try {
    delete session;
  } catch (...) {
  }
}

uint32_t tier_session_flags(tier_session* session) {
  if (session == nullptr) return 0;
  return (session->impl->daemon_gone() ? TIER_SESSION_DAEMON_GONE : 0u) |
         (session->impl->daemon_draining() ? TIER_SESSION_DAEMON_DRAINING : 0u);
}

tier_status tier_session_get_info(tier_session* session, tier_session_info* info) {
  if (session == nullptr || info == nullptr) return Fail(TIER_INVALID_ARGUMENT, "NULL argument");
  static_assert(offsetof(tier_session_info, device_registrations) == TIER_SESSION_INFO_V1_SIZE);
  if (info->struct_size < TIER_SESSION_INFO_V1_SIZE) {
    return Fail(TIER_INVALID_ARGUMENT, "tier_session_info.struct_size too small");
  }
  info->session_id = session->impl->id();
  info->quota_bytes = session->impl->quota_bytes();
  info->ring_entries = session->impl->ring_entries();
  info->jobs_in_flight = session->impl->in_flight();
  info->flags = tier_session_flags(session);
  std::memset(info->engine, 0, sizeof(info->engine));
  std::strncpy(info->engine, session->impl->engine().c_str(), sizeof(info->engine) - 1);
  if (info->struct_size >= sizeof(tier_session_info)) {
    tier::client::DeviceRegistry::Counters counters = session->impl->devices().counters();
    info->device_registrations = counters.registrations;
    info->device_extensions = counters.extensions;
    info->device_exports = counters.exports;
  }
  return TIER_OK;
}

tier_status tier_link_rate(tier_session* session, int device, double* d2h_bytes_per_s,
                           double* h2d_bytes_per_s) {
  return Guard([&] {
    if (session == nullptr || d2h_bytes_per_s == nullptr || h2d_bytes_per_s == nullptr) {
      return Fail(TIER_INVALID_ARGUMENT, "NULL argument");
    }
    absl::StatusOr<tier::client::ClientSession::LinkRate> rate =
        session->impl->GetLinkRate(device);
    if (!rate.ok()) return Fail(rate.status());
    *d2h_bytes_per_s = rate->d2h_bytes_per_s;
    *h2d_bytes_per_s = rate->h2d_bytes_per_s;
    return TIER_OK;
  });
}

tier_status tier_buffer_alloc_host(tier_session* session, uint64_t bytes, void** ptr,
                                   tier_buffer_id* id) {
  return Guard([&] {
    if (session == nullptr || ptr == nullptr || id == nullptr) {
      return Fail(TIER_INVALID_ARGUMENT, "NULL argument");
    }
    absl::StatusOr<uint64_t> buffer = session->impl->AllocHostBuffer(bytes, ptr);
    if (!buffer.ok()) return Fail(buffer.status());
    *id = *buffer;
    return TIER_OK;
  });
}

tier_status tier_buffer_register_fd(tier_session* session, int fd, uint64_t bytes,
                                    tier_buffer_id* id) {
  return Guard([&] {
    if (session == nullptr || id == nullptr) return Fail(TIER_INVALID_ARGUMENT, "NULL argument");
    absl::StatusOr<uint64_t> buffer = session->impl->RegisterFd(fd, bytes);
    if (!buffer.ok()) return Fail(buffer.status());
    *id = *buffer;
    return TIER_OK;
  });
}

tier_status tier_buffer_register_device_range(tier_session* session, const void* device_ptr,
                                              uint64_t len, tier_buffer_id* id, uint64_t* offset) {
  return Guard([&] {
    if (session == nullptr || device_ptr == nullptr || id == nullptr || offset == nullptr) {
      return Fail(TIER_INVALID_ARGUMENT, "NULL argument");
    }
    absl::StatusOr<tier::client::DeviceRegistry::Registered> registered =
        session->impl->RegisterDevice(device_ptr, len);
    if (!registered.ok()) return Fail(registered.status());
    if (registered->offset > registered->bytes || len > registered->bytes - registered->offset) {
      return Fail(TIER_OUT_OF_RANGE,
                  "the range crosses the end of the GPU allocation that holds its start (e.g. "
                  "two physical pages of a PyTorch expandable segment); it cannot be one job");
    }
    *id = registered->buffer_id;
    *offset = registered->offset;
    // The caller names the id in a later job: the registration stays in tierd until then, even
    // if another caller finds its memory remapped meanwhile (RegistrationHolds).
    session->impl->devices().Owe(std::move(registered->lease));
    return TIER_OK;
  });
}

tier_status tier_buffer_register_device(tier_session* session, const void* device_ptr,
                                        tier_buffer_id* id, uint64_t* offset) {
  return tier_buffer_register_device_range(session, device_ptr, 0, id, offset);
}

tier_status tier_buffer_register_device_ranges(tier_session* session, size_t count,
                                               const void* const* device_ptrs,
                                               const uint64_t* lens, tier_buffer_id* ids,
                                               uint64_t* offsets, tier_status* statuses) {
  if (session == nullptr) return Fail(TIER_INVALID_ARGUMENT, "NULL session");
  if (count > 0 && (device_ptrs == nullptr || lens == nullptr || ids == nullptr ||
                    offsets == nullptr || statuses == nullptr)) {
    return Fail(TIER_INVALID_ARGUMENT, "NULL array");
  }
  // Each range exactly as tier_buffer_register_device_range registers it (its own holds and
  // errors): one call from the caller's side for a batch, not one per range.
  for (size_t i = 0; i < count; ++i) {
    ids[i] = 0;
    offsets[i] = 0;
    statuses[i] =
        tier_buffer_register_device_range(session, device_ptrs[i], lens[i], &ids[i], &offsets[i]);
  }
  return TIER_OK;
}

tier_status tier_buffer_unregister(tier_session* session, tier_buffer_id id) {
  return Guard([&] {
    if (session == nullptr) return Fail(TIER_INVALID_ARGUMENT, "NULL session");
    return Report(session->impl->UnregisterBuffer(id));
  });
}

namespace {

// tier_offload and tier_offload_persistent; `name`: the persistent object's, or NULL.
tier_status Offload(tier_session* session, const char* name, tier_buffer_id buffer,
                    uint64_t offset, uint64_t len, const tier_offload_options* options,
                    tier_object_id* object, tier_job_id* job) {
  return Guard([&] {
    if (session == nullptr || object == nullptr || job == nullptr) {
      return Fail(TIER_INVALID_ARGUMENT, "NULL argument");
    }
    if (options != nullptr && options->struct_size < sizeof(tier_offload_options)) {
      return Fail(TIER_INVALID_ARGUMENT, "tier_offload_options.struct_size too small");
    }
    tier::client::JobRequest request;
    request.opcode = static_cast<uint32_t>(tier::ring::Opcode::kOffload);
    request.object_id = session->impl->NewObjectId();
    if (name != nullptr) {
      // One round trip on the session socket binds the id to the name; the offload itself is an
      // ordinary ring job.
      if (absl::Status bound = session->impl->CreatePersistent(name, request.object_id, len);
          !bound.ok()) {
        return Fail(bound);
      }
    }
    request.buffer_id = buffer;
    request.offset = offset;
    request.len = len;
    request.hint = options != nullptr ? options->next_use_hint : 0;
    absl::StatusOr<uint64_t> submitted;
    int device = session->impl->devices().DeviceOf(buffer);
    if (device < 0) {
      submitted = session->impl->Submit(request);
    } else {
      // The daemon's copy waits, on the GPU, for everything queued so far on the producers.
      absl::Span<void* const> producers;
      if (tier_status s = ProducersOf(options, &producers); s != TIER_OK) return s;
      tier::client::gpu::DeviceSync* sync = session->impl->devices().Sync(device);
      request.device = device;
      submitted = session->impl->SubmitTicketed(
          request, [&] { return sync->TicketOffload(producers); });
      session->impl->devices().Paid(
          buffer, submitted.ok() ? *submitted : session->impl->LastJobPushed());
    }
    if (!submitted.ok()) return Fail(submitted.status());
    *object = request.object_id;
    *job = *submitted;
    return TIER_OK;
  });
}

}  // namespace

tier_status tier_offload(tier_session* session, tier_buffer_id buffer, uint64_t offset,
                         uint64_t len, const tier_offload_options* options, tier_object_id* object,
                         tier_job_id* job) {
  return Offload(session, nullptr, buffer, offset, len, options, object, job);
}

tier_status tier_offload_persistent(tier_session* session, const char* name,
                                    tier_buffer_id buffer, uint64_t offset, uint64_t len,
                                    const tier_offload_options* options, tier_object_id* object,
                                    tier_job_id* job) {
  if (name == nullptr) return Fail(TIER_INVALID_ARGUMENT, "NULL name");
  return Offload(session, name, buffer, offset, len, options, object, job);
}

tier_status tier_object_open(tier_session* session, const char* name, tier_object_id* object,
                             uint64_t* len) {
  return Guard([&] {
    if (session == nullptr || name == nullptr || object == nullptr) {
      return Fail(TIER_INVALID_ARGUMENT, "NULL argument");
    }
    uint64_t id = session->impl->NewObjectId();
    absl::StatusOr<uint64_t> opened = session->impl->OpenPersistent(name, id);
    if (!opened.ok()) return Fail(opened.status());
    *object = id;
    if (len != nullptr) *len = *opened;
    return TIER_OK;
  });
}

tier_status tier_object_delete(tier_session* session, const char* name, uint32_t uid) {
  return Guard([&] {
    if (session == nullptr || name == nullptr) return Fail(TIER_INVALID_ARGUMENT, "NULL argument");
    if (absl::Status s = session->impl->DeletePersistent(name, uid); !s.ok()) return Fail(s);
    return TIER_OK;
  });
}

tier_status tier_object_stat(tier_session* session, const char* name, tier_object_info* info) {
  return Guard([&] {
    if (session == nullptr || name == nullptr || info == nullptr) {
      return Fail(TIER_INVALID_ARGUMENT, "NULL argument");
    }
    if (info->struct_size < sizeof(tier_object_info)) {
      return Fail(TIER_INVALID_ARGUMENT, "tier_object_info.struct_size too small");
    }
    absl::StatusOr<tier::client::PersistentState> state = session->impl->StatPersistent(name);
    if (!state.ok()) return Fail(state.status());
    info->flags = state->flags;
    info->len = state->len;
    return TIER_OK;
  });
}

tier_status tier_object_release(tier_session* session, tier_object_id object) {
  return Guard([&] {
    if (session == nullptr) return Fail(TIER_INVALID_ARGUMENT, "NULL argument");
    if (absl::Status s = session->impl->ReleasePersistent(object); !s.ok()) return Fail(s);
    return TIER_OK;
  });
}

tier_status tier_reload(tier_session* session, tier_object_id object, tier_buffer_id buffer,
                        uint64_t offset, uint64_t len, const tier_reload_options* options,
                        tier_job_id* job) {
  return Guard([&] {
    if (session == nullptr || job == nullptr) return Fail(TIER_INVALID_ARGUMENT, "NULL argument");
    if (options != nullptr && options->struct_size < sizeof(tier_reload_options)) {
      return Fail(TIER_INVALID_ARGUMENT, "tier_reload_options.struct_size too small");
    }
    tier::client::JobRequest request;
    request.opcode = static_cast<uint32_t>(tier::ring::Opcode::kReload);
    request.object_id = object;
    request.buffer_id = buffer;
    request.offset = offset;
    request.len = len;
    if (options != nullptr && (options->flags & TIER_RELOAD_FREE_AFTER)) {
      request.flags |= tier::ring::kFlagFreeAfterReload;
    }
    int device = session->impl->devices().DeviceOf(buffer);
    request.device = device;
    if (device < 0) {
      absl::StatusOr<uint64_t> submitted = session->impl->Submit(request);
      if (!submitted.ok()) return Fail(submitted.status());
      *job = *submitted;
      return TIER_OK;
    }
    // The copy waits for the consumer's work so far (the destination's allocation point), and
    // the consumer waits for the copy: it may use the data as soon as this returns.
    void* consumer = options != nullptr ? options->consumer_stream : nullptr;
    tier::client::gpu::DeviceSync* sync = session->impl->devices().Sync(device);
    absl::StatusOr<uint64_t> submitted =
        session->impl->SubmitTicketed(request, [&] { return sync->TicketReload(consumer); });
    session->impl->devices().Paid(
        buffer, submitted.ok() ? *submitted : session->impl->LastJobPushed());
    if (!submitted.ok()) return Fail(submitted.status());
    *job = *submitted;
    if (options != nullptr && (options->flags & TIER_RELOAD_DEFER_WAIT)) return TIER_OK;
    if (absl::Status waited = sync->WaitReloadDone(consumer, request.sync); !waited.ok()) {
      return Fail(waited);
    }
    return TIER_OK;
  });
}

tier_status tier_free(tier_session* session, tier_object_id object, tier_job_id* job) {
  return Guard([&] {
    if (session == nullptr || job == nullptr) return Fail(TIER_INVALID_ARGUMENT, "NULL argument");
    tier::client::JobRequest request;
    request.opcode = static_cast<uint32_t>(tier::ring::Opcode::kFree);
    request.object_id = object;
    absl::StatusOr<uint64_t> submitted = session->impl->Submit(request);
    if (!submitted.ok()) return Fail(submitted.status());
    *job = *submitted;
    return TIER_OK;
  });
}

tier_status tier_stream_wait_offload(tier_session* session, tier_job_id job, void* stream) {
  return Guard([&] {
    if (session == nullptr) return Fail(TIER_INVALID_ARGUMENT, "NULL session");
    return Report(session->impl->StreamWaitJob(job, /*reload=*/false, stream));
  });
}

tier_status tier_stream_wait_reload(tier_session* session, tier_job_id job, void* stream) {
  return Guard([&] {
    if (session == nullptr) return Fail(TIER_INVALID_ARGUMENT, "NULL session");
    return Report(session->impl->StreamWaitJob(job, /*reload=*/true, stream));
  });
}

tier_status tier_job_wait(tier_session* session, tier_job_id job, int64_t timeout_ms) {
  return Guard([&] {
    if (session == nullptr) return Fail(TIER_INVALID_ARGUMENT, "NULL session");
    return Report(session->impl->Wait(job, timeout_ms));
  });
}

tier_status tier_poll(tier_session* session, tier_completion* out, size_t max, size_t* count) {
  return Guard([&] {
    if (session == nullptr || count == nullptr || (out == nullptr && max > 0)) {
      return Fail(TIER_INVALID_ARGUMENT, "NULL argument");
    }
    std::vector<tier::client::Completion> done = session->impl->Poll(max);
    for (size_t i = 0; i < done.size(); ++i) {
      out[i] = tier_completion{done[i].job, done[i].object, done[i].len,
                               static_cast<tier_status>(done[i].status.code()), 0};
    }
    *count = done.size();
    return TIER_OK;
  });
}

}  // extern "C"
