// tierctl against an in-process fake tierd: a gRPC server with canned answers on a temporary Unix
// socket. Checks the library's rendering and the real binary's output and exit statuses.
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tier.grpc.pb.h"
#include "tierctl/commands.h"

namespace tier::ctl {
namespace {

constexpr uint64_t kGiB = 1ull << 30;

class FakeControl final : public v1::Control::Service {
 public:
  grpc::Status GetVersion(grpc::ServerContext*, const v1::GetVersionRequest*,
                          v1::GetVersionResponse* response) override {
    response->set_version("0.1.0");
    response->set_api_version(1);
    response->set_ring_version(2);
    response->set_engine("host");
    return grpc::Status::OK;
  }

  grpc::Status Health(grpc::ServerContext* context, const v1::HealthRequest*,
                      v1::HealthResponse* response) override {
    std::unique_lock lock(mu_);
    // A stuck daemon: answer only once the test releases it (or the caller gave up).
    cv_.wait(lock, [&] { return !hold_health_ || context->IsCancelled(); });
    response->set_state(state_);
    if (state_ == v1::HealthResponse::NOT_SERVING) response->set_reason("jobs stopped");
    return grpc::Status::OK;
  }

  grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                         v1::GetStatusResponse* response) override {
    response->set_version("0.1.0");
    response->set_engine("host");
    response->set_uptime_ms(3'723'000);
    response->set_state(v1::HealthResponse::SERVING);
    v1::TierStatus* host = response->add_tiers();
    host->set_name("host");
    host->set_capacity_bytes(64 * kGiB);
    host->set_used_bytes(16 * kGiB);
    host->set_free_bytes(48 * kGiB);
    host->set_objects(1234);
    v1::TierStatus* nvme = response->add_tiers();
    nvme->set_name("nvme");
    nvme->set_capacity_bytes(512 * kGiB);
    nvme->set_free_bytes(512 * kGiB);
    response->set_sessions(2);
    response->set_jobs_in_flight(3);
    response->set_jobs_completed(10234);
    response->set_jobs_failed(1);
    response->set_bytes_offloaded(1536 * kGiB);
    response->set_bytes_reloaded(768ull << 20);
    response->set_recent_bandwidth_bytes_per_s(23.4e9);
    response->set_pool_locked(true);
    response->mutable_pool_setup()->set_seconds(0.874);
    response->mutable_pool_setup()->set_populate_seconds(0.6);
    response->mutable_pool_setup()->set_register_seconds(0.27);
    response->mutable_pool_setup()->set_threads(16);
    response->mutable_pool_setup()->set_huge_page_bytes(2 * kGiB);
    // Two sockets: GPU 0 on node 0, GPU 1 on node 1, a part each.
    response->set_pool_layout(
        "2 parts (auto, GPUs on several NUMA nodes): node 0 (GPUs 0); node 1 (GPUs 1)");
    for (int i = 0; i < 2; ++i) {
      v1::PoolPartStatus* part = response->add_pool_parts();
      part->set_part(i);
      part->set_numa_node(i);
      part->set_capacity_bytes(32 * kGiB);
      part->set_used_bytes(i == 0 ? 12 * kGiB : 4 * kGiB);
      part->set_free_bytes(i == 0 ? 20 * kGiB : 28 * kGiB);
      part->set_objects(i == 0 ? 1000 : 234);
      part->add_gpus(i);
      part->set_local_allocations(i == 0 ? 5000 : 4000);
      part->set_remote_allocations(i == 0 ? 0 : 17);
      v1::GpuPlacement* gpu = response->add_gpus();
      gpu->set_device(i);
      gpu->set_pci_bus_id(i == 0 ? "0000:18:00.0" : "0000:af:00.0");
      gpu->set_pci_root(i == 0 ? "pci0000:17" : "pci0000:ae");
      if (i == 0) {  // GPU 1 has not moved enough for a figure yet
        gpu->set_d2h_bytes_per_s(55.2e9);
        gpu->set_h2d_bytes_per_s(53.04e9);
      }
      gpu->set_numa_node(i);
      gpu->set_pool_part(i);
    }
    response->set_buffers(5);
    response->set_client_mapped_bytes(uint64_t{3} << 20);
    response->set_max_mapped_bytes(uint64_t{16} << 30);
    response->set_client_reserved_bytes(uint64_t{180} << 30);
    response->set_metrics("not serving: cannot listen on 10.0.0.1:9477: Address already in use");
    for (auto [device, sessions, age] : {std::tuple{-1, 0u, 120u}, {0, 1u, 3u}, {1, 1u, 0u}}) {
      v1::RingPollerStatus* poller = response->add_ring_pollers();
      poller->set_device(device);
      poller->set_sessions(sessions);
      poller->set_heartbeat_age_ms(age);
    }
    response->set_gpu_lanes(2);
    response->set_spill_io("io_uring");
    response->set_bytes_spilled(3 * kGiB);
    response->set_bytes_fetched(1 * kGiB);
    response->set_spill_bandwidth_bytes_per_s(2.5e9);
    response->set_fetch_bandwidth_bytes_per_s(3.1e9);
    response->set_prefetches(12);
    response->set_bytes_prefetched(768ull << 20);
    response->set_prefetch_hits(10);
    response->set_prefetch_misses(2);
    response->set_checksum_failures(1);
    for (int i = 0; i < 2; ++i) {
      v1::SpillFileStatus* file = response->add_spill_files();
      file->set_directory(absl::StrCat("/nvme", i, "/tierd"));
      file->set_path(absl::StrCat("/nvme", i, "/tierd/tierd.spill"));
      file->set_direct_io(i == 0);
      file->set_capacity_bytes(256 * kGiB);
      file->set_used_bytes(i == 0 ? 64 * kGiB : 0);
      file->set_records(i == 0 ? 1024 : 0);
      file->set_bytes_written(i == 0 ? 2 * kGiB : 1 * kGiB);
      file->set_bytes_read(i == 0 ? 512ull << 20 : 512ull << 20);
      file->set_checksum_failures(i);
    }
    return grpc::Status::OK;
  }

