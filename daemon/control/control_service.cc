#include "daemon/control/control_service.h"

#include "absl/strings/str_cat.h"
#include "common/admin_token.h"
#include "common/version.h"
#include "tier/ring.h"

namespace tier::daemon {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

void AddJobKinds(const JobMetrics& jobs, v1::GetStatusResponse* response) {
  for (uint64_t bound_ns : kLatencyBoundsNs) {
    response->add_latency_bucket_bounds_seconds(static_cast<double>(bound_ns) / 1e9);
  }
  for (int k = 0; k < kJobKinds; ++k) {
    const auto kind = static_cast<JobKind>(k);
    uint64_t completed = 0, failed = 0;
    for (int code = 0; code < kStatusCodes; ++code) {
      (code == 0 ? completed : failed) += jobs.completed(kind, code);
    }
    if (jobs.started(kind) == 0 && completed == 0 && failed == 0) continue;
    v1::JobKindStatus* out = response->add_job_kinds();
    out->set_kind(std::string(JobKindName(kind)));
    out->set_started(jobs.started(kind));
    out->set_completed(completed);
    out->set_failed(failed);
    for (int size = 0; size < kSizeClasses; ++size) {
      LatencySnapshot h = jobs.latency(kind, size);
      if (h.count == 0) continue;
      v1::LatencyHistogram* histogram = out->add_latency();
      histogram->set_size_class(std::string(SizeClassName(size)));
      for (uint64_t n : h.buckets) histogram->add_bucket_counts(n);
      histogram->set_count(h.count);
      histogram->set_sum_seconds(static_cast<double>(h.sum_ns) / 1e9);
    }
  }
}

ControlService::ControlService(ControlContext context, SessionRegistry& registry,
                               storage::HostPool& pool, NvmeTransfers* nvme,
                               engine::CopyEngine& engine, DaemonMetrics& metrics,
                               const HealthMonitor& health,
                               std::function<uint64_t(uint32_t)> drain,
                               const PersistentStore* persistent)
    : context_(std::move(context)), registry_(registry), pool_(pool), nvme_(nvme),
      engine_(engine), metrics_(metrics), health_(health), drain_(std::move(drain)),
      persistent_(persistent) {}

v1::HealthResponse::State ControlService::State(std::string* reason) const {
  if (registry_.draining()) {
    if (reason != nullptr) *reason = "draining: no new sessions or jobs";
    return v1::HealthResponse::DRAINING;
  }
  if (absl::Status moving = health_.Check(MonotonicMs()); !moving.ok()) {
    if (reason != nullptr) *reason = std::string(moving.message());
    return v1::HealthResponse::NOT_SERVING;
  }
  return v1::HealthResponse::SERVING;
}

grpc::Status ControlService::GetVersion(grpc::ServerContext*, const v1::GetVersionRequest*,
                                        v1::GetVersionResponse* response) {
  response->set_version(context_.version);
  response->set_api_version(kApiVersion);
  response->set_ring_version(ring::kVersion);
  response->set_engine(context_.engine);
  return grpc::Status::OK;
}

grpc::Status ControlService::Health(grpc::ServerContext*, const v1::HealthRequest*,
                                    v1::HealthResponse* response) {
  std::string reason;
  response->set_state(State(&reason));
  response->set_reason(reason);
  return grpc::Status::OK;
}

grpc::Status ControlService::OpenSession(grpc::ServerContext* call,
                                         const v1::OpenSessionRequest* request,
                                         v1::OpenSessionResponse* response) {
  if (request->client_api_version() != 0 && request->client_api_version() != kApiVersion) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("protocol mismatch: this client (", request->client_version(),
                     ") speaks protocol ", request->client_api_version(), ", tierd ",
                     context_.version, " speaks protocol ", kApiVersion,
                     ": use a client and a daemon of the same protocol version"));
  }
  std::optional<uid_t> opener;
  if (context_.peers != nullptr) {
    if (std::optional<PeerCredentials> peer = context_.peers->PeerOf(call->peer())) {
      opener = peer->uid;
    }
  }
  absl::StatusOr<OpenedSession> opened =
      registry_.Open(request->name(), request->quota_bytes(), request->ring_entries(), opener);
  if (!opened.ok()) return ToGrpc(opened.status());
  response->set_session_id(opened->session->id());
  response->set_attach_token(opened->token.data(), opened->token.size());
  response->set_session_socket(context_.session_socket);
  response->set_quota_bytes(opened->session->quota_bytes());
  response->set_ring_entries(opened->session->ring_entries());
  response->set_attach_timeout_ms(context_.attach_timeout_ms);
  response->set_api_version(kApiVersion);
  response->set_daemon_version(context_.version);
  return grpc::Status::OK;
}

