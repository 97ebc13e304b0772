// The composition root of tierd: builds the pool, the copy engine, the session machinery and the
// servers from a Config, serves until SIGTERM/SIGINT, then drains and stops in order. It owns the
// parts; it holds no policy of its own.
#ifndef TIER_DAEMON_DAEMON_H_
#define TIER_DAEMON_DAEMON_H_

#include <memory>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "common/version.h"
#include "daemon/config/config.h"
#include "daemon/control/control_acceptor.h"
#include "daemon/control/control_service.h"
#include "daemon/control/health_monitor.h"
#include "daemon/control/systemd_notifier.h"
#include "daemon/jobs/job_executor.h"
#include "daemon/jobs/ring_pollers.h"
#include "daemon/metrics/metrics.h"
#include "daemon/metrics/metrics_collector.h"
#include "daemon/metrics/metrics_exporter.h"
#include "daemon/sessions/session_listener.h"
#include "daemon/sessions/session_registry.h"
#include "daemon/tiers/numa_topology.h"
#include "daemon/tiers/pool_layout.h"
#include "daemon/tiers/tier_manager.h"
#include "engine/copy_engine.h"
#include "storage/host_pool.h"

namespace tier::daemon {

inline constexpr const char* kVersion = kTierVersion;

class Daemon {
 public:
  // Everything up to and including listening on both sockets. The caller has blocked SIGTERM,
  // SIGINT and SIGPIPE in every thread (Run() waits for the first two).
  static absl::StatusOr<std::unique_ptr<Daemon>> Create(const Config& config);
  ~Daemon();

  // Serves until SIGTERM or SIGINT; then drains (in-flight jobs finish) and stops. Returns the
  // process exit status.
  int Run();

 private:
  explicit Daemon(const Config& config);
  absl::Status Init();  // the stages below, in order
  absl::Status StartEngine();
  absl::Status CreatePool();
  absl::Status StartTiers(uint64_t capacity);  // capacity: the pool's bytes and the NVMe tier's
  absl::Status StartSessions(const SessionLimits& limits, gid_t gid);
  absl::Status StartControl(const SessionLimits& limits, gid_t gid);
  // GET /metrics on metrics_listen, when set.
  absl::Status StartMetrics();
  std::string AdminTokenFile() const;  // admin_token_file, or <socket>.admin-token
  // Stops admitting jobs and waits up to timeout_ms (0: unbounded) for in-flight ones.
  uint64_t Drain(uint32_t timeout_ms);
  void Shutdown();

  const Config config_;
  const uint64_t started_ms_;
  const double started_unix_s_;  // for tierd_start_time_seconds
  double pool_pin_seconds_ = 0;   // creating and pinning the host pool
  uint32_t max_connections_ = 0;  // max_connections, as far as RLIMIT_NOFILE allows
  DaemonMetrics metrics_;
  PoolLayout pool_layout_;         // how the pool is split over NUMA nodes
  std::vector<GpuLocation> gpus_;  // where the engine's GPUs are
  std::unique_ptr<storage::HostPool> pool_;
  std::unique_ptr<storage::SpillStore> spill_store_;  // NVMe tier; null without one
  std::unique_ptr<TierManager> tiers_;  // the pool and the NVMe tier behind the executor
  std::unique_ptr<engine::CopyEngine> engine_;
  std::unique_ptr<PersistentJournal> journal_;  // persistent objects on NVMe; null without NVMe
  std::unique_ptr<PersistentStore> persistent_;  // named objects that outlive sessions
  std::unique_ptr<JobExecutor> executor_;
  std::unique_ptr<SessionRegistry> registry_;
  std::unique_ptr<RingPollers> pollers_;  // one per GPU and a default one
  std::unique_ptr<SessionListener> listener_;
  std::unique_ptr<HealthMonitor> health_;
  std::unique_ptr<ControlService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ControlAcceptor> control_acceptor_;  // accepts for server_, bounded per uid
  std::shared_ptr<MetricsCollector> metrics_collector_;
  std::unique_ptr<MetricsExporter> metrics_exporter_;  // null unless metrics_listen is set
  SystemdNotifier notifier_;
  bool shut_down_ = false;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_DAEMON_H_
