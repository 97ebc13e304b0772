/* Tierd client library: the stable C ABI (libtierclient.so).
 *
 * A process opens a session with the local tierd, registers the memory it wants to offload from
 * and reload into, and submits jobs. Jobs go through a shared-memory ring: no gRPC call and no
 * system call per job (a doorbell write only when the daemon is idle).
 *
 *   tier_session* s;  tier_session_open(NULL, &s);
 *   void* p; tier_buffer_id b;  tier_buffer_alloc_host(s, 1 << 20, &p, &b);
 *   tier_object_id o; tier_job_id j;  tier_offload(s, b, 0, 1 << 20, NULL, &o, &j);
 *   tier_job_wait(s, j, -1);           // TIER_OK once the data lives in the daemon
 *   tier_reload(s, o, b, 0, 1 << 20, NULL, &j);  tier_job_wait(s, j, -1);
 *   tier_free(s, o, &j);  tier_session_close(s);
 *
 * Rules of the ABI: opaque handles, fixed-width integers, option structs that begin with their own
 * size (so fields can be added), no C++ types. Every function returns a tier_status; on failure
 * tier_last_error() gives a message for the calling thread. A session may be used from several
 * threads at once.
 */
#ifndef TIER_TIER_H_
#define TIER_TIER_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TIER_API __attribute__((visibility("default")))

/* The canonical status codes: the same numbers as absl::StatusCode and grpc::StatusCode, so one
 * vocabulary runs from the daemon to the wire to this ABI to the Python exception. Stable. */
typedef enum tier_status {
  TIER_OK = 0,
  TIER_CANCELLED = 1,
  TIER_UNKNOWN = 2,
  TIER_INVALID_ARGUMENT = 3,
  TIER_DEADLINE_EXCEEDED = 4,
  TIER_NOT_FOUND = 5,
  TIER_ALREADY_EXISTS = 6,
  TIER_PERMISSION_DENIED = 7,
  TIER_RESOURCE_EXHAUSTED = 8,
  TIER_FAILED_PRECONDITION = 9,
  TIER_ABORTED = 10,
  TIER_OUT_OF_RANGE = 11,
  TIER_UNIMPLEMENTED = 12,
  TIER_INTERNAL = 13,
  TIER_UNAVAILABLE = 14,
  TIER_DATA_LOSS = 15,
  TIER_UNAUTHENTICATED = 16
} tier_status;

typedef struct tier_session tier_session; /* opaque */
typedef uint64_t tier_buffer_id;           /* a registered region of client memory */
typedef uint64_t tier_object_id;           /* data held by the daemon (host pool or NVMe) */
typedef uint64_t tier_job_id;              /* one submitted job, unique within a session */

/* Name of a status code ("OK", "NOT_FOUND", ...); never NULL. */
TIER_API const char* tier_status_name(tier_status status);
/* Message describing the last failure on the calling thread; never NULL. */
TIER_API const char* tier_last_error(void);
/* Library version, e.g. "0.1.0". */
TIER_API const char* tier_version(void);

/* ---- Sessions ---------------------------------------------------------------------------- */

typedef struct tier_session_options {
  uint32_t struct_size;    /* sizeof(tier_session_options) */
  const char* socket_path; /* NULL: $TIER_SOCKET, else $XDG_RUNTIME_DIR/tierd/tierd.sock when it
                              exists, else /run/tierd/tierd.sock */
  const char* name;        /* label shown by tierctl; NULL: the program's name */
  uint64_t quota_bytes;    /* 0: the daemon's default */
  uint32_t ring_entries;   /* 0: the daemon's default */
  int32_t connect_timeout_ms; /* <= 0: 5000 */
  /* Since 0.2 (structs that end before it are accepted, with the default): how long the open
   * waits for a tierd that is not listening yet or turns sessions away for a moment (one that is
   * starting, restarting or draining before its successor starts). It tries again every few
   * milliseconds until then, and fails with TIER_UNAVAILABLE after. 0: 60000; < 0: no wait (one
   * attempt, as a reconnect from a running trainer wants). */
  int32_t daemon_wait_ms;
} tier_session_options;
#define TIER_SESSION_OPTIONS_V1_SIZE 40u /* up to connect_timeout_ms, padded */

