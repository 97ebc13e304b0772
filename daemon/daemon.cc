#include "daemon/daemon.h"

#include <grp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/admin_token.h"
#include "common/log.h"
#include "common/status.h"
#include "common/unix_socket.h"
#include "engine/engine_factory.h"
#include "engine/gpu_pci.h"
#include "storage/faulty_io_queue.h"

namespace tier::daemon {
namespace {

absl::Status MakeParentDir(const std::string& path) {
  std::error_code error;
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) return absl::OkStatus();
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", dir.string(), ": ", error.message()));
  }
  return absl::OkStatus();
}

absl::Status MakeDir(const std::string& path) {
  std::error_code error;
  std::filesystem::create_directories(path, error);
  if (error) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create ", path, ": ", error.message()));
  }
  return absl::OkStatus();
}

// A second daemon on the same socket would steal it from the first: refuse to start instead.
absl::Status CheckNotRunning(const std::string& socket_path) {
  if (::access(socket_path.c_str(), F_OK) != 0) return absl::OkStatus();
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", socket_path.c_str());
  bool live = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  if (live) {
    return absl::FailedPreconditionError(
        absl::StrCat("another tierd is serving ", socket_path));
  }
  return absl::OkStatus();
}

absl::StatusOr<gid_t> ResolveGroup(const std::string& name) {
  if (name.empty()) return static_cast<gid_t>(-1);
  group* entry = ::getgrnam(name.c_str());
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("no group '", name, "'"));
  return entry->gr_gid;
}

// Every session holds a few descriptors (its connection, ring and doorbells), and so does every
// gRPC connection: take the hard limit, not the soft one (often 1024). Returns the session
// connections the descriptors allow: max_connections, or fewer (said once) when RLIMIT_NOFILE
// cannot serve that many and keep a reserve. Session connections must never use the process's
// last descriptors: gRPC's server does not survive running out (a client flooding the session
// socket made tierd die inside gRPC's method handler under UBSan), and neither would spill I/O.
uint32_t ConnectionsTheDescriptorsAllow(uint32_t max_connections) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return max_connections;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &limit);
    (void)::getrlimit(RLIMIT_NOFILE, &limit);
  }
  if (limit.rlim_cur == RLIM_INFINITY) return max_connections;
  constexpr uint64_t kPerConnection = 4;  // connection, ring memfd, two doorbells
  constexpr uint64_t kReserve = 256;      // gRPC, spill files, epoll, logs
  const uint64_t reserve = std::min<uint64_t>(kReserve, limit.rlim_cur / 2);
  const uint64_t allowed =
      std::max<uint64_t>(1, (limit.rlim_cur - reserve) / kPerConnection);
  if (allowed >= max_connections) return max_connections;
  LogWarning("max_connections lowered from ", max_connections, " to ", allowed,
             ": RLIMIT_NOFILE is ", limit.rlim_cur, ", a session holds up to ", kPerConnection,
             " descriptors and ", reserve,
             " are kept for gRPC, spill files and logs; raise LimitNOFILE= to serve more");
  return static_cast<uint32_t>(allowed);
}

// max_mapped_bytes = 0: a quarter of the node's memory. Client memory mapped into tierd costs it
// page tables (1/512 of the bytes, 4 KiB pages), and registrations of the same memory add up.
uint64_t DefaultMaxMappedBytes() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str(), "MemTotal: %llu kB", &kib) == 1) {
      return std::max<uint64_t>(uint64_t{kib} * 1024 / 4, uint64_t{1} << 30);
    }
  }
  return uint64_t{64} << 30;
}

// What each part is built from: the typed config, translated in one place per part.
engine::EngineOptions EngineOptionsOf(const Config& config) {
  engine::EngineOptions options;
  options.kind = config.engine;
  options.host_threads = static_cast<int>(config.host_engine_threads);
  options.copy_delay_us = config.copy_delay_us;
  options.lane_wait_warn_ms = config.lane_wait_warn_ms;
  options.gpu_poll_spin_us = config.gpu_poll_spin_us;
  options.gpu_lane_window_bytes = config.gpu_lane_window_bytes;
  return options;
}