grpc::Status ControlService::CloseSession(grpc::ServerContext*,
                                          const v1::CloseSessionRequest* request,
                                          v1::CloseSessionResponse*) {
  AttachToken token{};
  if (request->attach_token().size() != token.size()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "attach_token must be 16 bytes");
  }
  std::copy(request->attach_token().begin(), request->attach_token().end(), token.begin());
  return ToGrpc(registry_.Close(request->session_id(), token));
}

grpc::Status ControlService::GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                                       v1::GetStatusResponse* response) {
  uint64_t now = MonotonicMs();
  response->set_version(context_.version);
  response->set_engine(context_.engine);
  response->set_uptime_ms(now - context_.started_ms);
  response->set_state(State());
  storage::PoolUsage usage = pool_.Usage();
  v1::TierStatus* host = response->add_tiers();
  host->set_name("host");
  host->set_capacity_bytes(usage.capacity_bytes);
  host->set_used_bytes(usage.used_bytes);
  host->set_free_bytes(usage.free_bytes);
  host->set_objects(usage.allocations);
  if (nvme_ != nullptr) {
    v1::TierStatus* nvme = response->add_tiers();
    nvme->set_name("nvme");
    for (const storage::SpillFileUsage& file : nvme_->store().Usage()) {
      nvme->set_capacity_bytes(nvme->capacity_bytes() + file.capacity_bytes);
      nvme->set_used_bytes(nvme->used_bytes() + file.used_bytes);
      nvme->set_objects(nvme->objects() + file.records);
      response->set_spill_write_errors(response->spill_write_errors() + file.write_errors);
      response->set_spill_read_errors(response->spill_read_errors() + file.read_errors);
      response->set_checksum_failures(response->checksum_failures() + file.checksum_failures);
      v1::SpillFileStatus* out = response->add_spill_files();
      out->set_directory(file.directory);
      out->set_path(file.path);
      out->set_direct_io(file.direct_io);
      out->set_capacity_bytes(file.capacity_bytes);
      out->set_used_bytes(file.used_bytes);
      out->set_records(file.records);
      out->set_bytes_written(file.bytes_written);
      out->set_bytes_read(file.bytes_read);
      out->set_write_errors(file.write_errors);
      out->set_read_errors(file.read_errors);
      out->set_checksum_failures(file.checksum_failures);
    }
    nvme->set_free_bytes(nvme->capacity_bytes() - nvme->used_bytes());
    const SpillCounters& c = nvme_->counters();
    response->set_spill_io(std::string(nvme_->store().io_queue_name()));
    response->set_bytes_spilled(c.bytes_spilled.load(std::memory_order_relaxed));
    response->set_bytes_fetched(c.bytes_fetched.load(std::memory_order_relaxed));
    response->set_spill_bandwidth_bytes_per_s(c.spill_bandwidth.BytesPerSecond(now));
    response->set_fetch_bandwidth_bytes_per_s(c.fetch_bandwidth.BytesPerSecond(now));
    response->set_prefetches(c.prefetches.load(std::memory_order_relaxed));
    response->set_bytes_prefetched(c.bytes_prefetched.load(std::memory_order_relaxed));
    response->set_prefetch_hits(c.prefetch_hits.load(std::memory_order_relaxed));
    response->set_prefetch_misses(c.prefetch_misses.load(std::memory_order_relaxed));
    response->set_spills(c.spills.load(std::memory_order_relaxed));
    response->set_fetches(c.fetches.load(std::memory_order_relaxed));
  }
  AddJobKinds(metrics_.jobs, response);
  response->set_sessions(static_cast<uint32_t>(registry_.size()));
  response->set_jobs_in_flight(metrics_.jobs_in_flight.value());
  response->set_jobs_completed(metrics_.totals.jobs_completed.Sum());
  response->set_jobs_failed(metrics_.totals.jobs_failed.Sum());
  response->set_bytes_offloaded(metrics_.totals.bytes_offloaded.Sum());
  response->set_bytes_reloaded(metrics_.totals.bytes_reloaded.Sum());
  response->set_recent_bandwidth_bytes_per_s(metrics_.bandwidth.BytesPerSecond(now));
  response->set_pool_locked(pool_.locked() || pool_.registered());
  const storage::PoolSetup& setup = pool_.setup();
  v1::PoolSetupStatus* pool_setup = response->mutable_pool_setup();
  pool_setup->set_seconds(static_cast<double>(setup.total_ns) / 1e9);
  pool_setup->set_populate_seconds(static_cast<double>(setup.populate_ns) / 1e9);
  pool_setup->set_lock_seconds(static_cast<double>(setup.lock_ns) / 1e9);
  pool_setup->set_register_seconds(static_cast<double>(setup.register_ns) / 1e9);
  pool_setup->set_threads(setup.threads);
  pool_setup->set_huge_page_bytes(setup.huge_bytes);
  AddPoolParts(response);
  engine::EngineCounts counts = engine_.Counts();
  response->set_buffers(counts.buffers);
  const UsageLedger::Usage clients = registry_.ClientTotals();
  response->set_client_mapped_bytes(clients.mapped_bytes);
  response->set_client_reserved_bytes(clients.reserved_bytes);
  response->set_max_mapped_bytes(context_.max_mapped_bytes);
  if (context_.metrics_state) response->set_metrics(context_.metrics_state());
  if (context_.pollers) {
    for (const PollerStatus& poller : context_.pollers()) {
      v1::RingPollerStatus* out = response->add_ring_pollers();
      out->set_device(poller.device);
      out->set_sessions(poller.sessions);
      out->set_heartbeat_age_ms(poller.heartbeat_age_ms);
    }
  }
  response->set_gpu_lanes(counts.lanes);
  response->set_pending_releases(counts.pending_releases);
  if (persistent_ != nullptr) AddPersistent(persistent_->usage(), response->mutable_persistent());
  return grpc::Status::OK;
}

