// Ring latency benchmark: submit-to-completion time of small jobs through a session's shared-memory
// ring, against one gRPC unary call to the same daemon over the same Unix socket, in one run.
//
//   tier_ring_bench [--socket=PATH | --tierd=BIN] [--iterations=N] [--json=FILE] [--pipelined]
//
// The "pipelined" rows keep the ring full (submit while earlier jobs run, take completions as
// they come) and report the daemon's time per job at that rate: its host work per job, which
// bounds small-job throughput on any engine.
//
// Without --socket it starts a private tierd (the one built beside this program, or --tierd) in a
// temporary directory, with a small pool.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "client/client_session.h"
#include "tier.grpc.pb.h"
#include "private_daemon.h"
#include "tier/ring.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  std::string name;
  size_t n = 0;
  double p50_us = 0, p99_us = 0, mean_us = 0, min_us = 0;
};

// `before` runs untimed ahead of each timed `once` (e.g. a pause that lets the daemon go idle).
Result Measure(const std::string& name, int iterations, const std::function<void()>& once,
               const std::function<void()>& before = [] {}) {
  std::vector<double> us;
  us.reserve(iterations);
  for (int i = 0; i < iterations / 10; ++i) once();  // warm-up
  for (int i = 0; i < iterations; ++i) {
    before();
    auto start = Clock::now();
    once();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  std::sort(us.begin(), us.end());
  Result r;
  r.name = name;
  r.n = us.size();
  r.p50_us = us[us.size() / 2];
  r.p99_us = us[us.size() * 99 / 100];
  r.min_us = us.front();
  double sum = 0;
  for (double v : us) sum += v;
  r.mean_us = sum / us.size();
  return r;
}

pid_t private_daemon_pid = -1;  // stopped on every exit, the failing ones too

void Check(const absl::Status& status) {
  if (!status.ok()) {
    std::fprintf(stderr, "tier_ring_bench: %s\n", status.ToString().c_str());
    if (private_daemon_pid > 0) ::kill(private_daemon_pid, SIGTERM);
    std::exit(1);
  }
}


}  // namespace

