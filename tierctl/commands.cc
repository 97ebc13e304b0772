#include "tierctl/commands.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/admin_token.h"
#include "common/status.h"
#include "tierctl/format.h"
#include "tierctl/json_writer.h"
#include "tierctl/table.h"
#include "tierctl/top.h"

#ifndef TIERCTL_VERSION
#define TIERCTL_VERSION "unknown"
#endif

namespace tier::ctl {
namespace {

using Align = Table::Align;

std::string StateName(v1::HealthResponse::State state) {
  return absl::AsciiStrToLower(v1::HealthResponse::State_Name(state));
}

// `message` as one JSON object on one line: `extra` members first, then the message's fields
// (only the one named `only`, when given).
void PrintJson(const google::protobuf::Message& message, std::ostream& out,
               std::string_view only = {}, std::function<void(JsonWriter&)> extra = nullptr) {
  JsonWriter json(out);
  json.BeginObject();
  if (extra) extra(json);
  WriteProtoFields(message, json, only);
  json.EndObject();
  out << '\n';
}

const char* YesNo(bool value) { return value ? "yes" : "no"; }

// "Label:" padded so that the values line up.
void RenderFields(const std::vector<std::pair<std::string, std::string>>& fields,
                  std::ostream& out) {
  size_t width = 0;
  for (const auto& [label, value] : fields) width = std::max(width, label.size());
  for (const auto& [label, value] : fields) {
    out << label << ':' << std::string(width - label.size() + 2, ' ') << value << '\n';
  }
}

void RenderTiersTable(const v1::GetStatusResponse& status, std::ostream& out) {
  Table table({{"TIER"}, {"CAPACITY", Align::kRight}, {"USED", Align::kRight},
               {"FREE", Align::kRight}, {"USE", Align::kRight}, {"OBJECTS", Align::kRight}});
  for (const auto& tier : status.tiers()) {
    table.AddRow({tier.name(), FormatBytes(tier.capacity_bytes()), FormatBytes(tier.used_bytes()),
                  FormatBytes(tier.free_bytes()),
                  FormatPercent(tier.used_bytes(), tier.capacity_bytes()),
                  absl::StrCat(tier.objects())});
  }
  table.Render(out);
}

std::string NodeText(int node) { return node < 0 ? "-" : absl::StrCat(node); }

// The host pool's parts (one per NUMA node with GPUs, or as pool_numa lists) and the GPUs'
// places: what `tierctl pools` adds below the tiers.
void RenderPoolParts(const v1::GetStatusResponse& status, std::ostream& out) {
  if (status.pool_parts_size() == 0) return;  // a tierd from before the parts
  out << "\nHost pool: " << status.pool_layout() << '\n';
  Table parts({{"PART", Align::kRight}, {"NODE", Align::kRight}, {"CAPACITY", Align::kRight},
               {"USED", Align::kRight}, {"FREE", Align::kRight}, {"USE", Align::kRight},
               {"OBJECTS", Align::kRight}, {"GPUS"}, {"LOCAL", Align::kRight},
               {"REMOTE", Align::kRight}, {"ANY", Align::kRight}});
  for (const v1::PoolPartStatus& part : status.pool_parts()) {
    parts.AddRow({absl::StrCat(part.part()), NodeText(part.numa_node()),
                  FormatBytes(part.capacity_bytes()), FormatBytes(part.used_bytes()),
                  FormatBytes(part.free_bytes()),
                  FormatPercent(part.used_bytes(), part.capacity_bytes()),
                  absl::StrCat(part.objects()),
                  part.gpus().empty() ? "-" : absl::StrJoin(part.gpus(), ","),
                  absl::StrCat(part.local_allocations()), absl::StrCat(part.remote_allocations()),
                  absl::StrCat(part.any_allocations())});
  }
  parts.Render(out);
  if (status.gpus_size() == 0) return;
  out << '\n';
  // LINK: what each direction achieved for tierd's copies lately ("-" until enough moved).
  Table gpus({{"GPU", Align::kRight}, {"PCI"}, {"ROOT"}, {"NODE", Align::kRight},
              {"PART", Align::kRight}, {"D2H LINK", Align::kRight}, {"H2D LINK", Align::kRight}});
  auto rate = [](double bytes_per_s) {
    return bytes_per_s > 0 ? absl::StrFormat("%.1f GB/s", bytes_per_s / 1e9) : std::string("-");
  };
  for (const v1::GpuPlacement& gpu : status.gpus()) {
    gpus.AddRow({absl::StrCat(gpu.device()), gpu.pci_bus_id().empty() ? "?" : gpu.pci_bus_id(),
                 gpu.pci_root().empty() ? "?" : gpu.pci_root(), NodeText(gpu.numa_node()),
                 gpu.pool_part() < 0 ? "any" : absl::StrCat(gpu.pool_part()),
                 rate(gpu.d2h_bytes_per_s()), rate(gpu.h2d_bytes_per_s())});
  }
  gpus.Render(out);
}

int ReportRpcError(const grpc::Status& status, const CommandContext& ctx) {
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    // gRPC's message names every address it tried; its last clause ("Connection refused") is
    // the part worth a line.
    const std::string& message = status.error_message();
    const size_t colon = message.rfind(": ");
    const std::string reason = colon == std::string::npos ? message : message.substr(colon + 2);
    const std::string detail = absl::StrCat("cannot connect to ", ctx.socket_path, ": ", reason);
    // A socket we may not open belongs to a daemon that runs; saying "not running" would mislead.
    if (reason == "Permission denied") {
      *ctx.err << "tierctl: " << detail << '\n';
      return kExitFailure;
    }
    return ReportNotRunning(detail, *ctx.err);
  }
  *ctx.err << "tierctl: " << StatusCodeName(static_cast<int>(status.error_code())) << ": "
           << status.error_message() << '\n';
  return kExitFailure;
}

template <typename Request, typename Response>
using StubMethod = grpc::Status (v1::Control::StubInterface::*)(grpc::ClientContext*,
                                                               const Request&, Response*);

// One call with a deadline `timeout` from now (none when zero). On failure reports it and sets
// `exit_code`.
template <typename Request, typename Response>
bool Call(const CommandContext& ctx, StubMethod<Request, Response> method, const Request& request,
          Response& response, int& exit_code,
          std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) {
  if (timeout.count() < 0) timeout = ctx.call_timeout;
  grpc::ClientContext call;
  if (timeout.count() > 0) call.set_deadline(std::chrono::system_clock::now() + timeout);
  grpc::Status status = (ctx.stub->*method)(&call, request, &response);
  if (!status.ok()) exit_code = ReportRpcError(status, ctx);
  return status.ok();
}

// --admin-token, $TIER_ADMIN_TOKEN, or the daemon's default beside its socket.
std::string TokenPath(const CommandContext& ctx) {
  return ctx.admin_token_path.empty() ? AdminTokenPath(ctx.socket_path) : ctx.admin_token_path;
}

}  // namespace

