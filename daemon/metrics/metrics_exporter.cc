#include "daemon/metrics/metrics_exporter.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <list>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "daemon/config/config.h"
#include "daemon/metrics/metrics.h"
#include "prometheus/text_serializer.h"

namespace tier::daemon {
namespace {

constexpr size_t kMaxRequestBytes = 8192;
constexpr int kAcceptBurst = 16;

std::string Answer(absl::string_view status, absl::string_view content_type,
                   const std::string& body) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
}

}  // namespace

struct MetricsExporter::Connection {
  UniqueFd fd;
  uint64_t accepted_ms = 0;
  uint64_t deadline_ms = 0;
  std::string request;
  std::string answer;  // non-empty: being written
  size_t sent = 0;
};

absl::StatusOr<std::unique_ptr<MetricsExporter>> MetricsExporter::Start(
    const std::string& address, std::shared_ptr<prometheus::Collectable> collectable,
    MetricsExporterOptions options) {
  if (absl::Status valid = CheckMetricsListen(address); !valid.ok()) return valid;
  if (address.empty()) return absl::InvalidArgumentError("metrics_listen is empty");
  std::unique_ptr<MetricsExporter> exporter(
      new MetricsExporter(address, std::move(collectable), options));
  exporter->wake_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!exporter->wake_fd_.valid()) return ErrnoStatus("eventfd for the metrics exporter");
  if (exporter->TryListen()) {
    LogInfo("Prometheus metrics on http://", address, "/metrics");
  } else {
    MutexLock lock(&exporter->mu_);
    LogWarning("metrics_listen: ", exporter->problem_, "; tierd serves on without metrics and ",
               "tries again every ", options.retry_ms / 1000, " s");
  }
  exporter->thread_ = std::thread([raw = exporter.get()] { raw->Run(); });
  return exporter;
}

MetricsExporter::MetricsExporter(std::string address,
                                 std::shared_ptr<prometheus::Collectable> collectable,
                                 MetricsExporterOptions options)
    : address_(std::move(address)), collectable_(std::move(collectable)), options_(options) {}

MetricsExporter::~MetricsExporter() {
  stop_ = true;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

std::string MetricsExporter::state() const {
  MutexLock lock(&mu_);
  if (problem_.empty()) return absl::StrCat("serving http://", address_, "/metrics");
  return absl::StrCat("not serving: ", problem_, "; trying again every ",
                      options_.retry_ms / 1000, " s");
}

bool MetricsExporter::TryListen() {
  const size_t colon = address_.rfind(':');
  std::string host = address_.substr(0, colon);
  const std::string port = address_.substr(colon + 1);
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  std::string problem;
  if (int error = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); error != 0) {
    problem = absl::StrCat("cannot resolve ", host, ": ", ::gai_strerror(error));
  } else {
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
      UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                           a->ai_protocol));
      if (!fd.valid()) continue;
      int one = 1;
      ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd.get(), 64) == 0) {
        listen_fd_ = std::move(fd);
        break;
      }
      problem = absl::StrCat("cannot listen on ", address_, ": ", std::strerror(errno),
                             errno == EADDRINUSE ? " (another process has the port)" : "",
                             errno == EADDRNOTAVAIL ? " (not an address of this host)" : "");
    }
    ::freeaddrinfo(found);
  }
  if (listen_fd_.valid()) problem.clear();
  if (problem.empty() && !listen_fd_.valid()) problem = "no address to listen on";
  listening_.store(listen_fd_.valid());
  MutexLock lock(&mu_);
  problem_ = problem;
  return listen_fd_.valid();
}

std::string MetricsExporter::Render() const {
  std::shared_ptr<prometheus::Collectable> collectable = collectable_;
  return prometheus::TextSerializer().Serialize(collectable->Collect());
}