  grpc::Status ListSessions(grpc::ServerContext*, const v1::ListSessionsRequest*,
                            v1::ListSessionsResponse* response) override {
    v1::SessionInfo* trainer = response->add_sessions();
    trainer->set_session_id(7);
    trainer->set_name("llama \"rank0\"");
    trainer->set_attached(true);
    trainer->set_pid(4242);
    trainer->set_uid(1000);
    trainer->set_gid(1000);
    trainer->set_quota_bytes(32 * kGiB);
    trainer->set_used_bytes(12 * kGiB + 512 * (1ull << 20));
    trainer->set_objects(96);
    trainer->set_buffers(4);
    trainer->set_jobs_in_flight(3);
    trainer->set_jobs_completed(10000);
    trainer->set_jobs_failed(1);
    trainer->set_bytes_offloaded(1024 * kGiB);
    trainer->set_bytes_reloaded(768ull << 20);
    trainer->set_age_ms(3'723'000);
    trainer->set_mapped_bytes(uint64_t{8} << 20);
    trainer->set_reserved_bytes(uint64_t{316} << 30);
    v1::LaneInfo* d2h = trainer->add_lanes();
    d2h->set_gpu(0);
    d2h->set_direction("D2H");
    d2h->set_queued(2);
    d2h->set_active(true);
    d2h->set_blocked_on("the client's ticket");
    d2h->set_waiting_ticket(41);
    d2h->set_client_ticket(40);
    d2h->set_waiting_ms(12'000);
    v1::LaneInfo* h2d = trainer->add_lanes();
    h2d->set_gpu(0);
    h2d->set_direction("H2D");
    h2d->set_in_flight(1);
    h2d->set_queued(3);
    h2d->set_blocked_on("delay injection");  // and not served: shown as such
    v1::SessionInfo* pending = response->add_sessions();
    pending->set_session_id(12);
    pending->set_quota_bytes(8 * kGiB);
    pending->set_age_ms(1500);
    return grpc::Status::OK;
  }

  grpc::Status Drain(grpc::ServerContext*, const v1::DrainRequest* request,
                     v1::DrainResponse* response) override {
    std::lock_guard lock(mu_);
    drain_timeouts_.push_back(request->timeout_ms());
    if (refuse_drain_) return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "drain needs root");
    response->set_jobs_in_flight(jobs_left_after_drain_);
    return grpc::Status::OK;
  }