std::unique_ptr<v1::Control::Stub> ConnectControl(const std::string& socket_path) {
  return v1::Control::NewStub(
      grpc::CreateChannel("unix:" + socket_path, grpc::InsecureChannelCredentials()));
}

bool IsCommand(std::string_view command) {
  for (std::string_view known : {"status", "clients", "sessions", "pools", "spill", "health",
                                 "version", "drain", "objects", "top"}) {
    if (command == known) return true;
  }
  return false;
}

namespace {

// `tierctl top`: status and sessions sampled every interval.
int RunTopCommand(const CommandContext& ctx) {
  using Stub = v1::Control::StubInterface;
  TopOptions options;
  options.once = ctx.once;
  options.json = ctx.json;
  options.terminal = ctx.terminal;
  options.interval = ctx.interval;
  auto sample = [&ctx](TopSample& sample, int& exit_code) {
    if (!Call(ctx, &Stub::GetStatus, v1::GetStatusRequest(), sample.status, exit_code) ||
        !Call(ctx, &Stub::ListSessions, v1::ListSessionsRequest(), sample.sessions,
              exit_code)) {
      return false;
    }
    sample.time_s = std::chrono::duration<double>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count();
    return true;
  };
  return RunTop(sample, options, *ctx.out);
}

// `tierctl drain`: needs the admin token (root and tierd's own user).
int RunDrain(const CommandContext& ctx) {
  using Stub = v1::Control::StubInterface;
  int exit_code = kExitOk;
  v1::DrainRequest request;
  request.set_timeout_ms(ctx.drain_timeout_ms);
  // Drain is for root and tierd's own user, who can read the token tierd keeps beside its
  // socket (common/admin_token.h). Anyone else sends none and is refused by the daemon.
  absl::StatusOr<std::string> token = ReadAdminToken(TokenPath(ctx));
  if (token.ok()) request.set_admin_token(*token);
  // The daemon answers once its own drain timeout has passed, so the call gets that much more
  // than an ordinary one; with no drain timeout it may take as long as the jobs do.
  const auto deadline = ctx.drain_timeout_ms == 0
                            ? std::chrono::milliseconds(0)
                            : ctx.call_timeout + std::chrono::milliseconds(ctx.drain_timeout_ms);
  v1::DrainResponse response;
  if (!Call(ctx, &Stub::Drain, request, response, exit_code, deadline)) {
    if (!token.ok()) {
      *ctx.err << "tierctl: drain is for root and tierd's own user ("
               << token.status().message() << ")\n";
    }
    return exit_code;
  }
  RenderDrain(response, ctx.drain_timeout_ms, ctx.json, *ctx.out);
  return response.jobs_in_flight() == 0 ? kExitOk : kExitFailure;
}

// `tierctl objects`: every uid's persistent objects; needs the admin token.
int RunObjects(const CommandContext& ctx) {
  using Stub = v1::Control::StubInterface;
  int exit_code = kExitOk;
  // Every uid's names: for root and tierd's own user (the token beside the socket).
  v1::ListObjectsRequest request;
  absl::StatusOr<std::string> token = ReadAdminToken(TokenPath(ctx));
  if (token.ok()) request.set_admin_token(*token);
  v1::ListObjectsResponse response;
  if (!Call(ctx, &Stub::ListObjects, request, response, exit_code)) {
    if (!token.ok()) {
      *ctx.err << "tierctl: listing persistent objects is for root and tierd's own user ("
               << token.status().message() << ")\n";
    }
    return exit_code;
  }
  RenderObjects(response, ctx.json, *ctx.out);
  return kExitOk;
}

}  // namespace