void ControlService::AddPersistent(const PersistentUsage& usage, v1::PersistentStatus* out) {
  out->set_objects(usage.objects);
  out->set_bytes(usage.bytes);
  out->set_uids(usage.uids);
  out->set_quota_bytes_per_uid(usage.limits.quota_bytes_per_uid);
  out->set_max_bytes(usage.limits.max_bytes);
  out->set_max_objects_per_uid(usage.limits.max_objects_per_uid);
  out->set_max_objects(usage.limits.max_objects);
  out->set_journaled(usage.journaled);
  out->set_journal_bytes(usage.journal.file_bytes);
  out->set_journal_live_bytes(usage.journal.live_bytes);
  out->set_journal_max_bytes(usage.journal.max_bytes);
  out->set_journal_compactions(usage.journal.compactions);
  out->set_journal_errors(usage.journal.errors);
  out->set_journal_queued(usage.writes_queued);
}

void ControlService::AddPoolParts(v1::GetStatusResponse* response) const {
  const std::vector<storage::PoolPartUsage> parts = pool_.PartUsage();
  for (size_t i = 0; i < parts.size(); ++i) {
    const storage::PoolPartUsage& usage = parts[i];
    v1::PoolPartStatus* part = response->add_pool_parts();
    part->set_part(static_cast<uint32_t>(i));
    part->set_numa_node(usage.numa_node);
    part->set_capacity_bytes(usage.capacity_bytes);
    part->set_used_bytes(usage.used_bytes);
    part->set_free_bytes(usage.free_bytes);
    part->set_objects(usage.allocations);
    if (i < context_.pool_layout.parts.size()) {
      for (int gpu : context_.pool_layout.parts[i].gpus) part->add_gpus(gpu);
    }
    part->set_local_allocations(usage.local_allocations);
    part->set_remote_allocations(usage.remote_allocations);
    part->set_any_allocations(usage.any_allocations);
  }
  response->set_pool_layout(context_.pool_layout.summary);
  const std::vector<engine::LinkRate> links = engine_.LinkRates();
  for (const GpuLocation& location : context_.gpus) {
    v1::GpuPlacement* gpu = response->add_gpus();
    gpu->set_device(location.device);
    gpu->set_pci_bus_id(location.pci_bus_id);
    gpu->set_numa_node(location.numa_node);
    gpu->set_pci_root(location.pci_root);
    const std::vector<int>& part_of_gpu = context_.pool_layout.part_of_gpu;
    gpu->set_pool_part(location.device >= 0 &&
                               static_cast<size_t>(location.device) < part_of_gpu.size()
                           ? part_of_gpu[location.device]
                           : -1);
    for (const engine::LinkRate& link : links) {
      if (link.device != location.device) continue;
      gpu->set_d2h_bytes_per_s(link.d2h_bytes_per_s);
      gpu->set_h2d_bytes_per_s(link.h2d_bytes_per_s);
      gpu->set_d2h_bytes(link.d2h_bytes);
      gpu->set_h2d_bytes(link.h2d_bytes);
    }
  }
}