  void HoldHealth(bool hold) {
    {
      std::lock_guard lock(mu_);
      hold_health_ = hold;
    }
    cv_.notify_all();
  }
  void SetState(v1::HealthResponse::State state) { std::lock_guard lock(mu_); state_ = state; }
  void SetJobsLeftAfterDrain(uint64_t jobs) {
    std::lock_guard lock(mu_);
    jobs_left_after_drain_ = jobs;
  }
  void RefuseDrain() { std::lock_guard lock(mu_); refuse_drain_ = true; }
  std::vector<uint32_t> drain_timeouts() { std::lock_guard lock(mu_); return drain_timeouts_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_health_ = false;
  v1::HealthResponse::State state_ = v1::HealthResponse::SERVING;
  uint64_t jobs_left_after_drain_ = 0;
  bool refuse_drain_ = false;
  std::vector<uint32_t> drain_timeouts_;
};

struct Outcome {
  int exit_code = -1;
  std::string out;
  std::string err;
};

class TierctlCommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/tierctl_test_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    socket_path_ = dir_ + "/tierd.sock";
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_path_, grpc::InsecureServerCredentials());
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }

  void TearDown() override {
    fake_.HoldHealth(false);
    if (server_) server_->Shutdown();
    ::unlink(socket_path_.c_str());
    ::unlink((dir_ + "/stderr").c_str());
    ::rmdir(dir_.c_str());
  }

  // Runs the library's command the way main() does, capturing both streams.
  Outcome RunInProcess(const std::string& command, bool json) {
    auto stub = ConnectControl(socket_path_);
    std::ostringstream out, err;
    CommandContext ctx;
    ctx.stub = stub.get();
    ctx.socket_path = socket_path_;
    ctx.json = json;
    ctx.out = &out;
    ctx.err = &err;
    Outcome run;
    run.exit_code = RunCommand(command, ctx);
    run.out = out.str();
    run.err = err.str();
    return run;
  }

  // Runs the real binary: `env` goes before it, `args` after it.
  Outcome RunBinary(const std::string& args, const std::string& env = "") {
    const std::string err_path = dir_ + "/stderr";
    const std::string command = env + " " + TIERCTL_BIN + " " + args + " 2>" + err_path;
    Outcome run;
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) return run;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof(buf), pipe)) > 0;) run.out.append(buf, n);
    const int status = ::pclose(pipe);
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream err_file(err_path);
    run.err.assign(std::istreambuf_iterator<char>(err_file), std::istreambuf_iterator<char>());
    return run;
  }

  std::string SocketArg() const { return "--socket " + socket_path_; }

  FakeControl fake_;
  std::unique_ptr<grpc::Server> server_;
  std::string dir_;
  std::string socket_path_;
};

google::protobuf::Struct ParseJson(const std::string& text) {
  google::protobuf::Struct parsed;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(text, &parsed).ok()) << text;
  return parsed;
}