TIER_API void tier_session_options_init(tier_session_options* options);
/* Connects to tierd, opens a session and attaches to it. options may be NULL. */
TIER_API tier_status tier_session_open(const tier_session_options* options, tier_session** out);
/* Waits for the session's jobs, closes it (the daemon frees its objects) and frees the handle. */
TIER_API void tier_session_close(tier_session* session);

/* tier_session_info.flags */
#define TIER_SESSION_DAEMON_GONE 1u     /* tierd died or closed the session: open a new one */
#define TIER_SESSION_DAEMON_DRAINING 2u /* tierd is stopping: offloads are refused (keep the data),
                                          reloads and frees still go; then it exits */

typedef struct tier_session_info {
  uint32_t struct_size; /* sizeof(tier_session_info) */
  uint64_t session_id;
  uint64_t quota_bytes;
  uint32_t ring_entries;
  uint32_t flags; /* TIER_SESSION_* (since 0.2; 0 before) */
  uint64_t jobs_in_flight; /* submitted by this handle, completion not yet reaped */
  char engine[16];         /* the daemon's copy engine: "host", "cuda", "hip" */
  /* Since 0.2 (filled when struct_size covers them): what registering GPU memory cost so far.
   * Registrations and extensions sent to the daemon (an expandable segment is registered once
   * and extended as the allocator maps pages), and the allocations (VMM pages) exported for
   * them. Flat across training steps once every segment is registered. */
  uint64_t device_registrations;
  uint64_t device_extensions;
  uint64_t device_exports;
} tier_session_info;
/* The size of tier_session_info before the device_* counters (older callers pass it). */
#define TIER_SESSION_INFO_V1_SIZE 56u

TIER_API tier_status tier_session_get_info(tier_session* session, tier_session_info* info);
/* tier_session_info.flags alone, without filling the struct: cheap enough to ask before every job
 * (0 for a NULL session). Since 0.2. */
TIER_API uint32_t tier_session_flags(tier_session* session);

/* What the link of this process's GPU `device` (its CUDA/HIP ordinal) achieved for tierd's copies
 * lately, as tierd measured them: bytes per second while copies were in flight, device to host
 * and host to device; 0 until enough bytes moved. One figure for every process of the node (all
 * their copies cross the same link), read with one control call: for planners, not the hot path.
 * NOT_FOUND when tierd does not serve that GPU (the host engine, or another GPU set). Since 0.2. */
TIER_API tier_status tier_link_rate(tier_session* session, int device, double* d2h_bytes_per_s,
                                    double* h2d_bytes_per_s);

/* ---- Buffers ----------------------------------------------------------------------------- */

/* Allocates bytes of host memory shared with the daemon and registers it. This is the memory the
 * host engine copies from and to (and the pinned-staging-free path on GPU nodes). The memory lives
 * until tier_buffer_unregister or the session closes. */
TIER_API tier_status tier_buffer_alloc_host(tier_session* session, uint64_t bytes, void** ptr,
                                            tier_buffer_id* id);
/* Registers an existing memfd (sealed against shrinking: F_SEAL_SHRINK) of at least bytes. The
 * library does not take ownership of fd. Its first bytes must be populated (every page written,
 * or faulted in with MADV_POPULATE_WRITE; MAP_POPULATE on a shared mapping faults pages in for
 * reading, and reclaim may drop those), so the memory is charged to the caller, not to tierd; memfds on
 * hugetlbfs (MFD_HUGETLB) are refused. A host-engine tierd seals the memfd with
 * F_SEAL_FUTURE_WRITE once it mapped it, so that no hole can be punched into it: map it
 * writable before registering (those mappings stay writable; write(2) and new writable mappings
 * fail from then on); registering it again shares tierd's mapping, and once its last
 * registration ended it cannot be registered again. TIER_INVALID_ARGUMENT otherwise;
 * TIER_RESOURCE_EXHAUSTED past the daemon's buffer limits (max_buffers_per_session,
 * max_mapped_bytes_per_session, ...). */