grpc::Status ControlService::ListSessions(grpc::ServerContext*, const v1::ListSessionsRequest*,
                                          v1::ListSessionsResponse* response) {
  for (const SessionSnapshot& s : registry_.Snapshots()) {
    v1::SessionInfo* info = response->add_sessions();
    info->set_session_id(s.id);
    info->set_name(s.name);
    info->set_attached(s.attached);
    info->set_pid(s.peer.pid);
    info->set_uid(s.peer.uid);
    info->set_gid(s.peer.gid);
    info->set_quota_bytes(s.quota_bytes);
    info->set_used_bytes(s.used_bytes);
    info->set_objects(s.objects);
    info->set_buffers(s.buffers);
    info->set_mapped_bytes(s.charged.mapped_bytes);
    info->set_reserved_bytes(s.charged.reserved_bytes);
    info->set_jobs_in_flight(s.jobs_in_flight);
    info->set_jobs_completed(s.jobs_completed);
    info->set_jobs_failed(s.jobs_failed);
    info->set_bytes_offloaded(s.bytes_offloaded);
    info->set_bytes_reloaded(s.bytes_reloaded);
    info->set_age_ms(s.age_ms);
    for (const engine::LaneStatus& lane : s.lanes) {
      v1::LaneInfo* out = info->add_lanes();
      out->set_gpu(lane.device);
      out->set_direction(lane.direction == engine::Direction::kToPool ? "D2H" : "H2D");
      out->set_queued(lane.queued);
      out->set_held(lane.held);
      out->set_in_flight(lane.in_flight);
      out->set_waiting_ticket(lane.waiting_ticket);
      out->set_client_ticket(lane.client_ticket);
      out->set_waiting_ms(lane.waiting_ms);
      out->set_blocked_on(lane.blocked_on);
      out->set_active(lane.active);
      out->set_issued_seq(lane.issued_seq);
      out->set_completed_seq(lane.completed_seq);
      out->set_oldest_in_flight_ms(lane.oldest_in_flight_ms);
      out->set_gpu_waits(lane.gpu_waits);
    }
  }
  return grpc::Status::OK;
}

grpc::Status ControlService::Drain(grpc::ServerContext*, const v1::DrainRequest* request,
                                   v1::DrainResponse* response) {
  // Permanent for this daemon's life: root and tierd's own user only (common/admin_token.h).
  if (!AdminTokenMatches(context_.admin_token, request->admin_token())) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("drain is for root and tierd's own user: the request must "
                                     "carry the token in ", context_.admin_token_path));
  }
  response->set_jobs_in_flight(drain_(request->timeout_ms()));
  return grpc::Status::OK;
}

grpc::Status ControlService::ListObjects(grpc::ServerContext*,
                                         const v1::ListObjectsRequest* request,
                                         v1::ListObjectsResponse* response) {
  // Names are private to their uid, and gRPC over a Unix socket does not say who calls: only the
  // admin token's holders (root, tierd's user) see every uid's objects.
  if (!AdminTokenMatches(context_.admin_token, request->admin_token())) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("listing persistent objects is for root and tierd's own "
                                     "user: the request must carry the token in ",
                                     context_.admin_token_path));
  }
  if (persistent_ == nullptr) return grpc::Status::OK;
  response->set_quota_bytes_per_uid(persistent_->quota_bytes_per_uid());
  for (const PersistentObjectInfo& object : persistent_->List()) {
    v1::ObjectInfo* info = response->add_objects();
    info->set_name(object.name);
    info->set_uid(object.uid);
    info->set_bytes(object.bytes);
    info->set_tier(object.tier);
    info->set_age_ms(object.age_ms);
    info->set_durable(object.durable);
  }
  return grpc::Status::OK;
}

}  // namespace tier::daemon