int RunCommand(std::string_view command, const CommandContext& ctx) {
  using Stub = v1::Control::StubInterface;
  int exit_code = kExitOk;
  if (command == "status" || command == "pools" || command == "spill") {
    v1::GetStatusResponse response;
    if (!Call(ctx, &Stub::GetStatus, v1::GetStatusRequest(), response, exit_code)) return exit_code;
    if (command == "pools") {
      RenderTiers(response, ctx.json, *ctx.out);
    } else if (command == "spill") {
      RenderSpill(response, ctx.json, *ctx.out);
    } else {
      RenderStatus(response, ctx.json, *ctx.out);
    }
    return kExitOk;
  }
  if (command == "clients" || command == "sessions") {
    v1::ListSessionsResponse response;
    if (!Call(ctx, &Stub::ListSessions, v1::ListSessionsRequest(), response, exit_code)) {
      return exit_code;
    }
    RenderSessions(response, ctx.json, *ctx.out);
    return kExitOk;
  }
  if (command == "health") {
    v1::HealthResponse response;
    if (!Call(ctx, &Stub::Health, v1::HealthRequest(), response, exit_code)) return exit_code;
    RenderHealth(response, ctx.json, *ctx.out);
    return response.state() == v1::HealthResponse::SERVING ? kExitOk : kExitFailure;
  }
  if (command == "version") {
    v1::GetVersionResponse response;
    if (!Call(ctx, &Stub::GetVersion, v1::GetVersionRequest(), response, exit_code)) {
      return exit_code;
    }
    RenderVersion(response, ctx.json, *ctx.out);
    return kExitOk;
  }
  if (command == "top") return RunTopCommand(ctx);
  if (command == "drain") return RunDrain(ctx);
  if (command == "objects") return RunObjects(ctx);
  *ctx.err << "tierctl: unknown command '" << command << "'\n";
  return kExitUsage;
}

void RenderObjects(const v1::ListObjectsResponse& objects, bool json, std::ostream& out) {
  if (json) return PrintJson(objects, out);
  if (objects.objects().empty()) {
    out << "No persistent objects.\n";
    return;
  }
  constexpr Align kR = Align::kRight;
  Table table({{"NAME"}, {"UID", kR}, {"SIZE", kR}, {"TIER"}, {"AGE", kR}});
  for (const v1::ObjectInfo& o : objects.objects()) {
    table.AddRow({o.name(), absl::StrCat(o.uid()), FormatBytes(o.bytes()), o.tier(),
                  FormatDuration(o.age_ms())});
  }
  table.Render(out);
}

