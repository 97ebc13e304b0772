// Prometheus metrics end to end: a real tierd with metrics_listen, a client running jobs, and a
// real Prometheus (Debian's `prometheus`) scraping it on loopback; the series are asserted through
// Prometheus' HTTP API (/api/v1/query), and `promtool check metrics` lints the exposition.
// Skipped (with a message) only where the prometheus binary is missing; CI installs it.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "http_get.h"
#include "tier/client.hpp"
#include "tierd_process.h"

namespace tier {
namespace {

using testing::ChildProcess;
using testing::FreeLoopbackPort;
using testing::HttpGet;
using testing::TierdProcess;
using testing::UrlEncode;

// An executable on $PATH, or "".
std::string FindProgram(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    std::string candidate = absl::StrCat(dir, "/", name);
    if (!dir.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// The values of a Prometheus instant-query answer, one per series ("value":[time,"v"]).
std::vector<double> QueryValues(const std::string& body) {
  std::vector<double> values;
  if (body.find("\"status\":\"success\"") == std::string::npos) return values;
  const std::string marker = "\"value\":[";
  for (size_t at = body.find(marker); at != std::string::npos; at = body.find(marker, at + 1)) {
    size_t quote = body.find('"', body.find(',', at));
    if (quote == std::string::npos) break;
    values.push_back(std::strtod(body.c_str() + quote + 1, nullptr));
  }
  return values;
}

class Prometheus {
 public:
  // Scrapes 127.0.0.1:target_port every 250 ms; its data and config in `dir`.
  Prometheus(const std::string& binary, const std::string& dir, int target_port)
      : port_(FreeLoopbackPort()) {
    const std::string config = dir + "/prometheus.yml";
    std::ofstream(config) << "global:\n"
                             "  scrape_interval: 250ms\n"
                             "  scrape_timeout: 200ms\n"
                             "scrape_configs:\n"
                             "  - job_name: tierd\n"
                             "    static_configs:\n"
                             "      - targets: ['127.0.0.1:" << target_port << "']\n";
    process_.emplace(std::vector<std::string>{
        binary, "--config.file=" + config, "--storage.tsdb.path=" + dir + "/data",
        absl::StrCat("--web.listen-address=127.0.0.1:", port_), "--log.level=warn"});
  }

  bool WaitReady(int timeout_ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      if (HttpGet(port_, "/-/ready", 1000).status == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  std::vector<double> Query(const std::string& promql) {
    return QueryValues(HttpGet(port_, "/api/v1/query?query=" + UrlEncode(promql)).body);
  }

  // Re-runs `promql` until it yields one series whose value satisfies `ok`. Returns the last
  // value seen (nullopt when there was never exactly one series).
  std::optional<double> WaitFor(const std::string& promql, const std::function<bool(double)>& ok,
                                int timeout_ms = 15000) {
    std::optional<double> last;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      std::vector<double> values = Query(promql);
      if (values.size() == 1) {
        last = values[0];
        if (ok(values[0])) return last;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return last;
  }

 private:
  int port_;
  std::optional<ChildProcess> process_;
};

struct TempDir {
  TempDir() {
    char pattern[] = "/tmp/tierd-metrics-XXXXXX";
    path = ::mkdtemp(pattern);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string path;
};

TEST(Metrics, PrometheusScrapesTierdWhileAClientRuns) {
  const std::string prometheus = FindProgram("prometheus");
  const std::string promtool = FindProgram("promtool");
  if (prometheus.empty() || promtool.empty()) {
    GTEST_SKIP() << "prometheus or promtool not on PATH (Debian: apt-get install prometheus): "
                    "the scrape test needs a real Prometheus";
  }
  const int metrics_port = FreeLoopbackPort();
  ASSERT_GT(metrics_port, 0);
  TierdProcess tierd({absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port),
                      "--spill_bytes=16M", "--metrics_uid_labels=on"});
  const std::string version = tierd.Status().version();

  // A client that keeps offloading, reloading and freeing (4 KiB and 1 MiB) while Prometheus
  // scrapes, after one reload that fails (no such object).
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> rounds{0};
  Session::Options options;
  options.socket_path = tierd.socket();
  options.name = "metrics-test";
  Session session(options);
  HostBuffer buffer = session.AllocHost(1 << 20);
  ASSERT_EQ(session.TryWait(session.Reload(424242, buffer.id, 0, 4096)), TIER_NOT_FOUND);
  std::thread client([&] {
    while (!stop.load()) {
      for (uint64_t len : {uint64_t{4096}, uint64_t{1} << 20}) {
        auto [object, job] = session.Offload(buffer.id, 0, len);
        session.Wait(job);
        session.Wait(session.Reload(object, buffer.id, 0, len));
        session.Wait(session.Free(object));
      }
      ++rounds;
    }
  });
  while (rounds.load() < 10) std::this_thread::sleep_for(std::chrono::milliseconds(1));

  // The exposition as Prometheus reads it passes promtool's lint.
  TempDir dir;
  testing::HttpResponse scrape = HttpGet(metrics_port, "/metrics");
  ASSERT_EQ(scrape.status, 200);
  EXPECT_NE(scrape.body.find("tierd_job_latency_seconds_bucket{"), std::string::npos);
  std::ofstream(dir.path + "/metrics.txt") << scrape.body;
  auto [lint_rc, lint] = testing::RunCommand(promtool + " check metrics < " + dir.path +
                                             "/metrics.txt 2>&1");
  EXPECT_EQ(lint_rc, 0) << lint;
  EXPECT_EQ(lint, "") << "promtool check metrics found problems";

  Prometheus server(prometheus, dir.path, metrics_port);
  ASSERT_TRUE(server.WaitReady(20000)) << "Prometheus did not become ready";
  auto at_least = [](double n) { return [n](double v) { return v >= n; }; };
  auto equals = [](double n) { return [n](double v) { return v == n; }; };
  const std::string uid = absl::StrCat(::getuid());

  EXPECT_EQ(server.WaitFor("up{job=\"tierd\"}", equals(1)), 1);
  EXPECT_EQ(server.WaitFor(absl::StrCat("tierd_build_info{version=\"", version,
                                        "\",engine=\"host\"}"),
                           equals(1)),
            1);
  EXPECT_EQ(server.WaitFor("tierd_jobs_completed_total{kind=\"reload\",code=\"NOT_FOUND\"}",
                           equals(1)),
            1);
  EXPECT_GE(server.WaitFor("tierd_jobs_completed_total{kind=\"offload\",code=\"OK\"}",
                           at_least(20)).value_or(0),
            20);
  EXPECT_GE(server.WaitFor("tierd_jobs_submitted_total{kind=\"free\"}", at_least(20))
                .value_or(0),
            20);
  EXPECT_GE(server.WaitFor("tierd_job_latency_seconds_count{kind=\"offload\","
                           "size_class=\"64KiB-1MiB\"}",
                           at_least(10)).value_or(0),
            10);
  EXPECT_GE(server.WaitFor("tierd_job_latency_seconds_bucket{kind=\"reload\","
                           "size_class=\"0-64KiB\",le=\"+Inf\"}",
                           at_least(10)).value_or(0),
            10);
  // The dashboard's latency panel: a quantile over the last seconds' rate while jobs run.
  EXPECT_GT(server.WaitFor("histogram_quantile(0.99, sum by (le) (rate("
                           "tierd_job_latency_seconds_bucket{kind=\"offload\"}[2s])))",
                           [](double v) { return v > 0; }).value_or(0),
            0);
  EXPECT_EQ(server.WaitFor(absl::StrCat("tierd_sessions{uid=\"", uid, "\"}"), equals(1)), 1);
  EXPECT_GT(server.WaitFor(absl::StrCat("tierd_user_offloaded_bytes_total{uid=\"", uid, "\"}"),
                           at_least(1 << 20)).value_or(0),
            0);
  EXPECT_EQ(server.WaitFor("tierd_tier_capacity_bytes{tier=\"host\"}", equals(64 << 20)),
            64 << 20);
  EXPECT_EQ(server.WaitFor("tierd_tier_capacity_bytes{tier=\"nvme\"}", equals(16 << 20)),
            16 << 20);
  EXPECT_EQ(server.WaitFor("tierd_health_state{state=\"serving\"}", equals(1)), 1);
  EXPECT_GT(server.WaitFor("rate(tierd_offloaded_bytes_total[2s])",
                           [](double v) { return v > 0; }).value_or(0),
            0);

  stop = true;
  client.join();
  EXPECT_EQ(tierd.Stop(), 0);
}

// Issue 30, finding 8: a port already taken stopped tierd from starting (a fatal Init error), so
// any local user could keep it down, past systemd's start limit, by binding the port first. tierd
// starts and serves without metrics now, says why (log, status, tierctl status), and serves them
// once the port is free.
TEST(Metrics, ABusyPortDoesNotStopTheStart) {
  const int port = FreeLoopbackPort();
  ASSERT_GT(port, 0);
  int squatter = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(squatter, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(squatter, 4), 0);
  testing::TierdOptions options;
  options.capture_log = true;
  TierdProcess tierd({absl::StrCat("--metrics_listen=127.0.0.1:", port)}, options);
  const std::string state = tierd.Status().metrics();
  EXPECT_NE(state.find(absl::StrCat("not serving: cannot listen on 127.0.0.1:", port)),
            std::string::npos)
      << state;
  EXPECT_NE(state.find("trying again"), std::string::npos) << state;
  EXPECT_NE(tierd.Log().find("tierd serves on without metrics"), std::string::npos)
      << tierd.Log();
  auto [rc, out] =
      testing::RunCommand(absl::StrCat(TIERCTL_BIN, " --socket ", tierd.socket(), " status"));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("not serving"), std::string::npos) << out;
  // The squatter goes: tierd listens within its retry interval and serves.
  ::close(squatter);
  EXPECT_TRUE(tierd.WaitForStatus(
      [](const v1::GetStatusResponse& s) { return s.metrics().rfind("serving http://", 0) == 0; },
      20000))
      << tierd.Status().metrics();
  EXPECT_EQ(HttpGet(port, "/metrics").status, 200);
  EXPECT_EQ(tierd.Stop(), 0);
}

// Issue 30, finding 9: two idle TCP connections held prometheus-cpp's two exposer threads, and
// every scrape waited 20 s and more. One thread serves every connection now, an idle one is
// closed after request_timeout_ms (5 s), and at the limit the oldest idle one makes room.
TEST(Metrics, IdleConnectionsDoNotBlockAScrape) {
  const int port = FreeLoopbackPort();
  TierdProcess tierd({absl::StrCat("--metrics_listen=127.0.0.1:", port)});
  std::vector<int> idle;
  for (int i = 0; i < 100; ++i) {  // more than the 32 connections served at once
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    idle.push_back(fd);
  }
  for (int i = 0; i < 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    testing::HttpResponse scrape = HttpGet(port, "/metrics", 3000);
    EXPECT_EQ(scrape.status, 200) << "scrape " << i;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2)) << "scrape " << i;
  }
  // The idle ones are closed by tierd, at the latest after the request timeout.
  char byte;
  timeval timeout{10, 0};
  ::setsockopt(idle.back(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  EXPECT_EQ(::recv(idle.back(), &byte, 1, 0), 0) << "an idle connection was kept";
  for (int fd : idle) ::close(fd);
}

// Issue 30, finding 9: the endpoint has no authentication, and it served each user's activity by
// uid. By default every user's series are one, uid="all"; metrics_uid_labels = on names each uid.
TEST(Metrics, PerUserSeriesNameNoUidByDefault) {
  const int port = FreeLoopbackPort();
  TierdProcess tierd({absl::StrCat("--metrics_listen=127.0.0.1:", port)});
  Session::Options options;
  options.socket_path = tierd.socket();
  Session session(options);
  HostBuffer buffer = session.AllocHost(4096);
  auto [object, job] = session.Offload(buffer.id, 0, 4096);
  session.Wait(job);
  testing::HttpResponse scrape = HttpGet(port, "/metrics");
  ASSERT_EQ(scrape.status, 200);
  EXPECT_NE(scrape.body.find("tierd_sessions{uid=\"all\"} 1"), std::string::npos) << scrape.body;
  EXPECT_EQ(scrape.body.find(absl::StrCat("uid=\"", ::getuid(), "\"")), std::string::npos)
      << scrape.body;
}

// A Unix socket path is refused at parse time, with the reason.
TEST(Metrics, AUnixSocketPathIsRefused) {
  auto [rc, out] = testing::RunCommand(absl::StrCat(
      TIERD_BIN, " --metrics_listen=/run/tierd/metrics.sock --print-config 2>&1"));
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("a Unix socket is not supported"), std::string::npos) << out;
}

}  // namespace
}  // namespace tier