TIER_API tier_status tier_buffer_register_fd(tier_session* session, int fd, uint64_t bytes,
                                             tier_buffer_id* id);
/* Registers the GPU allocation that contains device_ptr (the whole allocation, once: later calls
 * for pointers inside an already registered allocation return the same id). *offset is
 * device_ptr's offset within the allocation, to use in jobs. UNIMPLEMENTED without a GPU engine.
 * When the library finds memory under a registration remapped (freed to the driver and mapped
 * anew, e.g. an expandable segment's page after torch.cuda.empty_cache()), the registration is
 * no longer returned and is dropped in tierd, but only after every id handed out for it was
 * named by a job (tier_offload, tier_reload, a batch) and those jobs completed: an id returned
 * here is valid for the job it was registered for, if that job is submitted before the session
 * pushes 4096 more jobs (an id never used then lapses, so it cannot keep freed memory mapped in
 * tierd; a later job naming it fails with TIER_NOT_FOUND). Register again for each job rather
 * than keeping ids of memory an allocator may free. */
TIER_API tier_status tier_buffer_register_device(tier_session* session, const void* device_ptr,
                                                 tier_buffer_id* id, uint64_t* offset);
/* tier_buffer_register_device, and checks that [device_ptr, device_ptr + len) lies in that one
 * allocation: TIER_OUT_OF_RANGE if it crosses its end (VMM ranges made of several physical
 * allocations, e.g. PyTorch expandable segments, cannot hold a job across two of them). */
TIER_API tier_status tier_buffer_register_device_range(tier_session* session,
                                                       const void* device_ptr, uint64_t len,
                                                       tier_buffer_id* id, uint64_t* offset);
/* tier_buffer_register_device_range for `count` ranges in one call (a batch of jobs registers
 * every range it names so): range i is [device_ptrs[i], +lens[i]), its id and offset go to ids[i]
 * and offsets[i], and statuses[i] is what tier_buffer_register_device_range would have returned
 * for it (its ids[i] / offsets[i] are 0 unless TIER_OK). Each range is registered as that call
 * would register it, with the same lifetime rules. Returns TIER_OK once every range was tried
 * (the last error names the last range that failed), TIER_INVALID_ARGUMENT for a NULL array
 * with count > 0. Since 0.2. */
TIER_API tier_status tier_buffer_register_device_ranges(tier_session* session, size_t count,
                                                        const void* const* device_ptrs,
                                                        const uint64_t* lens, tier_buffer_id* ids,
                                                        uint64_t* offsets, tier_status* statuses);
/* Waits for jobs that use the buffer, then drops it (the daemon closes its mapping). */
TIER_API tier_status tier_buffer_unregister(tier_session* session, tier_buffer_id id);

/* ---- Jobs -------------------------------------------------------------------------------- */

typedef struct tier_offload_options {
  uint32_t struct_size; /* sizeof(tier_offload_options) */
  uint32_t num_producer_streams;
  /* GPU only: the streams whose work wrote the data (cudaStream_t / hipStream_t). The daemon's copy
   * waits on the GPU for all of them. NULL/0: the calling thread's current (legacy default) stream. */
  void* const* producer_streams;
  /* Expected order of reload, smaller = sooner; 0 = no hint (spill policy treats offload order as
   * reverse reload order, as in activation offload). */
  uint64_t next_use_hint;
} tier_offload_options;

