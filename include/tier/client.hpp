// Tierd client library: a thin, header-only C++ API over the C ABI (tier.h). RAII handles; errors
// are thrown as tier::Error carrying the canonical status code.
#ifndef TIER_CLIENT_HPP_
#define TIER_CLIENT_HPP_

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>
#include <utility>

#include "tier/tier.h"

namespace tier {

class Error : public std::runtime_error {
 public:
  Error(tier_status code, const std::string& what)
      : std::runtime_error(std::string(tier_status_name(code)) + ": " + what), code_(code) {}
  tier_status code() const { return code_; }

 private:
  tier_status code_;
};

inline void Check(tier_status status) {
  if (status != TIER_OK) throw Error(status, tier_last_error());
}

// Memory shared with the daemon, registered in a session.
struct HostBuffer {
  void* data = nullptr;
  uint64_t bytes = 0;
  tier_buffer_id id = 0;
};

class Session {
 public:
  struct Options {
    std::string socket_path;  // empty: the default
    std::string name;
    uint64_t quota_bytes = 0;
    uint32_t ring_entries = 0;
  };

  Session() : Session(Options{}) {}
  explicit Session(const Options& options) {
    tier_session_options o;
    tier_session_options_init(&o);
    o.socket_path = options.socket_path.empty() ? nullptr : options.socket_path.c_str();
    o.name = options.name.empty() ? nullptr : options.name.c_str();
    o.quota_bytes = options.quota_bytes;
    o.ring_entries = options.ring_entries;
    Check(tier_session_open(&o, &session_));
  }
  Session(Session&& other) noexcept : session_(std::exchange(other.session_, nullptr)) {}
  Session& operator=(Session&& other) noexcept {
    std::swap(session_, other.session_);
    return *this;
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session() {
    if (session_ != nullptr) tier_session_close(session_);
  }

  tier_session* get() const { return session_; }

  HostBuffer AllocHost(uint64_t bytes) {
    HostBuffer buffer;
    buffer.bytes = bytes;
    Check(tier_buffer_alloc_host(session_, bytes, &buffer.data, &buffer.id));
    return buffer;
  }
  void Unregister(tier_buffer_id id) { Check(tier_buffer_unregister(session_, id)); }

  // Returns {object, job}.
  std::pair<tier_object_id, tier_job_id> Offload(tier_buffer_id buffer, uint64_t offset,
                                                 uint64_t len, uint64_t next_use_hint = 0) {
    tier_offload_options o;
    tier_offload_options_init(&o);
    o.next_use_hint = next_use_hint;
    tier_object_id object = 0;
    tier_job_id job = 0;
    Check(tier_offload(session_, buffer, offset, len, &o, &object, &job));
    return {object, job};
  }
  tier_job_id Reload(tier_object_id object, tier_buffer_id buffer, uint64_t offset, uint64_t len,
                     bool free_after = false) {
    tier_reload_options o;
    tier_reload_options_init(&o);
    o.flags = free_after ? TIER_RELOAD_FREE_AFTER : 0;
    tier_job_id job = 0;
    Check(tier_reload(session_, object, buffer, offset, len, &o, &job));
    return job;
  }
  // Batches (tier.h): one tier_batch_job per job; each job's object and job are filled in.
  static tier_batch_job BatchJob(tier_buffer_id buffer, uint64_t offset, uint64_t len,
                                 tier_object_id object = 0) {
    return {.struct_size = sizeof(tier_batch_job), .flags = 0, .buffer = buffer, .offset = offset,
            .len = len, .next_use_hint = 0, .object = object, .job = 0};
  }
  void OffloadBatch(std::vector<tier_batch_job>& jobs) {
    Check(tier_offload_batch(session_, jobs.data(), jobs.size(), nullptr));
  }
  void ReloadBatch(std::vector<tier_batch_job>& jobs, bool free_after = false) {
    tier_reload_options o;
    tier_reload_options_init(&o);
    o.flags = free_after ? TIER_RELOAD_FREE_AFTER : 0;
    Check(tier_reload_batch(session_, jobs.data(), jobs.size(), &o));
  }
  // Raw memory registered and offloaded in one call (tier_offload_ranges): one range per tensor;
  // each range's status, object and job are filled in (a range left out says why in its status).
  static tier_offload_range Range(const void* ptr, uint64_t len, uint64_t next_use_hint = 0) {
    return {.struct_size = sizeof(tier_offload_range), .status = 0, .ptr = ptr, .len = len,
            .next_use_hint = next_use_hint, .object = 0, .job = 0};
  }
  void OffloadRanges(std::vector<tier_offload_range>& ranges) {
    Check(tier_offload_ranges(session_, ranges.data(), ranges.size(), nullptr));
  }
  // Reloads into raw memory (tier_reload_ranges): all or nothing; each range's job is filled in.
  static tier_reload_range ReloadRange(tier_object_id object, void* ptr, uint64_t len,
                                       uint32_t flags = 0) {
    return {.struct_size = sizeof(tier_reload_range), .status = 0, .ptr = ptr, .len = len,
            .object = object, .flags = flags, .reserved = 0, .job = 0};
  }
  void ReloadRanges(std::vector<tier_reload_range>& ranges) {
    Check(tier_reload_ranges(session_, ranges.data(), ranges.size(), nullptr));
  }
  // Named, persistent objects (tier.h). Offload into a new one; returns {object, job}.
  std::pair<tier_object_id, tier_job_id> OffloadPersistent(const std::string& name,
                                                           tier_buffer_id buffer, uint64_t offset,
                                                           uint64_t len) {
    tier_object_id object = 0;
    tier_job_id job = 0;
    Check(tier_offload_persistent(session_, name.c_str(), buffer, offset, len, nullptr, &object,
                                  &job));
    return {object, job};
  }
  // Returns {object, length} of the persistent object `name`.
  std::pair<tier_object_id, uint64_t> Open(const std::string& name) {
    tier_object_id object = 0;
    uint64_t len = 0;
    Check(tier_object_open(session_, name.c_str(), &object, &len));
    return {object, len};
  }
  void Delete(const std::string& name, uint32_t uid = TIER_UID_SELF) {
    Check(tier_object_delete(session_, name.c_str(), uid));
  }
  // Length and TIER_OBJECT_* flags of the persistent object `name`.
  tier_object_info Stat(const std::string& name) {
    tier_object_info info{};
    info.struct_size = sizeof(info);
    Check(tier_object_stat(session_, name.c_str(), &info));
    return info;
  }
  // Drops this session's id of a persistent object (the object stays).
  void Release(tier_object_id object) { Check(tier_object_release(session_, object)); }
  tier_job_id Free(tier_object_id object) {
    tier_job_id job = 0;
    Check(tier_free(session_, object, &job));
    return job;
  }
  // Throws the job's error, if it failed.
  void Wait(tier_job_id job, int64_t timeout_ms = -1) {
    Check(tier_job_wait(session_, job, timeout_ms));
  }
  // Returns the job's status instead of throwing.
  tier_status TryWait(tier_job_id job, int64_t timeout_ms = -1) {
    return tier_job_wait(session_, job, timeout_ms);
  }

 private:
  tier_session* session_ = nullptr;
};

}  // namespace tier

#endif  // TIER_CLIENT_HPP_