int ReportNotRunning(std::string_view detail, std::ostream& err) {
  err << "tierctl: tierd is not running (" << detail << ")\n";
  return kExitNotRunning;
}

// "yes, in 0.87 s (populate 0.60 s by 16 threads, mlock 0.00 s, GPU registration 0.27 s; 2.0 GiB
// in huge pages)": what start-up paid for the pool.
static std::string PoolPinned(const v1::GetStatusResponse& status) {
  std::string out = YesNo(status.pool_locked());
  if (!status.has_pool_setup()) return out;
  const v1::PoolSetupStatus& s = status.pool_setup();
  absl::StrAppend(&out, ", in ", absl::StrFormat("%.2f", s.seconds()), " s (populate ",
                  absl::StrFormat("%.2f", s.populate_seconds()), " s by ", s.threads(),
                  s.threads() == 1 ? " thread" : " threads");
  if (s.lock_seconds() > 0) {
    absl::StrAppend(&out, ", mlock ", absl::StrFormat("%.2f", s.lock_seconds()), " s");
  }
  if (s.register_seconds() > 0) {
    absl::StrAppend(&out, ", GPU registration ", absl::StrFormat("%.2f", s.register_seconds()),
                    " s");
  }
  absl::StrAppend(&out, "; ", FormatBytes(s.huge_page_bytes()), " in huge pages)");
  return out;
}

// "default 1, GPU 0 2, GPU 1 0 sessions; oldest pass 3 ms ago": each ring poller's sessions, and
// the longest any has not gone round.
// ", 180.0 GiB of GPU address space reserved" (VMM buffers); nothing when none is.
static std::string ReservedAddressSpace(const v1::GetStatusResponse& status) {
  if (status.client_reserved_bytes() == 0) return "";
  return absl::StrCat(", ", FormatBytes(status.client_reserved_bytes()),
                      " of GPU address space reserved");
}

static std::string RingPollers(const v1::GetStatusResponse& status) {
  std::vector<std::string> each;
  uint64_t oldest = 0;
  for (const v1::RingPollerStatus& poller : status.ring_pollers()) {
    each.push_back(poller.device() < 0 ? absl::StrCat("default ", poller.sessions())
                                       : absl::StrCat("GPU ", poller.device(), " ",
                                                      poller.sessions()));
    oldest = std::max(oldest, poller.heartbeat_age_ms());
  }
  return absl::StrCat(absl::StrJoin(each, ", "), " sessions; oldest pass ", oldest, " ms ago");
}