void MetricsExporter::Run() {
  std::list<Connection> connections;
  uint64_t retry_at_ms = MonotonicMs() + options_.retry_ms;
  std::vector<pollfd> fds;
  std::vector<std::list<Connection>::iterator> polled;
  while (!stop_.load()) {
    uint64_t now = MonotonicMs();
    if (!listen_fd_.valid() && now >= retry_at_ms) {
      if (TryListen()) {
        LogInfo("Prometheus metrics on http://", address_, "/metrics (listening at last)");
      }
      retry_at_ms = now + options_.retry_ms;
    }
    // Deadlines: a connection past its own is closed.
    for (auto it = connections.begin(); it != connections.end();) {
      it = now >= it->deadline_ms ? connections.erase(it) : std::next(it);
    }
    uint64_t wake_at = listen_fd_.valid() ? now + 1000 : retry_at_ms;
    for (const Connection& c : connections) wake_at = std::min(wake_at, c.deadline_ms);
    fds.clear();
    polled.clear();
    fds.push_back({wake_fd_.get(), POLLIN, 0});
    if (listen_fd_.valid()) fds.push_back({listen_fd_.get(), POLLIN, 0});
    const size_t first_connection = fds.size();
    for (auto it = connections.begin(); it != connections.end(); ++it) {
      fds.push_back({it->fd.get(), static_cast<short>(it->answer.empty() ? POLLIN : POLLOUT), 0});
      polled.push_back(it);
    }
    const int timeout_ms = static_cast<int>(wake_at > now ? wake_at - now : 0);
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      ::poll(nullptr, 0, 10);  // (not expected; never spin)
      continue;
    }
    if (stop_.load()) break;
    now = MonotonicMs();
    if (fds[0].revents != 0) {
      uint64_t value;
      [[maybe_unused]] ssize_t n = ::read(wake_fd_.get(), &value, sizeof(value));
    }
    // Requests and answers of the connections polled.
    for (size_t i = first_connection; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Connection& c = *polled[i - first_connection];
      const bool done = Serve(c, now);
      if (done) c.deadline_ms = 0;  // closed below
    }
    for (auto it = connections.begin(); it != connections.end();) {
      it = it->deadline_ms == 0 ? connections.erase(it) : std::next(it);
    }
    // New connections; at the limit the oldest one still owing its request makes room.
    if (listen_fd_.valid() && (fds[1].revents & POLLIN) != 0) {
      Accept(connections, now);
    }
  }
}

// One step of a connection polled ready: read its request (and make its answer once the request
// is whole), or send what is left of the answer. True: it is done (answered, closed or broken).
bool MetricsExporter::Serve(Connection& c, uint64_t now) {
  bool done = false;
  if (c.answer.empty()) {
    char buffer[4096];
    ssize_t n = ::recv(c.fd.get(), buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      done = true;
    } else if (n > 0) {
      c.request.append(buffer, static_cast<size_t>(n));
      if (c.request.find("\r\n\r\n") != std::string::npos ||
          c.request.find("\n\n") != std::string::npos) {
        if (absl::StartsWith(c.request, "GET /metrics ") ||
            absl::StartsWith(c.request, "GET /metrics?")) {
          c.answer = Answer("200 OK", "text/plain; version=0.0.4; charset=utf-8", Render());
        } else if (absl::StartsWith(c.request, "GET ")) {
          c.answer = Answer("404 Not Found", "text/plain", "only /metrics is served here\n");
        } else {
          c.answer = Answer("405 Method Not Allowed", "text/plain", "GET /metrics only\n");
        }
        c.deadline_ms = now + options_.write_timeout_ms;
      } else if (c.request.size() > kMaxRequestBytes) {
        c.answer = Answer("431 Request Header Fields Too Large", "text/plain", "");
        c.deadline_ms = now + options_.write_timeout_ms;
      }
    }
  }
  if (!done && !c.answer.empty()) {
    ssize_t n = ::send(c.fd.get(), c.answer.data() + c.sent, c.answer.size() - c.sent,
                       MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) c.sent += static_cast<size_t>(n);
    if ((n < 0 && errno != EAGAIN && errno != EINTR) || c.sent == c.answer.size()) done = true;
  }
  return done;
}

// New connections, a burst at most; at the limit the oldest one still owing its request makes
// room.
void MetricsExporter::Accept(std::list<Connection>& connections, uint64_t now) {
  for (int i = 0; i < kAcceptBurst; ++i) {
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) break;
    if (connections.size() >= options_.max_connections) {
      auto oldest = connections.end();
      for (auto it = connections.begin(); it != connections.end(); ++it) {
        if (it->answer.empty() && (oldest == connections.end() ||
                                   it->accepted_ms < oldest->accepted_ms)) {
          oldest = it;
        }
      }
      if (oldest == connections.end()) {
        ::close(fd);  // every slot is taking an answer: this one waits for the next scrape
        continue;
      }
      connections.erase(oldest);
    }
    Connection c;
    c.fd.reset(fd);
    c.accepted_ms = now;
    c.deadline_ms = now + options_.request_timeout_ms;
    connections.push_back(std::move(c));
  }
}

}  // namespace tier::daemon