int main(int argc, char** argv) {
  std::string socket, json_path, tierd_bin;
  int iterations = 20000;
  bool pipelined_only = false;  // only the pipelined rows (to profile the daemon at full rate)
  std::vector<std::string> tierd_flags = {"--pool_bytes=256M", "--engine=host",
                                          "--log_level=warning"};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--socket=", 0) == 0) socket = arg.substr(9);
    else if (arg.rfind("--json=", 0) == 0) json_path = arg.substr(7);
    else if (arg.rfind("--tierd=", 0) == 0) tierd_bin = arg.substr(8);
    else if (arg.rfind("--iterations=", 0) == 0) iterations = std::max(100, std::stoi(arg.substr(13)));
    else if (arg.rfind("--tierd-flag=", 0) == 0) tierd_flags.push_back(arg.substr(13));
    else if (arg == "--pipelined") pipelined_only = true;
    else {
      std::fprintf(stderr,
                   "usage: %s [--socket=PATH | --tierd=BIN] [--tierd-flag=--KEY=VALUE]... "
                   "[--iterations=N] [--json=FILE] [--pipelined]\n",
                   argv[0]);
      return 2;
    }
  }

  std::unique_ptr<tier::bench::PrivateDaemon> daemon;
  if (socket.empty()) {
    auto started = tier::bench::PrivateDaemon::Start(tierd_bin, tierd_flags);
    Check(started.status());
    daemon = *std::move(started);
    socket = daemon->socket();
    private_daemon_pid = daemon->pid();
  }

  auto stub = tier::v1::Control::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  auto unary = [&] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    tier::v1::GetVersionResponse response;
    return stub->GetVersion(&context, tier::v1::GetVersionRequest(), &response);
  };
  for (int i = 0; i < 1000 && !unary().ok(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));

  tier::client::SessionOptions options;
  options.socket_path = socket;
  options.name = "ring-bench";
  auto session = tier::client::ClientSession::Open(options);
  Check(session.status());
  void* data = nullptr;
  auto buffer = (*session)->AllocHostBuffer(1 << 20, &data);
  Check(buffer.status());
  std::memset(data, 0x5a, 1 << 20);

  auto run_job = [&](const tier::client::JobRequest& request) {
    auto job = (*session)->Submit(request);
    Check(job.status());
    Check((*session)->Wait(*job, -1));
  };
  auto offload_then_free = [&](uint64_t len) {
    tier::client::JobRequest request;
    request.opcode = static_cast<uint32_t>(tier::ring::Opcode::kOffload);
    request.object_id = (*session)->NewObjectId();
    request.buffer_id = *buffer;
    request.len = len;
    return request;
  };

  std::vector<Result> results;
  tier::client::JobRequest nop;
  nop.opcode = static_cast<uint32_t>(tier::ring::Opcode::kNop);
  if (!pipelined_only) results.push_back(Measure("ring: nop job", iterations, [&] { run_job(nop); }));
  for (uint64_t len : {4096ull, 65536ull}) {
    if (pipelined_only) break;
    std::vector<uint64_t> objects;
    results.push_back(Measure("ring: offload " + std::to_string(len / 1024) + " KiB", iterations, [&] {
      tier::client::JobRequest request = offload_then_free(len);
      run_job(request);
      objects.push_back(request.object_id);
      if (objects.size() == 512) {
        for (uint64_t object : objects) {
          tier::client::JobRequest free_request;
          free_request.opcode = static_cast<uint32_t>(tier::ring::Opcode::kFree);
          free_request.object_id = object;
          run_job(free_request);
        }
        objects.clear();
      }
    }));
  }
  if (!pipelined_only) {
    tier::client::JobRequest keep = offload_then_free(4096);
    run_job(keep);
    tier::client::JobRequest reload;
    reload.opcode = static_cast<uint32_t>(tier::ring::Opcode::kReload);
    reload.object_id = keep.object_id;
    reload.buffer_id = *buffer;
    reload.offset = 1 << 19;
    reload.len = 4096;
    results.push_back(Measure("ring: reload 4 KiB", iterations, [&] { run_job(reload); }));
  }
  {
    // Throughput: reloads of one 4 KiB object, lone or in batches, with the ring kept full.
    tier::client::JobRequest keep = offload_then_free(4096);
    run_job(keep);
    for (size_t batch : {size_t{1}, size_t{16}}) {
      std::vector<tier::client::JobRequest> requests(batch);
      for (size_t k = 0; k < batch; ++k) {
        requests[k].opcode = static_cast<uint32_t>(tier::ring::Opcode::kReload);
        requests[k].object_id = keep.object_id;
        requests[k].buffer_id = *buffer;
        requests[k].offset = (1 << 19) + 4096 * k;
        requests[k].len = 4096;
      }
      const size_t jobs = static_cast<size_t>(std::max(16, iterations)) * 16;
      size_t done = 0;
      auto take = [&] {
        for (const tier::client::Completion& c : (*session)->Poll(1 << 20)) {
          Check(c.status);
          ++done;
        }
      };
      const auto t0 = Clock::now();
      for (size_t submitted = 0; submitted < jobs; submitted += batch) {
        Check((*session)->SubmitBatch(absl::MakeSpan(requests), [] { return uint64_t{0}; })
                  .status());
        take();
      }
      Check((*session)->WaitAll(-1));
      take();
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      if (done != jobs) Check(absl::InternalError("pipelined: completions lost"));
      Result r;
      r.name = "ring: pipelined reload, batch " + std::to_string(batch);
      r.n = jobs;
      r.min_us = r.p50_us = r.p99_us = r.mean_us = us / static_cast<double>(jobs);
      results.push_back(r);
    }
  }
  // The daemon's poller sleeps after 50 us idle: a job after a pause pays the doorbell wake-up.
  if (!pipelined_only) results.push_back(Measure(
      "ring: nop after 1 ms idle", std::max(200, iterations / 50), [&] { run_job(nop); },
      [] { std::this_thread::sleep_for(std::chrono::milliseconds(1)); }));
  results.push_back(Measure("gRPC unary GetVersion", std::max(500, iterations / 10), [&] {
    grpc::Status status = unary();
    if (!status.ok()) Check(absl::UnavailableError(status.error_message()));
  }));
  session->reset();

  const Result& grpc = results.back();
  std::printf("%-28s %8s %10s %10s %10s %10s %12s\n", "path", "n", "min us", "p50 us", "p99 us",
              "mean us", "gRPC/this p50");
  for (const Result& r : results) {
    std::printf("%-28s %8zu %10.2f %10.2f %10.2f %10.2f %12.1fx\n", r.name.c_str(), r.n, r.min_us,
                r.p50_us, r.p99_us, r.mean_us, grpc.p50_us / r.p50_us);
  }
  std::printf("machine: %u cores\n", std::thread::hardware_concurrency());
  if (!json_path.empty()) {
    std::ofstream json(json_path);
    json << "{\n  \"cores\": " << std::thread::hardware_concurrency() << ",\n  \"results\": [\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      json << "    {\"path\": \"" << r.name << "\", \"n\": " << r.n << ", \"min_us\": " << r.min_us
           << ", \"p50_us\": " << r.p50_us << ", \"p99_us\": " << r.p99_us
           << ", \"mean_us\": " << r.mean_us << ", \"grpc_ratio_p50\": " << grpc.p50_us / r.p50_us
           << "}" << (i + 1 < results.size() ? "," : "") << "\n";
    }
    json << "  ]\n}\n";
  }
  return 0;
}