void RenderStatus(const v1::GetStatusResponse& status, bool json, std::ostream& out) {
  if (json) return PrintJson(status, out);
  std::vector<std::pair<std::string, std::string>> fields = {
                {"Version", absl::StrCat(status.version(), " (engine ", status.engine(), ")")},
                {"State", StateName(status.state())},
                {"Uptime", FormatDuration(status.uptime_ms())},
                {"Host pool pinned", PoolPinned(status)},
                {"Sessions", absl::StrCat(status.sessions())},
                {"Jobs", absl::StrCat(status.jobs_in_flight(), " in flight, ",
                                      status.jobs_completed(), " completed, ",
                                      status.jobs_failed(), " failed")},
                {"Offloaded", FormatBytes(status.bytes_offloaded())},
                {"Reloaded", FormatBytes(status.bytes_reloaded())},
                {"Recent bandwidth", FormatBandwidth(status.recent_bandwidth_bytes_per_s())},
                {"Client memory", absl::StrCat(status.buffers(), " buffers mapped (",
                                               FormatBytes(status.client_mapped_bytes()),
                                               " of host memory",
                                               ReservedAddressSpace(status), "), ",
                                               status.gpu_lanes(),
                                               " GPU lanes, ", status.pending_releases(),
                                               " releases pending")}};
  if (status.ring_pollers_size() > 0) fields.push_back({"Ring pollers", RingPollers(status)});
  if (!status.metrics().empty()) fields.push_back({"Metrics", status.metrics()});
  if (!status.spill_io().empty()) {  // an NVMe tier exists
    fields.push_back({"NVMe I/O", status.spill_io()});
    fields.push_back({"Spilled", absl::StrCat(FormatBytes(status.bytes_spilled()), " (now ",
                                              FormatBandwidth(status.spill_bandwidth_bytes_per_s()),
                                              ")")});
    fields.push_back({"Fetched", absl::StrCat(FormatBytes(status.bytes_fetched()), " (now ",
                                              FormatBandwidth(status.fetch_bandwidth_bytes_per_s()),
                                              ")")});
    fields.push_back({"Prefetch", absl::StrCat(status.prefetches(), " objects, ",
                                               FormatBytes(status.bytes_prefetched()), "; ",
                                               status.prefetch_hits(), " hits, ",
                                               status.prefetch_misses(), " misses")});
    fields.push_back({"NVMe errors", absl::StrCat(status.spill_write_errors(), " write, ",
                                                  status.spill_read_errors(), " read, ",
                                                  status.checksum_failures(), " checksum")});
  }
  if (status.has_persistent()) {
    const v1::PersistentStatus& p = status.persistent();
    std::string line = absl::StrCat(p.objects(), " of ", p.uids(), " users, ",
                                    FormatBytes(p.bytes()), " of ", FormatBytes(p.max_bytes()),
                                    " (", FormatBytes(p.quota_bytes_per_uid()), " per user)");
    if (p.journaled()) {
      absl::StrAppend(&line, "; journal ", FormatBytes(p.journal_bytes()), " of ",
                      FormatBytes(p.journal_max_bytes()), ", ", p.journal_queued(), " queued, ",
                      p.journal_errors(), " errors");
    }
    fields.push_back({"Persistent objects", line});
  }
  RenderFields(fields, out);
  out << '\n';
  RenderTiersTable(status, out);
}

void RenderTiers(const v1::GetStatusResponse& status, bool json, std::ostream& out) {
  if (!json) {
    RenderTiersTable(status, out);
    RenderPoolParts(status, out);
    return;
  }
  PrintJson(status, out, "tiers", [&status](JsonWriter& json) {
    for (std::string_view field : {"pool_layout", "pool_parts", "gpus"}) {
      WriteProtoFields(status, json, field);
    }
  });
}

void RenderSpill(const v1::GetStatusResponse& status, bool json, std::ostream& out) {
  if (json) {
    return PrintJson(status, out, "spill_files", [&status](JsonWriter& writer) {
      writer.Key("spill_io");
      writer.String(status.spill_io());
    });
  }
  if (status.spill_files().empty()) {
    out << "No NVMe tier (spill_bytes = 0).\n";
    return;
  }
  out << "NVMe I/O: " << status.spill_io() << '\n';
  constexpr Align kR = Align::kRight;
  Table table({{"DIRECTORY"}, {"I/O"}, {"CAPACITY", kR}, {"USED", kR}, {"USE", kR},
               {"RECORDS", kR}, {"WRITTEN", kR}, {"READ", kR}, {"WRITE-ERR", kR},
               {"READ-ERR", kR}, {"CRC-ERR", kR}});
  for (const auto& f : status.spill_files()) {
    table.AddRow({f.directory(), f.direct_io() ? "direct" : "buffered",
                  FormatBytes(f.capacity_bytes()), FormatBytes(f.used_bytes()),
                  FormatPercent(f.used_bytes(), f.capacity_bytes()), absl::StrCat(f.records()),
                  FormatBytes(f.bytes_written()), FormatBytes(f.bytes_read()),
                  absl::StrCat(f.write_errors()), absl::StrCat(f.read_errors()),
                  absl::StrCat(f.checksum_failures())});
  }
  table.Render(out);
}