std::set<std::string> Keys(const google::protobuf::Struct& object) {
  std::set<std::string> keys;
  for (const auto& [key, value] : object.fields()) keys.insert(key);
  return keys;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST_F(TierctlCommandsTest, StatusRendersFieldsAndTiers) {
  const Outcome run = RunInProcess("status", false);
  ASSERT_EQ(run.exit_code, kExitOk) << run.err;
  EXPECT_EQ(run.err, "");
  EXPECT_EQ(run.out,
            "Version:           0.1.0 (engine host)\n"
            "State:             serving\n"
            "Uptime:            1h02m03s\n"
            "Host pool pinned:  yes, in 0.87 s (populate 0.60 s by 16 threads, GPU registration "
            "0.27 s; 2.0 GiB in huge pages)\n"
            "Sessions:          2\n"
            "Jobs:              3 in flight, 10234 completed, 1 failed\n"
            "Offloaded:         1.5 TiB\n"
            "Reloaded:          768.0 MiB\n"
            "Recent bandwidth:  23.4 GB/s\n"
            "Client memory:     5 buffers mapped (3.0 MiB of host memory, 180.0 GiB of GPU "
            "address space reserved), 2 GPU lanes, 0 releases pending\n"
            "Ring pollers:      default 0, GPU 0 1, GPU 1 1 sessions; oldest pass 120 ms ago\n"
            "Metrics:           not serving: cannot listen on 10.0.0.1:9477: Address already in use\n"
            "NVMe I/O:          io_uring\n"
            "Spilled:           3.0 GiB (now 2.5 GB/s)\n"
            "Fetched:           1.0 GiB (now 3.1 GB/s)\n"
            "Prefetch:          12 objects, 768.0 MiB; 10 hits, 2 misses\n"
            "NVMe errors:       0 write, 0 read, 1 checksum\n"
            "\n"
            "TIER   CAPACITY      USED       FREE    USE  OBJECTS\n"
            "host   64.0 GiB  16.0 GiB   48.0 GiB  25.0%     1234\n"
            "nvme  512.0 GiB       0 B  512.0 GiB   0.0%        0\n");
}

TEST_F(TierctlCommandsTest, PoolsIsTheTiersThenTheHostPoolsPartsAndTheGpus) {
  const Outcome run = RunInProcess("pools", false);
  ASSERT_EQ(run.exit_code, kExitOk) << run.err;
  EXPECT_EQ(run.out,
            "TIER   CAPACITY      USED       FREE    USE  OBJECTS\n"
            "host   64.0 GiB  16.0 GiB   48.0 GiB  25.0%     1234\n"
            "nvme  512.0 GiB       0 B  512.0 GiB   0.0%        0\n"
            "\n"
            "Host pool: 2 parts (auto, GPUs on several NUMA nodes): node 0 (GPUs 0); node 1 "
            "(GPUs 1)\n"
            "PART  NODE  CAPACITY      USED      FREE    USE  OBJECTS  GPUS  LOCAL  REMOTE  ANY\n"
            "   0     0  32.0 GiB  12.0 GiB  20.0 GiB  37.5%     1000  0      5000       0    0\n"
            "   1     1  32.0 GiB   4.0 GiB  28.0 GiB  12.5%      234  1      4000      17    0\n"
            "\n"
            "GPU  PCI           ROOT        NODE  PART   D2H LINK   H2D LINK\n"
            "  0  0000:18:00.0  pci0000:17     0     0  55.2 GB/s  53.0 GB/s\n"
            "  1  0000:af:00.0  pci0000:ae     1     1          -          -\n");
}

TEST_F(TierctlCommandsTest, PoolsJsonHasTheTiersPartsAndGpus) {
  const Outcome run = RunInProcess("pools", true);
  ASSERT_EQ(run.exit_code, kExitOk) << run.err;
  const google::protobuf::Struct parsed = ParseJson(run.out);
  EXPECT_EQ(Keys(parsed), (std::set<std::string>{"tiers", "pool_layout", "pool_parts", "gpus"}));
  const auto& parts = parsed.fields().at("pool_parts").list_value();
  ASSERT_EQ(parts.values_size(), 2);
  const auto& second = parts.values(1).struct_value().fields();
  EXPECT_EQ(second.at("numa_node").number_value(), 1);
  EXPECT_EQ(second.at("remote_allocations").number_value(), 17);
  EXPECT_EQ(second.at("gpus").list_value().values(0).number_value(), 1);
  const auto& gpus = parsed.fields().at("gpus").list_value();
  ASSERT_EQ(gpus.values_size(), 2);
  EXPECT_EQ(gpus.values(1).struct_value().fields().at("pci_bus_id").string_value(),
            "0000:af:00.0");
}

TEST_F(TierctlCommandsTest, SpillShowsOneRowPerSpillDirectory) {
  const Outcome run = RunInProcess("spill", false);
  ASSERT_EQ(run.exit_code, kExitOk) << run.err;
  EXPECT_EQ(run.out,
            "NVMe I/O: io_uring\n"
            "DIRECTORY     I/O        CAPACITY      USED    USE  RECORDS  WRITTEN       READ  "
            "WRITE-ERR  READ-ERR  CRC-ERR\n"
            "/nvme0/tierd  direct    256.0 GiB  64.0 GiB  25.0%     1024  2.0 GiB  512.0 MiB  "
            "        0         0        0\n"
            "/nvme1/tierd  buffered  256.0 GiB       0 B   0.0%        0  1.0 GiB  512.0 MiB  "
            "        0         0        1\n");
}

TEST_F(TierctlCommandsTest, SpillJsonAndNoNvmeTier) {
  const Outcome run = RunInProcess("spill", true);
  ASSERT_EQ(run.exit_code, kExitOk) << run.err;
  const google::protobuf::Struct parsed = ParseJson(run.out);
  EXPECT_EQ(Keys(parsed), (std::set<std::string>{"spill_io", "spill_files"}));
  EXPECT_EQ(parsed.fields().at("spill_io").string_value(), "io_uring");
  const auto& files = parsed.fields().at("spill_files").list_value();
  ASSERT_EQ(files.values_size(), 2);
  const auto& first = files.values(0).struct_value().fields();
  EXPECT_EQ(first.at("path").string_value(), "/nvme0/tierd/tierd.spill");
  EXPECT_TRUE(first.at("direct_io").bool_value());
  EXPECT_EQ(first.at("used_bytes").number_value(), 64.0 * kGiB);
  EXPECT_EQ(first.at("records").number_value(), 1024);

  std::ostringstream none;
  RenderSpill(v1::GetStatusResponse(), false, none);
  EXPECT_EQ(none.str(), "No NVMe tier (spill_bytes = 0).\n");
  std::ostringstream none_json;
  RenderSpill(v1::GetStatusResponse(), true, none_json);
  EXPECT_EQ(none_json.str(), "{\"spill_io\":\"\",\"spill_files\":[]}\n");
}

TEST_F(TierctlCommandsTest, ClientsShowsOneAlignedRowPerSession) {
  const Outcome run = RunInProcess("clients", false);
  ASSERT_EQ(run.exit_code, kExitOk) << run.err;
  // A pending session has no peer credentials yet: PID and UID show "-".
  EXPECT_EQ(run.out,
            "ID  NAME            PID   UID  ATTACHED     QUOTA      USED  OBJECTS  BUFFERS  "
            "IN-FLIGHT  COMPLETED  FAILED  OFFLOADED   RELOADED       AGE  "
            "WAITING ON\n"
            " 7  llama \"rank0\"  4242  1000  yes       32.0 GiB  12.5 GiB       96        4  "
            "        3      10000       1    1.0 TiB  768.0 MiB  1h02m03s  "
            "client: gpu0 D2H ticket 41 (at 40) 12s; tierd: gpu0 H2D 3 queued, for delay "
            "injection (NOT SERVED)\n"
            "12  -                 -     -  no         8.0 GiB       0 B        0        0  "
            "        0          0       0        0 B        0 B        1s  -\n");
  EXPECT_EQ(RunInProcess("sessions", false).out, run.out);
}

TEST_F(TierctlCommandsTest, EmptySessionList) {
  std::ostringstream out;
  RenderSessions(v1::ListSessionsResponse(), false, out);
  EXPECT_EQ(out.str(), "No sessions.\n");
  std::ostringstream json;
  RenderSessions(v1::ListSessionsResponse(), true, json);
  EXPECT_EQ(json.str(), "{\"sessions\":[]}\n");
}

TEST_F(TierctlCommandsTest, ObjectsShowNameOwnerSizeTierAndAge) {
  v1::ListObjectsResponse objects;
  v1::ObjectInfo* a = objects.add_objects();
  a->set_name("ckpt/step100/w0");
  a->set_uid(1000);
  a->set_bytes(3 * kGiB);
  a->set_tier("host");
  a->set_age_ms(61'000);
  v1::ObjectInfo* b = objects.add_objects();
  b->set_name("x");
  b->set_uid(0);
  b->set_bytes(4096);
  b->set_tier("nvme");
  b->set_age_ms(1000);
  std::ostringstream out;
  RenderObjects(objects, false, out);
  EXPECT_EQ(out.str(),
            "NAME              UID     SIZE  TIER    AGE\n"
            "ckpt/step100/w0  1000  3.0 GiB  host  1m01s\n"
            "x                   0  4.0 KiB  nvme     1s\n");
  std::ostringstream json;
  RenderObjects(objects, true, json);
  EXPECT_NE(json.str().find("\"name\":\"ckpt/step100/w0\",\"uid\":1000"), std::string::npos)
      << json.str();
  std::ostringstream none;
  RenderObjects(v1::ListObjectsResponse(), false, none);
  EXPECT_EQ(none.str(), "No persistent objects.\n");
}

TEST_F(TierctlCommandsTest, ClientsJsonIsValidWithStableNames) {
  const Outcome run = RunInProcess("clients", true);
  ASSERT_EQ(run.exit_code, kExitOk) << run.err;
  const google::protobuf::Struct parsed = ParseJson(run.out);
  const auto& sessions = parsed.fields().at("sessions").list_value();
  ASSERT_EQ(sessions.values_size(), 2);
  const auto& first = sessions.values(0).struct_value();
  EXPECT_EQ(Keys(first),
            (std::set<std::string>{"session_id", "name", "attached", "pid", "uid", "gid",
                                   "quota_bytes", "used_bytes", "objects", "buffers",
                                   "jobs_in_flight", "jobs_completed", "jobs_failed",
                                   "bytes_offloaded", "bytes_reloaded", "age_ms", "lanes",
                                   "mapped_bytes", "reserved_bytes"}));
  const auto& lanes = first.fields().at("lanes").list_value();
  ASSERT_EQ(lanes.values_size(), 2);
  EXPECT_EQ(Keys(lanes.values(0).struct_value()),
            (std::set<std::string>{"gpu", "direction", "queued", "held", "in_flight",
                                   "waiting_ticket", "client_ticket", "waiting_ms", "blocked_on",
                                   "active", "issued_seq", "completed_seq",
                                   "oldest_in_flight_ms", "gpu_waits"}));
  EXPECT_EQ(lanes.values(0).struct_value().fields().at("waiting_ticket").number_value(), 41);
  EXPECT_EQ(first.fields().at("name").string_value(), "llama \"rank0\"");
  EXPECT_EQ(first.fields().at("pid").number_value(), 4242);
  EXPECT_TRUE(first.fields().at("attached").bool_value());
  EXPECT_FALSE(sessions.values(1).struct_value().fields().at("attached").bool_value());
}

TEST_F(TierctlCommandsTest, HealthVersionAndDrainInProcess) {
  Outcome run = RunInProcess("health", false);
  EXPECT_EQ(run.exit_code, kExitOk);
  EXPECT_EQ(run.out, "serving\n");
  fake_.SetState(v1::HealthResponse::DRAINING);
  run = RunInProcess("health", true);
  EXPECT_EQ(run.exit_code, kExitFailure);
  EXPECT_EQ(run.out, "{\"state\":\"draining\",\"reason\":\"\"}\n");
  fake_.SetState(v1::HealthResponse::NOT_SERVING);
  run = RunInProcess("health", false);
  EXPECT_EQ(run.exit_code, kExitFailure);
  EXPECT_EQ(run.out, "not_serving: jobs stopped\n");

  run = RunInProcess("version", false);
  EXPECT_EQ(run.exit_code, kExitOk);
  EXPECT_NE(run.out.find("tierd   0.1.0 (api 1, ring 2, engine host)\n"), std::string::npos)
      << run.out;
  run = RunInProcess("version", true);
  const google::protobuf::Struct version = ParseJson(run.out);
  EXPECT_EQ(Keys(version), (std::set<std::string>{"tierctl_version", "version", "api_version",
                                                  "ring_version", "engine"}));

  run = RunInProcess("drain", true);
  EXPECT_EQ(run.exit_code, kExitOk);
  EXPECT_EQ(run.out, "{\"drained\":true,\"jobs_in_flight\":0}\n");
}

TEST_F(TierctlCommandsTest, BinaryStatus) {
  const Outcome run = RunBinary("status " + SocketArg());
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.err, "");
  EXPECT_EQ(run.out, RunInProcess("status", false).out);
  EXPECT_NE(run.out.find("Uptime:            1h02m03s\n"), std::string::npos) << run.out;
}

TEST_F(TierctlCommandsTest, BinaryStatusJson) {
  const Outcome run = RunBinary("--json status " + SocketArg());
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ASSERT_TRUE(run.out.ends_with("}\n"));
  const google::protobuf::Struct parsed = ParseJson(run.out);
  EXPECT_EQ(Keys(parsed),
            (std::set<std::string>{"version", "engine", "state", "uptime_ms", "tiers", "sessions",
                                   "jobs_in_flight", "jobs_completed", "jobs_failed",
                                   "bytes_offloaded", "bytes_reloaded",
                                   "recent_bandwidth_bytes_per_s", "pool_locked", "spill_io",
                                   "bytes_spilled", "bytes_fetched", "spill_write_errors",
                                   "spill_read_errors", "checksum_failures",
                                   "spill_bandwidth_bytes_per_s", "fetch_bandwidth_bytes_per_s",
                                   "prefetches", "bytes_prefetched", "prefetch_hits",
                                   "prefetch_misses", "spill_files", "buffers", "gpu_lanes",
                                   "pending_releases", "spills", "fetches", "job_kinds",
                                   "latency_bucket_bounds_seconds", "pool_setup",
                                   "pool_parts", "pool_layout", "gpus", "persistent",
                                   "client_mapped_bytes", "max_mapped_bytes", "metrics",
                                   "ring_pollers", "client_reserved_bytes"}));
  const auto& f = parsed.fields();
  EXPECT_EQ(f.at("state").string_value(), "serving");
  EXPECT_EQ(f.at("uptime_ms").number_value(), 3'723'000);
  EXPECT_EQ(f.at("jobs_completed").number_value(), 10234);
  EXPECT_EQ(f.at("recent_bandwidth_bytes_per_s").number_value(), 23.4e9);
  EXPECT_TRUE(f.at("pool_locked").bool_value());
  EXPECT_EQ(f.at("pool_setup").struct_value().fields().at("threads").number_value(), 16);
  const auto& tiers = f.at("tiers").list_value();
  ASSERT_EQ(tiers.values_size(), 2);
  const auto& host = tiers.values(0).struct_value().fields();
  EXPECT_EQ(host.at("name").string_value(), "host");
  EXPECT_EQ(host.at("capacity_bytes").number_value(), 64.0 * kGiB);
  EXPECT_EQ(host.at("objects").number_value(), 1234);
}

TEST_F(TierctlCommandsTest, BinaryClientsAndSocketFromEnvironment) {
  const Outcome by_flag = RunBinary("clients " + SocketArg());
  EXPECT_EQ(by_flag.exit_code, 0) << by_flag.err;
  EXPECT_EQ(by_flag.out, RunInProcess("clients", false).out);
  const Outcome by_env = RunBinary("sessions", "TIER_SOCKET=" + socket_path_);
  EXPECT_EQ(by_env.exit_code, 0) << by_env.err;
  EXPECT_EQ(by_env.out, by_flag.out);
}

TEST_F(TierctlCommandsTest, BinaryDrainPassesTheTimeoutAndReportsLeftovers) {
  Outcome run = RunBinary("drain --timeout-ms 1500 " + SocketArg());
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, "Drained: no jobs in flight; tierd admits no new sessions or jobs.\n");

  fake_.SetJobsLeftAfterDrain(2);
  run = RunBinary("drain " + SocketArg() + " --timeout-ms=250");
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(run.out,
            "Not drained: 2 jobs still in flight after 250ms; tierd admits no new sessions or "
            "jobs.\n");
  run = RunBinary("drain --json " + SocketArg());
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(run.out, "{\"drained\":false,\"jobs_in_flight\":2}\n");
  EXPECT_EQ(fake_.drain_timeouts(), (std::vector<uint32_t>{1500, 250, 0}));
}