// Quotas count a session's bytes in every tier: by default, all the daemon can hold (`capacity`).
SessionLimits SessionLimitsOf(const Config& config, uint64_t capacity) {
  const uint64_t quota_cap = config.max_quota_bytes ? config.max_quota_bytes : capacity;
  SessionLimits limits;
  limits.default_quota_bytes =
      std::min(config.default_quota_bytes ? config.default_quota_bytes : capacity, quota_cap);
  limits.max_quota_bytes = quota_cap;
  limits.default_ring_entries = config.ring_entries;
  limits.max_sessions = config.max_sessions;
  limits.attach_timeout_ms = config.attach_timeout_ms;
  limits.client.max_sessions_per_uid = config.max_sessions_per_uid;
  limits.client.max_buffers_per_session = config.max_buffers_per_session;
  limits.client.max_buffers_per_uid = config.max_buffers_per_uid;
  limits.client.max_buffers = config.max_buffers;
  limits.client.max_mapped_bytes_per_session = config.max_mapped_bytes_per_session;
  limits.client.max_mapped_bytes_per_uid = config.max_mapped_bytes_per_uid;
  limits.client.max_mapped_bytes =
      config.max_mapped_bytes ? config.max_mapped_bytes : DefaultMaxMappedBytes();
  limits.client.max_reserved_bytes_per_session = config.max_reserved_bytes_per_session;
  limits.client.max_reserved_bytes_per_uid = config.max_reserved_bytes_per_uid;
  return limits;
}

storage::SpillStoreOptions SpillStoreOptionsOf(const Config& config, const storage::HostPool& pool) {
  storage::SpillStoreOptions spill;
  spill.directories = config.spill_dirs;
  spill.file_bytes = config.spill_bytes;
  spill.io_bytes = config.spill_io_bytes;
  spill.queue_depth = config.spill_queue_depth;
  spill.io_queue = config.spill_io;
  // A tierd restarted right after a crash finds its predecessor's spill files still locked for a
  // moment (their io_uring goes asynchronously): wait, bounded, rather than fail the restart.
  spill.lock_wait_ms = 30000;
  spill.registered_buffers = {storage::IoBuffer{pool.base(), pool.bytes()}};
  // The persistent journal's writes go through the store (daemon/persistent/journal_file.h),
  // from staging memory registered with its queue like the pool.
  spill.staging_bytes = 16 << 20;
  if (!config.spill_inject_faults.rules.empty()) {
    LogWarning("TEST ONLY: spill I/O fault injection on: ", config.spill_inject_faults.text);
    // The spill files alone (registered first, one per directory): not the persistent journal,
    // which writes through the same queue.
    spill.wrap_io_queue = [rules = config.spill_inject_faults.rules,
                           files = static_cast<int>(config.spill_dirs.size())](
                              std::unique_ptr<storage::IoQueue> inner) {
      auto faulty = std::make_unique<storage::FaultyIoQueue>(std::move(inner));
      for (storage::FaultRule rule : rules) {
        if (rule.file < 0) {
          rule.file = 0;
          rule.file_count = files;
        }
        faulty->AddRule(rule);
      }
      return std::unique_ptr<storage::IoQueue>(std::move(faulty));
    };
  }
  return spill;
}

// Persistent objects: a share of what the daemon holds per uid and for all, unless set.
PersistentLimits PersistentLimitsOf(const Config& config, uint64_t capacity) {
  return PersistentLimits{
      config.persistent_quota_bytes_per_uid ? config.persistent_quota_bytes_per_uid
                                            : capacity / 16,
      config.persistent_max_bytes ? config.persistent_max_bytes : capacity / 4,
      config.persistent_max_objects_per_uid, config.persistent_max_objects};
}