typedef struct tier_reload_options {
  uint32_t struct_size; /* sizeof(tier_reload_options) */
  uint32_t flags;       /* TIER_RELOAD_* */
  /* GPU only: the stream that will use the data. Before tier_reload returns, this stream has been
   * made to wait for the copy's completion. NULL: the legacy default stream. */
  void* consumer_stream;
} tier_reload_options;

/* Drop the object once the reload has copied it out (saves a tier_free round trip). */
#define TIER_RELOAD_FREE_AFTER 1u
/* GPU reloads: the consumer stream is NOT made to wait before tier_reload returns. The copy still
 * waits for the consumer's work so far (the destination's allocation point), so work queued on
 * the consumer meanwhile runs beside it: a prefetch into memory of the consumer's own allocator
 * pool. Before the data's first use, and before the destination may be freed or reused, call
 * tier_stream_wait_reload(job) on the consumer stream. Since 0.2. */
#define TIER_RELOAD_DEFER_WAIT 2u

TIER_API void tier_offload_options_init(tier_offload_options* options);
TIER_API void tier_reload_options_init(tier_reload_options* options);

/* Copies len bytes at offset of buffer into a new daemon object. *object is valid at once (jobs
 * naming it are ordered after this one); the data must not change until the job completes. */
TIER_API tier_status tier_offload(tier_session* session, tier_buffer_id buffer, uint64_t offset,
                                  uint64_t len, const tier_offload_options* options,
                                  tier_object_id* object, tier_job_id* job);
/* Copies the object (len must equal its length) into buffer at offset. */
TIER_API tier_status tier_reload(tier_session* session, tier_object_id object,
                                 tier_buffer_id buffer, uint64_t offset, uint64_t len,
                                 const tier_reload_options* options, tier_job_id* job);
/* Drops the object; its memory returns to the pool once jobs using it have finished. */
TIER_API tier_status tier_free(tier_session* session, tier_object_id object, tier_job_id* job);

/* ---- Batches ---------------------------------------------------------------------------- */
/* Many offloads (or reloads) submitted as one: on a GPU they share one ticket, so the client
 * pays one stream wait and one ticket write for all of them, the daemon issues their copies in one
 * driver call where the runtime allows, and one completion value releases the consumer. All jobs
 * of a batch use buffers of the same GPU, or all host buffers. Each job still completes (and
 * fails) on its own, with its own tier_job_id. A batch is pushed whole or not at all; on an error
 * before the push nothing was submitted. */
typedef struct tier_batch_job {
  uint32_t struct_size;   /* sizeof(tier_batch_job); the array's stride is jobs[0].struct_size */
  uint32_t flags;         /* reloads: TIER_RELOAD_* for this job (ORed with the options' flags) */
  tier_buffer_id buffer;
  uint64_t offset;
  uint64_t len;
  uint64_t next_use_hint; /* offloads: as tier_offload_options.next_use_hint */
  tier_object_id object;  /* offloads: set to the new object; reloads: the object to copy */
  tier_job_id job;        /* set to the job's id */
} tier_batch_job;

/* Jobs per batch: at most this many, and at most the session's ring_entries. */
#define TIER_MAX_BATCH_JOBS 1024u

/* Offloads jobs[0..count): one tier_offload each, sharing the options (producer streams, which
 * wrote every source; next_use_hint comes from each job). */
TIER_API tier_status tier_offload_batch(tier_session* session, tier_batch_job* jobs, size_t count,
                                        const tier_offload_options* options);
/* Offloads of raw memory, registered and submitted in one call: what a trainer's offload of
 * tensors it did not allocate through Tier (activations, optimizer state) takes, without one call
 * to register each range and another to submit them. Range i is [ranges[i].ptr, +len): GPU
 * memory (registered as tier_buffer_register_device_range registers it, with its lifetime rules)
 * or host memory inside a buffer of tier_buffer_alloc_host. The ranges that register go as one
 * tier_offload_batch sharing the options' producer streams, each with its own next_use_hint; a
 * range that does not is left out and says why in its status (e.g. TIER_OUT_OF_RANGE: it spans
 * two physical allocations and cannot be one job; TIER_UNIMPLEMENTED: a library without GPU
 * support), while the others still go. count is at most TIER_MAX_BATCH_JOBS and the session's
 * ring_entries, and every range that registers must lie on one GPU, or all in host memory
 * (TIER_INVALID_ARGUMENT otherwise, nothing submitted). Returns TIER_OK once the batch of
 * registered ranges was pushed (or none registered; tier_last_error then names the last range that
 * failed); on an error return nothing was pushed and each registered range's status is that
 * error. Since 0.2. */