TEST_F(TierctlCommandsTest, BinaryRpcErrorNamesTheCode) {
  fake_.RefuseDrain();
  const Outcome run = RunBinary("drain " + SocketArg());
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(run.out, "");
  // The fake daemon wrote no admin token, and tierctl says so after the daemon's refusal.
  EXPECT_TRUE(run.err.starts_with("tierctl: PERMISSION_DENIED: drain needs root\n"
                                  "tierctl: drain is for root and tierd's own user (cannot read "
                                  "the admin token "))
      << run.err;
}

TEST_F(TierctlCommandsTest, BinaryDeadlineAppliesToEachCall) {
  fake_.HoldHealth(true);
  const Outcome run = RunBinary("health --timeout-ms 200 " + SocketArg());
  fake_.HoldHealth(false);
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_TRUE(run.err.starts_with("tierctl: DEADLINE_EXCEEDED: ")) << run.err;
}

TEST_F(TierctlCommandsTest, BinaryNoSocketMeansNotRunning) {
  const Outcome run = RunBinary("status --socket /nonexistent/x.sock");
  EXPECT_EQ(run.exit_code, 3);
  EXPECT_EQ(run.out, "");
  EXPECT_EQ(run.err, "tierctl: tierd is not running (no socket at /nonexistent/x.sock)\n");
}