void LogGpus(const std::vector<GpuLocation>& gpus) {
  for (const GpuLocation& gpu : gpus) {
    LogInfo("GPU ", gpu.device, ": PCI ", gpu.pci_bus_id.empty() ? "?" : gpu.pci_bus_id,
            gpu.pci_root.empty() ? "" : absl::StrCat(" under ", gpu.pci_root), ", NUMA node ",
            gpu.numa_node < 0 ? "unknown" : absl::StrCat(gpu.numa_node),
            gpu.problem.empty() ? "" : absl::StrCat(" (", gpu.problem, ")"));
  }
}

void LogPool(const storage::HostPool& pool, uint64_t took_ns, absl::string_view engine,
             const PoolLayout& layout) {
  const storage::PoolSetup& setup = pool.setup();
  LogInfo("host pool: ", pool.bytes() >> 20, " MiB ",
          pool.registered() ? "registered with the GPU" : (pool.locked() ? "mlocked" : "pageable"),
          " in ", took_ns / 1000000, " ms (populated by ", setup.threads, " threads in ",
          setup.populate_ns / 1000000, " ms, ", setup.huge_bytes >> 20,
          " MiB in huge pages; mlock ", setup.lock_ns / 1000000, " ms); engine: ", engine);
  for (const storage::PoolPartUsage& part : pool.PartUsage()) {
    LogInfo("host pool part at ", part.offset >> 20, " MiB: ", part.capacity_bytes >> 20,
            " MiB, ", part.numa_node < 0 ? "not bound" : absl::StrCat("NUMA node ", part.numa_node));
  }
  LogInfo("host pool layout: ", layout.summary);
}


}  // namespace

Daemon::Daemon(const Config& config)
    : config_(config), started_ms_(MonotonicMs()),
      started_unix_s_(std::chrono::duration<double>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count()) {}

Daemon::~Daemon() { Shutdown(); }

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Create(const Config& config) {
  std::unique_ptr<Daemon> daemon(new Daemon(config));
  if (absl::Status status = daemon->Init(); !status.ok()) return status;
  return daemon;
}

absl::Status Daemon::Init() {
  if (absl::Status s = CheckNotRunning(config_.socket_path); !s.ok()) return s;
  max_connections_ = ConnectionsTheDescriptorsAllow(config_.max_connections);
  absl::StatusOr<gid_t> gid = ResolveGroup(config_.socket_group);
  if (!gid.ok()) return gid.status();
  // The engine first: a GPU engine must exist before the pool is registered with it, and where
  // its GPUs are decides how the pool is split.
  if (absl::Status s = StartEngine(); !s.ok()) return s;
  if (absl::Status s = CreatePool(); !s.ok()) return s;
  const uint64_t capacity = pool_->bytes() + config_.spill_bytes * config_.spill_dirs.size();
  if (absl::Status s = StartTiers(capacity); !s.ok()) return s;
  const SessionLimits limits = SessionLimitsOf(config_, capacity);
  if (absl::Status s = StartSessions(limits, *gid); !s.ok()) return s;
  if (absl::Status s = StartControl(limits, *gid); !s.ok()) return s;
  LogInfo("tierd ", kVersion, " serving ", config_.socket_path, " (sessions on ",
          config_.session_socket_path, ")");
  return absl::OkStatus();
}

absl::Status Daemon::StartEngine() {
  absl::StatusOr<std::unique_ptr<engine::CopyEngine>> engine =
      engine::MakeCopyEngine(EngineOptionsOf(config_));
  if (!engine.ok()) return engine.status();
  engine_ = *std::move(engine);
  if (config_.copy_delay_us > 0) {
    LogWarning("delay injection on: every copy waits ", config_.copy_delay_us, " us (test only)");
  }
  return absl::OkStatus();
}