typedef struct tier_offload_range {
  uint32_t struct_size;   /* sizeof(tier_offload_range); the stride is ranges[0].struct_size */
  int32_t status;         /* set: TIER_OK (offloaded: object and job set) or why it was not */
  const void* ptr;
  uint64_t len;
  uint64_t next_use_hint; /* as tier_offload_options.next_use_hint */
  tier_object_id object;  /* set to the new object */
  tier_job_id job;        /* set to the job's id */
} tier_offload_range;

TIER_API tier_status tier_offload_ranges(tier_session* session, tier_offload_range* ranges,
                                         size_t count, const tier_offload_options* options);
/* Reloads into raw memory, registered and submitted in one call (tier_offload_ranges' other half):
 * range i copies object ranges[i].object into [ptr, +len) (GPU memory, or host memory inside a
 * buffer of tier_buffer_alloc_host), as one tier_reload_batch with the options (consumer stream,
 * flags ORed with each range's). A reload must land, so the call is all or nothing: if a range's
 * destination cannot be registered, nothing is pushed, that range's status says why, the others
 * say TIER_ABORTED, and the call returns the first such status. On any error return before the
 * push nothing was pushed (every status says why); if the consumer's wait fails after the push,
 * the jobs are in flight (their ids are set) and the call returns that error. Since 0.2. */
typedef struct tier_reload_range {
  uint32_t struct_size;   /* sizeof(tier_reload_range); the stride is ranges[0].struct_size */
  int32_t status;         /* set: TIER_OK, or why the call did not go */
  void* ptr;              /* the destination */
  uint64_t len;           /* must equal the object's length */
  tier_object_id object;  /* the object to copy */
  uint32_t flags;         /* TIER_RELOAD_FREE_AFTER for this range (or the options' flags) */
  uint32_t reserved;
  tier_job_id job;        /* set to the job's id */
} tier_reload_range;

TIER_API tier_status tier_reload_ranges(tier_session* session, tier_reload_range* ranges,
                                        size_t count, const tier_reload_options* options);
/* Reloads jobs[0..count) for the options' consumer stream: before it returns, the consumer
 * waits (on the GPU) for all of their copies. */
TIER_API tier_status tier_reload_batch(tier_session* session, tier_batch_job* jobs, size_t count,
                                       const tier_reload_options* options);

/* GPU offloads: makes `stream` (cudaStream_t / hipStream_t; NULL: the legacy default stream) wait,
 * on the GPU, until the offload's copy has read its source. Work queued on the stream afterwards
 * may free or overwrite the source at once, with no host round trip. For a finished job or an
 * offload from host memory there is nothing to wait for (TIER_OK). */
TIER_API tier_status tier_stream_wait_offload(tier_session* session, tier_job_id job, void* stream);

/* GPU reloads submitted with TIER_RELOAD_DEFER_WAIT: makes `stream` wait, on the GPU, until the
 * reload's copy has landed; work queued on it afterwards may read the destination. Cannot
 * deadlock: the copy needs only the ticket enqueued when the reload was submitted. For a finished
 * job or a reload into host memory there is nothing to wait for (TIER_OK). Since 0.2. */
TIER_API tier_status tier_stream_wait_reload(tier_session* session, tier_job_id job, void* stream);