TEST_F(TierctlCommandsTest, BinaryStaleSocketMeansNotRunning) {
  server_->Shutdown();
  server_.reset();
  // gRPC removes its socket on shutdown; leave a stale file behind as a crashed daemon would.
  std::ofstream(socket_path_) << "";
  const Outcome run = RunBinary("status " + SocketArg());
  EXPECT_EQ(run.exit_code, 3);
  EXPECT_TRUE(run.err.starts_with("tierctl: tierd is not running (cannot connect to " +
                                  socket_path_ + ": "))
      << run.err;
  EXPECT_EQ(Lines(run.err).size(), 1u) << run.err;
}

TEST_F(TierctlCommandsTest, BinarySocketWithoutPermissionIsNotCalledNotRunning) {
  ASSERT_EQ(::chmod(socket_path_.c_str(), 0), 0);
  // Root ignores file modes, so as root run tierctl as nobody.
  const std::string as_user =
      ::geteuid() == 0 ? "setpriv --reuid=65534 --regid=65534 --clear-groups" : "";
  const Outcome run = RunBinary("status " + SocketArg(), as_user);
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(run.err, "tierctl: cannot connect to " + socket_path_ + ": Permission denied\n");
}

TEST_F(TierctlCommandsTest, BinaryUsageErrors) {
  Outcome run = RunBinary("");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("usage: tierctl"), std::string::npos) << run.err;
  run = RunBinary("frobnicate " + SocketArg());
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_TRUE(run.err.starts_with("tierctl: unknown command frobnicate\n")) << run.err;
  run = RunBinary("status --timeout-ms soon " + SocketArg());
  EXPECT_EQ(run.exit_code, 2);
  run = RunBinary("status --bogus " + SocketArg());
  EXPECT_EQ(run.exit_code, 2);
  run = RunBinary("objects delete " + SocketArg());  // no name
  EXPECT_EQ(run.exit_code, 2);
  run = RunBinary("objects frob x " + SocketArg());
  EXPECT_EQ(run.exit_code, 2);
  run = RunBinary("status --uid 5 " + SocketArg());  // --uid only with objects delete
  EXPECT_EQ(run.exit_code, 2);
  run = RunBinary("objects delete x --uid me " + SocketArg());
  EXPECT_EQ(run.exit_code, 2);
  run = RunBinary("help");
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_TRUE(run.out.starts_with("usage: tierctl")) << run.out;
}

}  // namespace
}  // namespace tier::ctl