// One part of the pool per NUMA node with GPUs (or as pool_numa lists), each part's memory on
// its node, each GPU's offloads in its local part.
absl::Status Daemon::CreatePool() {
  const NumaTopology topology =
      NumaTopology::Read(config_.topology_sysfs_root, engine::GpuPciBusIds(engine_->name()));
  LogGpus(topology.gpus());
  absl::StatusOr<PoolLayout> layout =
      PlanPoolLayout(config_.pool_numa, config_.pool_numa_node, topology);
  if (!layout.ok()) return layout.status();
  pool_layout_ = *std::move(layout);
  gpus_ = topology.gpus();
  for (const std::string& warning : pool_layout_.warnings) LogWarning(warning);

  const uint64_t start_ns = MonotonicNs();
  storage::HostPoolOptions pool_options;
  pool_options.bytes = config_.pool_bytes;
  pool_options.lock = config_.pool_lock;
  pool_options.parts = pool_layout_.PartOptions();
  absl::StatusOr<std::unique_ptr<storage::HostPool>> pool = storage::HostPool::Create(pool_options);
  if (!pool.ok()) return pool.status();
  pool_ = *std::move(pool);
  if (engine_->name() != "host") {
    const uint64_t register_start_ns = MonotonicNs();
    if (absl::Status s = engine_->RegisterPool(pool_->base(), pool_->bytes()); !s.ok()) return s;
    pool_->set_registered(true, MonotonicNs() - register_start_ns);
  }
  pool_->set_setup_total_ns(MonotonicNs() - start_ns);
  pool_pin_seconds_ = static_cast<double>(pool_->setup().total_ns) / 1e9;
  LogPool(*pool_, MonotonicNs() - start_ns, engine_->name(), pool_layout_);
  return absl::OkStatus();
}

// The NVMe tier (when spill_bytes is set), the tiers over pool and NVMe, and the persistent
// objects with their journal (restored here, before any session).
absl::Status Daemon::StartTiers(uint64_t capacity) {
  if (config_.spill_bytes > 0) {
    for (const std::string& dir : config_.spill_dirs) {
      if (absl::Status s = MakeDir(dir); !s.ok()) return s;
    }
    absl::StatusOr<std::unique_ptr<storage::SpillStore>> store =
        storage::SpillStore::Create(SpillStoreOptionsOf(config_, *pool_));
    if (!store.ok()) return store.status();
    spill_store_ = *std::move(store);
    LogInfo("NVMe tier: ", config_.spill_bytes >> 20, " MiB in ", spill_store_->file_path(0),
            ", I/O through ", std::string(spill_store_->io_queue_name()), "; spill above ",
            config_.spill_high_pct, "% of the host pool, down to ", config_.spill_low_pct, "%");
  }
  SpillerOptions spiller;
  spiller.watermarks = Watermarks{config_.spill_high_pct, config_.spill_low_pct};
  spiller.max_prefetches = config_.spill_prefetch;
  tiers_ = std::make_unique<TierManager>(*pool_, spill_store_.get(), spiller,
                                         pool_layout_.part_of_gpu);
  tiers_->Start();
  const PersistentLimits persistent_limits = PersistentLimitsOf(config_, capacity);
  if (spill_store_ != nullptr) {
    // Written through to the first spill directory, they come back after a restart
    // (daemon/persistent/persistent_journal.h); the journal's disk is bounded apart from
    // spill_bytes.
    JournalOptions journal_options;
    journal_options.max_bytes = config_.persistent_journal_max_bytes
                                    ? config_.persistent_journal_max_bytes
                                    : 2 * persistent_limits.max_bytes + (64 << 20);
    absl::StatusOr<std::unique_ptr<PersistentJournal>> journal =
        PersistentJournal::Open(config_.spill_dirs.front() + "/persistent", *spill_store_,
                                journal_options);
    if (!journal.ok()) return journal.status();
    journal_ = *std::move(journal);
  }
  persistent_ = std::make_unique<PersistentStore>(*tiers_, persistent_limits, journal_.get());
  if (journal_ != nullptr) {
    const size_t records = journal_->usage().live_records;
    const size_t restored = persistent_->Restore();
    LogInfo("persistent objects: ", restored, " of ", records, " restored from ",
            journal_->dir(), " (journal ", journal_->usage().file_bytes >> 20, " of at most ",
            journal_->usage().max_bytes >> 20, " MiB)");
  }
  return absl::OkStatus();
}