// What a session's GPU lanes wait for: "client: gpu0 D2H ticket 5 (at 4) 12s" for a lane that
// waits for the client (a stream of the client has not reached the job's point), "tierd: gpu0
// H2D ..." for one that waits on tierd's side; "-" when none waits.
std::string WaitSummary(const v1::SessionInfo& s) {
  std::vector<std::string> waits;
  for (const v1::LaneInfo& lane : s.lanes()) {
    std::string where = absl::StrCat("gpu", lane.gpu(), " ", lane.direction());
    if (lane.waiting_ticket() != 0) {
      waits.push_back(absl::StrCat("client: ", where, " ticket ", lane.waiting_ticket(), " (at ",
                                   lane.client_ticket(), ") ", FormatDuration(lane.waiting_ms())));
    } else if (lane.queued() > 0) {
      waits.push_back(absl::StrCat("tierd: ", where, " ", lane.queued(), " queued",
                                   lane.blocked_on().empty() ? "" : ", for ", lane.blocked_on(),
                                   lane.active() ? "" : " (NOT SERVED)"));
    } else if (lane.in_flight() > 0 && lane.oldest_in_flight_ms() >= 1000) {
      waits.push_back(absl::StrCat("GPU: ", where, " ", lane.in_flight(), " copies in flight for ",
                                   FormatDuration(lane.oldest_in_flight_ms()),
                                   lane.gpu_waits().empty() ? "" : ", behind ",
                                   lane.gpu_waits()));
    }
  }
  return waits.empty() ? "-" : absl::StrJoin(waits, "; ");
}

void RenderSessions(const v1::ListSessionsResponse& sessions, bool json, std::ostream& out) {
  if (json) return PrintJson(sessions, out);
  if (sessions.sessions().empty()) {
    out << "No sessions.\n";
    return;
  }
  constexpr Align kR = Align::kRight;
  Table table({{"ID", kR}, {"NAME"}, {"PID", kR}, {"UID", kR}, {"ATTACHED"}, {"QUOTA", kR},
               {"USED", kR}, {"OBJECTS", kR}, {"BUFFERS", kR}, {"IN-FLIGHT", kR},
               {"COMPLETED", kR}, {"FAILED", kR}, {"OFFLOADED", kR}, {"RELOADED", kR},
               {"AGE", kR}, {"WAITING ON"}});
  for (const auto& s : sessions.sessions()) {
    // A pending session has no peer yet, so no credentials to show.
    table.AddRow({absl::StrCat(s.session_id()), s.name().empty() ? "-" : s.name(),
                  s.attached() ? absl::StrCat(s.pid()) : "-",
                  s.attached() ? absl::StrCat(s.uid()) : "-", YesNo(s.attached()),
                  FormatBytes(s.quota_bytes()), FormatBytes(s.used_bytes()),
                  absl::StrCat(s.objects()), absl::StrCat(s.buffers()),
                  absl::StrCat(s.jobs_in_flight()), absl::StrCat(s.jobs_completed()),
                  absl::StrCat(s.jobs_failed()), FormatBytes(s.bytes_offloaded()),
                  FormatBytes(s.bytes_reloaded()), FormatDuration(s.age_ms()), WaitSummary(s)});
  }
  table.Render(out);
}

void RenderHealth(const v1::HealthResponse& health, bool json, std::ostream& out) {
  if (json) return PrintJson(health, out);
  out << StateName(health.state());
  if (health.state() == v1::HealthResponse::NOT_SERVING && !health.reason().empty()) {
    out << ": " << health.reason();
  }
  out << '\n';
}

void RenderVersion(const v1::GetVersionResponse& version, bool json, std::ostream& out) {
  if (json) {
    return PrintJson(version, out, {}, [](JsonWriter& w) {
      w.Key("tierctl_version");
      w.String(TIERCTL_VERSION);
    });
  }
  out << "tierctl " << TIERCTL_VERSION << '\n'
      << "tierd   " << version.version() << " (api " << version.api_version() << ", ring "
      << version.ring_version() << ", engine " << version.engine() << ")\n";
}

void RenderDrain(const v1::DrainResponse& drain, uint32_t drain_timeout_ms, bool json,
                 std::ostream& out) {
  const bool drained = drain.jobs_in_flight() == 0;
  if (json) {
    return PrintJson(drain, out, {}, [&](JsonWriter& w) {
      w.Key("drained");
      w.Bool(drained);
    });
  }
  if (drained) {
    out << "Drained: no jobs in flight; tierd admits no new sessions or jobs.\n";
  } else {
    out << "Not drained: " << drain.jobs_in_flight() << " jobs still in flight after "
        << FormatDuration(drain_timeout_ms) << "; tierd admits no new sessions or jobs.\n";
  }
}

}  // namespace tier::ctl
