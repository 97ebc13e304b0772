// The gRPC control API (proto/tier.proto) over the daemon's parts. Read-mostly: it opens and closes
// sessions, reports status, and drains; it never touches the job path.
#ifndef TIER_DAEMON_CONTROL_CONTROL_SERVICE_H_
#define TIER_DAEMON_CONTROL_CONTROL_SERVICE_H_

#include <functional>
#include <string>
#include <vector>

#include "daemon/control/control_acceptor.h"
#include "daemon/control/health_monitor.h"
#include "daemon/jobs/ring_pollers.h"
#include "daemon/metrics/metrics.h"
#include "daemon/persistent/persistent_store.h"
#include "daemon/sessions/session_registry.h"
#include "daemon/tiers/numa_topology.h"
#include "daemon/tiers/pool_layout.h"
#include "daemon/tiers/nvme_transfers.h"
#include "storage/host_pool.h"
#include "tier.grpc.pb.h"

namespace tier::daemon {

struct ControlContext {
  std::string version;
  std::string engine;
  std::string session_socket;
  uint32_t attach_timeout_ms = 0;
  uint64_t started_ms = 0;
  // Drain needs it (common/admin_token.h); admin_token_path is named in the refusal.
  std::string admin_token;
  std::string admin_token_path;
  // The host pool's parts as laid out at start, and where the GPUs are (status: pool_parts,
  // pool_layout, gpus).
  PoolLayout pool_layout;
  std::vector<GpuLocation> gpus;
  uint64_t max_mapped_bytes = 0;  // the node-wide limit in force (status)
  // Who is at the other end of a call (SO_PEERCRED of its connection); null: nobody knows.
  const ControlAcceptor* peers = nullptr;
  // The metrics endpoint's state ("" when metrics_listen is off).
  std::function<std::string()> metrics_state = nullptr;
  // The ring pollers as they are now (status: ring_pollers); null: none shown.
  std::function<std::vector<PollerStatus>()> pollers = nullptr;
};

class ControlService final : public tier::v1::Control::Service {
 public:
  // `drain(timeout_ms)` stops admission and waits for in-flight jobs; returns jobs left.
  // `nvme`: the NVMe tier's transfers (its store and counters), or null.
  ControlService(ControlContext context, SessionRegistry& registry, storage::HostPool& pool,
                 NvmeTransfers* nvme, engine::CopyEngine& engine, DaemonMetrics& metrics,
                 const HealthMonitor& health,
                 std::function<uint64_t(uint32_t)> drain,
                 const PersistentStore* persistent = nullptr);

  grpc::Status GetVersion(grpc::ServerContext*, const v1::GetVersionRequest*,
                          v1::GetVersionResponse*) override;
  grpc::Status Health(grpc::ServerContext*, const v1::HealthRequest*,
                      v1::HealthResponse*) override;
  grpc::Status OpenSession(grpc::ServerContext*, const v1::OpenSessionRequest*,
                           v1::OpenSessionResponse*) override;
  grpc::Status CloseSession(grpc::ServerContext*, const v1::CloseSessionRequest*,
                            v1::CloseSessionResponse*) override;
  grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                         v1::GetStatusResponse*) override;
  grpc::Status ListSessions(grpc::ServerContext*, const v1::ListSessionsRequest*,
                            v1::ListSessionsResponse*) override;
  grpc::Status Drain(grpc::ServerContext*, const v1::DrainRequest*,
                     v1::DrainResponse*) override;
  grpc::Status ListObjects(grpc::ServerContext*, const v1::ListObjectsRequest*,
                           v1::ListObjectsResponse*) override;

 private:
  // The state, and why it is not SERVING (empty when it is).
  v1::HealthResponse::State State(std::string* reason = nullptr) const;
  // The pool's parts and the GPUs' places, into a status answer.
  void AddPoolParts(v1::GetStatusResponse* response) const;

  const ControlContext context_;
  SessionRegistry& registry_;
  storage::HostPool& pool_;
  NvmeTransfers* nvme_;
  engine::CopyEngine& engine_;
  DaemonMetrics& metrics_;
  const HealthMonitor& health_;
  std::function<uint64_t(uint32_t)> drain_;
  static void AddPersistent(const PersistentUsage& usage, v1::PersistentStatus* out);

  const PersistentStore* const persistent_;
};

// Jobs by kind with their latency histograms (JobMetrics), into a status answer.
void AddJobKinds(const JobMetrics& jobs, v1::GetStatusResponse* response);

// absl::Status -> grpc::Status with the same canonical code.
grpc::Status ToGrpc(const absl::Status& status);

}  // namespace tier::daemon

#endif  // TIER_DAEMON_CONTROL_CONTROL_SERVICE_H_