// The job path (executor, ring pollers) and the session machinery (registry, session socket).
absl::Status Daemon::StartSessions(const SessionLimits& limits, gid_t gid) {
  executor_ = std::make_unique<JobExecutor>(*tiers_, *engine_, metrics_, persistent_.get());
  registry_ = std::make_unique<SessionRegistry>(limits, *executor_, *engine_);
  pollers_ = std::make_unique<RingPollers>(*registry_, *executor_, config_.poll_idle_us,
                                           static_cast<int>(gpus_.size()));
  if (absl::Status s = pollers_->Start(); !s.ok()) return s;
  registry_->set_on_change([pollers = pollers_.get()] { pollers->WakeAll(); });

  for (const std::string* path : {&config_.socket_path, &config_.session_socket_path}) {
    if (absl::Status s = MakeParentDir(*path); !s.ok()) return s;
  }
  listener_ = std::make_unique<SessionListener>(
      *registry_, *engine_,
      ListenerLimits{max_connections_, config_.max_connections_per_uid,
                     config_.attach_timeout_ms},
      persistent_.get());
  return listener_->Start(config_.session_socket_path, config_.socket_mode, gid);
}

// Health, the metrics endpoint, and the gRPC control API behind its own acceptor.
absl::Status Daemon::StartControl(const SessionLimits& limits, gid_t gid) {
  ControlContext context{kVersion, std::string(engine_->name()), config_.session_socket_path,
                         config_.attach_timeout_ms, started_ms_, "", AdminTokenFile(),
                         pool_layout_, gpus_};
  if (absl::Status s = MakeParentDir(context.admin_token_path); !s.ok()) return s;
  context.max_mapped_bytes = limits.client.max_mapped_bytes;
  control_acceptor_ = std::make_unique<ControlAcceptor>(config_.max_connections_per_uid);
  context.peers = control_acceptor_.get();
  absl::StatusOr<std::string> token = WriteAdminToken(context.admin_token_path);
  if (!token.ok()) return token.status();
  context.admin_token = *std::move(token);
  health_ = std::make_unique<HealthMonitor>(
      metrics_, [pollers = pollers_.get()] { return pollers->last_heartbeat_ms(); },
      config_.health_stall_ms,
      [engine = engine_.get()] { return engine->UnticketedBehindClients(); });
  // Before the control API serves: status reads the exporter's state.
  if (absl::Status s = StartMetrics(); !s.ok()) return s;
  context.metrics_state = [this] {
    return metrics_exporter_ == nullptr ? std::string() : metrics_exporter_->state();
  };
  context.pollers = [pollers = pollers_.get()] { return pollers->Status(); };
  service_ = std::make_unique<ControlService>(
      context, *registry_, *pool_, tiers_->nvme(), *engine_, metrics_, *health_,
      [this](uint32_t timeout_ms) { return Drain(timeout_ms); }, persistent_.get());
  // No listening port of gRPC's own: the acceptor takes the control socket's connections, counts
  // them per uid and hands them over (daemon/control/control_acceptor.h).
  grpc::ServerBuilder builder;
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve gRPC on ", config_.socket_path));
  }
  return control_acceptor_->Start(config_.socket_path, config_.socket_mode, gid, server_.get());
}

std::string Daemon::AdminTokenFile() const {
  return config_.admin_token_file.empty() ? AdminTokenPath(config_.socket_path)
                                          : config_.admin_token_file;
}

absl::Status Daemon::StartMetrics() {
  if (config_.metrics_listen.empty()) return absl::OkStatus();
  metrics_collector_ = std::make_shared<MetricsCollector>(
      MetricsSources{metrics_, *pool_, tiers_->nvme(), *registry_, *engine_, *health_,
                     persistent_.get()},
      BuildInfo{kVersion, std::string(engine_->name()), started_unix_s_, pool_pin_seconds_,
                config_.metrics_uid_labels});
  // (A port it cannot listen on now is not fatal: the exporter keeps trying and says so.)
  absl::StatusOr<std::unique_ptr<MetricsExporter>> exporter =
      MetricsExporter::Start(config_.metrics_listen, metrics_collector_);
  if (!exporter.ok()) return exporter.status();
  metrics_exporter_ = *std::move(exporter);
  return absl::OkStatus();
}