/* Waits until the job completes and returns its status (TIER_DEADLINE_EXCEEDED if timeout_ms
 * passes first; timeout_ms < 0 waits for ever). A job's result can be waited for once. If the
 * daemon dies, pending jobs complete with TIER_UNAVAILABLE. */
TIER_API tier_status tier_job_wait(tier_session* session, tier_job_id job, int64_t timeout_ms);

typedef struct tier_completion {
  tier_job_id job;
  tier_object_id object;
  uint64_t len;
  tier_status status;
  uint32_t reserved;
} tier_completion;

/* Returns up to max completions not yet waited for, without blocking. */
TIER_API tier_status tier_poll(tier_session* session, tier_completion* out, size_t max,
                               size_t* count);

/* ---- Named, persistent objects ----------------------------------------------------------- */
/* An object may be given a name in the namespace of the caller's uid (the daemon takes the uid from
 * the session socket's kernel credentials, never from the caller) and then outlives the session:
 * a later session of the same uid opens it by name, reloads it and deletes it. Persistent objects
 * count against the daemon's persistent_quota_bytes_per_uid, not the session's quota; other uids
 * get TIER_NOT_FOUND for them, as for names that do not exist. Host-memory objects end with
 * tierd. Names: 1..127 printable ASCII bytes, no spaces. */

/* tier_offload into a new persistent object `name`: TIER_ALREADY_EXISTS when the name is taken.
 * One round trip to tierd names *object before the offload goes through the ring as usual;
 * TIER_RESOURCE_EXHAUSTED (the uid's persistent quota) comes with the job's completion. */
TIER_API tier_status tier_offload_persistent(tier_session* session, const char* name,
                                             tier_buffer_id buffer, uint64_t offset, uint64_t len,
                                             const tier_offload_options* options,
                                             tier_object_id* object, tier_job_id* job);
/* Gives the persistent object `name` an id in this session (*len: its length; may be NULL), for
 * tier_reload (and tier_free, which deletes it). TIER_NOT_FOUND. */
TIER_API tier_status tier_object_open(tier_session* session, const char* name,
                                      tier_object_id* object, uint64_t* len);
/* The caller's own namespace. */
#define TIER_UID_SELF 0xffffffffu
/* Deletes the persistent object `name` of `uid` (TIER_UID_SELF: the caller's; another uid's only
 * for root). Its memory returns once jobs using it have finished. TIER_NOT_FOUND. */
TIER_API tier_status tier_object_delete(tier_session* session, const char* name, uint32_t uid);

/* tier_object_info.flags */
#define TIER_OBJECT_READY 1u     /* its offload landed: it can be reloaded */
#define TIER_OBJECT_DURABLE 2u   /* written through to NVMe: it survives a restart of tierd */
#define TIER_OBJECT_JOURNALED 4u /* this tierd writes persistent objects through to NVMe, so
                                    DURABLE follows READY (without it, DURABLE never comes) */
typedef struct tier_object_info {
  uint32_t struct_size; /* sizeof(tier_object_info), set by the caller */
  uint32_t flags;       /* TIER_OBJECT_* */
  uint64_t len;         /* length in bytes */
} tier_object_info;
/* The state of the caller's persistent object `name`, binding no id: for a caller that waits for
 * an object to become durable. TIER_NOT_FOUND (also before its offload has begun). */
TIER_API tier_status tier_object_stat(tier_session* session, const char* name,
                                      tier_object_info* info);
/* Drops this session's id `object` of a persistent object (from tier_object_open or
 * tier_offload_persistent); the object stays. A session holds at most 4096 such ids, so a
 * long-lived session releases the ones it is done with, after the jobs using them completed (a
 * job that starts on a released id fails with TIER_NOT_FOUND). An id whose object is deleted
 * through it (tier_free, or a reload with TIER_RELOAD_FREE_AFTER) is released with the object. TIER_NOT_FOUND when `object` is
 * not such an id. */
TIER_API tier_status tier_object_release(tier_session* session, tier_object_id object);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TIER_TIER_H_ */