uint64_t Daemon::Drain(uint32_t timeout_ms) {
  const auto deadline = timeout_ms == 0 ? std::chrono::steady_clock::time_point::max()
                                        : std::chrono::steady_clock::now() +
                                              std::chrono::milliseconds(timeout_ms);
  // First the clients take back what they offloaded: they see the drain in their rings, offload
  // no more, and reload or free what they have (a training step's activations come back within
  // the step), so a restart costs no step. Until every session holds nothing, or none has given
  // anything back for drain_handback_idle_ms (a client that keeps its objects, idle or frozen,
  // does not hold the restart up for everyone), or the deadline.
  registry_->SetDraining();
  const uint64_t started = MonotonicMs();
  uint64_t held = registry_->SessionObjects();
  uint64_t last_given = started;
  while (held > 0 && std::chrono::steady_clock::now() < deadline &&
         MonotonicMs() - last_given < config_.drain_handback_idle_ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // once, at shutdown
    const uint64_t now_held = registry_->SessionObjects();
    if (now_held < held) last_given = MonotonicMs();
    held = now_held;
  }
  if (held > 0) {
    LogWarning("drain: sessions still hold ", held, " objects after ", MonotonicMs() - started,
               " ms (none given back for ", MonotonicMs() - last_given, " ms); they are lost");
  } else {
    LogInfo("drain: every session gave its objects back in ", MonotonicMs() - started, " ms");
  }
  // Then nothing more is taken, and what is in flight finishes.
  registry_->SetRefusing();
  return metrics_.jobs_in_flight.AwaitZero(deadline);
}

int Daemon::Run() {
  notifier_.Ready(absl::StrCat("serving ", config_.socket_path, ", pool ", pool_->bytes() >> 20,
                               " MiB, engine ", engine_->name()));
  // Healthy while every ring poller goes round: a wedged poller stops the pings and systemd
  // restarts tierd (clients then fail their jobs with UNAVAILABLE rather than hang).
  notifier_.StartWatchdog([this] { return MonotonicMs() - pollers_->last_heartbeat_ms() < 5000; });
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  int signal_number = 0;
  while (sigwait(&signals, &signal_number) != 0 || (signal_number != SIGTERM && signal_number != SIGINT)) {
  }
  LogInfo("signal ", signal_number, ": draining");
  notifier_.Stopping();
  // Jobs clients pushed before the signal are in-flight work too: let the pollers take what the
  // rings hold now (briefly: a client that keeps pushing does not hold the stop), then refuse.
  pollers_->AwaitIdlePass(std::chrono::steady_clock::now() + std::chrono::seconds(1));
  uint64_t left = Drain(config_.drain_timeout_ms);
  if (left > 0) LogWarning(left, " jobs still in flight after ", config_.drain_timeout_ms, " ms");
  Shutdown();
  LogInfo("tierd stopped");
  return left == 0 ? 0 : 1;
}

void Daemon::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  // Order: stop taking work (sockets, pollers), end sessions (their jobs finish), then the engine.
  // Control calls are short and jobs have drained by now; an idle client channel would otherwise
  // hold the shutdown for the whole deadline (gRPC waits for connections, not only calls).
  if (control_acceptor_) control_acceptor_->Stop();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  // Scrapes read every part below: the exporter stops first.
  metrics_exporter_.reset();
  if (listener_) listener_->Stop();
  if (pollers_) pollers_->Stop();
  if (registry_) registry_->EndAllAndWait();
  // No job runs any more: persistent objects in host memory end with the daemon.
  if (persistent_) persistent_->DropAll();
  if (tiers_) tiers_->Stop();
  if (engine_) engine_->Shutdown();
  ::unlink(config_.socket_path.c_str());
  ::unlink(AdminTokenFile().c_str());
}

}  // namespace tier::daemon
