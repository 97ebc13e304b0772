#include "tierctl/top.h"

#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tierctl/commands.h"
#include "tierctl/format.h"
#include "tierctl/json_writer.h"
#include "tierctl/latency_quantile.h"
#include "tierctl/table.h"

namespace tier::ctl {
namespace {

using Align = Table::Align;
constexpr Align kR = Align::kRight;

// A per-second rate over the interval; nullopt without a previous sample. A counter that went
// down (tierd restarted) reads as 0.
std::optional<double> Rate(const std::optional<double>& dt, uint64_t now, uint64_t before) {
  if (!dt) return std::nullopt;
  return now >= before ? static_cast<double>(now - before) / *dt : 0.0;
}

// --- What a frame shows, computed once for both forms ---------------------------------------

struct TierRow {
  std::string name;
  uint64_t capacity = 0, used = 0;
  std::optional<double> in_bytes_per_s, out_bytes_per_s, ops_per_s;
};

struct JobRow {
  std::string kind;
  std::optional<double> jobs_per_s, failed_per_s;
  std::optional<double> p50, p90, p99;  // seconds, over the interval's completions
};

struct SessionRow {
  const v1::SessionInfo* info = nullptr;
  std::optional<double> offload_bytes_per_s, reload_bytes_per_s, jobs_per_s;
};

struct TopView {
  std::optional<double> interval_s;
  std::vector<TierRow> tiers;
  std::vector<JobRow> jobs;
  std::vector<SessionRow> sessions;
};

const v1::JobKindStatus* FindKind(const v1::GetStatusResponse& status, const std::string& kind) {
  for (const auto& k : status.job_kinds()) {
    if (k.kind() == kind) return &k;
  }
  return nullptr;
}

// Per-bucket counts of every size class of a kind, summed (empty when the kind is absent).
std::vector<uint64_t> Buckets(const v1::JobKindStatus* kind) {
  std::vector<uint64_t> out;
  if (kind == nullptr) return out;
  for (const auto& histogram : kind->latency()) {
    if (out.size() < static_cast<size_t>(histogram.bucket_counts_size())) {
      out.resize(histogram.bucket_counts_size());
    }
    for (int i = 0; i < histogram.bucket_counts_size(); ++i) out[i] += histogram.bucket_counts(i);
  }
  return out;
}

TopView Compute(const TopSample* previous, const TopSample& current) {
  const v1::GetStatusResponse& now = current.status;
  TopView view;
  // A previous sample counts only if it is of the same daemon (uptime went forward) and older.
  if (previous != nullptr && current.time_s > previous->time_s &&
      now.uptime_ms() >= previous->status.uptime_ms()) {
    view.interval_s = current.time_s - previous->time_s;
  } else {
    previous = nullptr;
  }
  const std::optional<double> dt = view.interval_s;
  const v1::GetStatusResponse empty;
  const v1::GetStatusResponse& before = previous != nullptr ? previous->status : empty;

  auto kind_ops = [](const v1::GetStatusResponse& s, const char* kind) -> uint64_t {
    const v1::JobKindStatus* k = FindKind(s, kind);
    return k == nullptr ? 0 : k->completed() + k->failed();
  };
  for (const auto& tier : now.tiers()) {
    TierRow row{tier.name(), tier.capacity_bytes(), tier.used_bytes(), {}, {}, {}};
    if (tier.name() == "host") {
      // In: offloads (into the pool); out: reloads.
      row.in_bytes_per_s = Rate(dt, now.bytes_offloaded(), before.bytes_offloaded());
      row.out_bytes_per_s = Rate(dt, now.bytes_reloaded(), before.bytes_reloaded());
      row.ops_per_s = Rate(dt, kind_ops(now, "offload") + kind_ops(now, "reload"),
                           kind_ops(before, "offload") + kind_ops(before, "reload"));
    } else if (tier.name() == "nvme") {
      // In: spills (host -> NVMe); out: fetches (NVMe -> host).
      row.in_bytes_per_s = Rate(dt, now.bytes_spilled(), before.bytes_spilled());
      row.out_bytes_per_s = Rate(dt, now.bytes_fetched(), before.bytes_fetched());
      row.ops_per_s = Rate(dt, now.spills() + now.fetches(), before.spills() + before.fetches());
    }
    view.tiers.push_back(std::move(row));
  }

  std::vector<double> bounds(now.latency_bucket_bounds_seconds().begin(),
                             now.latency_bucket_bounds_seconds().end());
  for (const auto& kind : now.job_kinds()) {
    JobRow row;
    row.kind = kind.kind();
    const v1::JobKindStatus* old = previous != nullptr ? FindKind(before, kind.kind()) : nullptr;
    const uint64_t old_ended = old == nullptr ? 0 : old->completed() + old->failed();
    row.jobs_per_s = Rate(dt, kind.completed() + kind.failed(), old_ended);
    row.failed_per_s = Rate(dt, kind.failed(), old == nullptr ? 0 : old->failed());
    if (dt) {
      // The interval's completions: this histogram less the previous one.
      std::vector<uint64_t> delta = Buckets(&kind);
      std::vector<uint64_t> earlier = Buckets(old);
      for (size_t i = 0; i < delta.size() && i < earlier.size(); ++i) {
        delta[i] = delta[i] >= earlier[i] ? delta[i] - earlier[i] : 0;
      }
      row.p50 = HistogramQuantile(0.50, bounds, delta);
      row.p90 = HistogramQuantile(0.90, bounds, delta);
      row.p99 = HistogramQuantile(0.99, bounds, delta);
    }
    view.jobs.push_back(std::move(row));
  }

  std::map<uint64_t, const v1::SessionInfo*> earlier;
  if (previous != nullptr) {
    for (const auto& s : previous->sessions.sessions()) earlier[s.session_id()] = &s;
  }
  for (const auto& s : current.sessions.sessions()) {
    SessionRow row;
    row.info = &s;
    auto it = earlier.find(s.session_id());
    if (it != earlier.end()) {
      const v1::SessionInfo& old = *it->second;
      row.offload_bytes_per_s = Rate(dt, s.bytes_offloaded(), old.bytes_offloaded());
      row.reload_bytes_per_s = Rate(dt, s.bytes_reloaded(), old.bytes_reloaded());
      row.jobs_per_s = Rate(dt, s.jobs_completed() + s.jobs_failed(),
                            old.jobs_completed() + old.jobs_failed());
    }
    view.sessions.push_back(row);
  }
  return view;
}

// --- Text -------------------------------------------------------------------------------------

std::string Bandwidth(const std::optional<double>& bytes_per_s) {
  return bytes_per_s ? FormatBandwidth(*bytes_per_s) : "-";
}
std::string PerSecond(const std::optional<double>& rate) {
  if (!rate) return "-";
  return *rate >= 100 || *rate == 0 ? absl::StrFormat("%.0f", *rate)
                                    : absl::StrFormat("%.1f", *rate);
}
std::string Latency(const std::optional<double>& seconds) {
  return seconds ? FormatSeconds(*seconds) : "-";
}

void RenderText(const TopView& view, const TopSample& current, std::ostream& out) {
  const v1::GetStatusResponse& s = current.status;
  out << "tierd " << s.version() << " (engine " << s.engine() << ")  "
      << absl::AsciiStrToLower(v1::HealthResponse::State_Name(s.state())) << "  up "
      << FormatDuration(s.uptime_ms()) << "  " << s.sessions()
      << (s.sessions() == 1 ? " session  " : " sessions  ")
      << s.jobs_in_flight() << " jobs in flight  "
      << (view.interval_s ? absl::StrFormat("over %.1fs", *view.interval_s)
                          : std::string("(rates from the next refresh)"))
      << "\n\n";

  Table tiers({{"TIER"}, {"CAPACITY", kR}, {"USED", kR}, {"USE", kR}, {"IN", kR}, {"OUT", kR},
               {"OPS/S", kR}});
  for (const TierRow& t : view.tiers) {
    tiers.AddRow({t.name, FormatBytes(t.capacity), FormatBytes(t.used),
                  FormatPercent(t.used, t.capacity), Bandwidth(t.in_bytes_per_s),
                  Bandwidth(t.out_bytes_per_s), PerSecond(t.ops_per_s)});
  }
  tiers.Render(out);
  out << "(host: in = offloads, out = reloads; nvme: in = spills, out = fetches)\n\n";

  if (view.jobs.empty()) {
    out << "No jobs yet.\n";
  } else {
    Table jobs({{"JOBS"}, {"RATE/S", kR}, {"FAILED/S", kR}, {"P50", kR}, {"P90", kR},
                {"P99", kR}});
    for (const JobRow& j : view.jobs) {
      jobs.AddRow({j.kind, PerSecond(j.jobs_per_s), PerSecond(j.failed_per_s), Latency(j.p50),
                   Latency(j.p90), Latency(j.p99)});
    }
    jobs.Render(out);
  }
  out << '\n';

  if (view.sessions.empty()) {
    out << "No sessions.\n";
    return;
  }
  Table sessions({{"ID", kR}, {"NAME"}, {"PID", kR}, {"UID", kR}, {"USED", kR},
                  {"OFFLOAD", kR}, {"RELOAD", kR}, {"JOBS/S", kR}, {"IN-FLIGHT", kR},
                  {"WAITING ON"}});
  for (const SessionRow& r : view.sessions) {
    const v1::SessionInfo& s = *r.info;
    sessions.AddRow({absl::StrCat(s.session_id()), s.name().empty() ? "-" : s.name(),
                     s.attached() ? absl::StrCat(s.pid()) : "-",
                     s.attached() ? absl::StrCat(s.uid()) : "-", FormatBytes(s.used_bytes()),
                     Bandwidth(r.offload_bytes_per_s), Bandwidth(r.reload_bytes_per_s),
                     PerSecond(r.jobs_per_s), absl::StrCat(s.jobs_in_flight()),
                     WaitSummary(s)});
  }
  sessions.Render(out);
}

// --- JSON ---------------------------------------------------------------------------------------

void Optional(JsonWriter& json, std::string_view key, const std::optional<double>& value) {
  json.Key(key);
  if (value) {
    json.Double(*value);
  } else {
    json.Double(std::numeric_limits<double>::quiet_NaN());  // null
  }
}

// Member `key`: an array of one object per row, whose members `write_row` writes.
template <typename Row, typename WriteRow>
void ObjectArray(JsonWriter& json, std::string_view key, const std::vector<Row>& rows,
                 WriteRow write_row) {
  json.Key(key);
  json.BeginArray();
  for (const Row& row : rows) {
    json.BeginObject();
    write_row(row);
    json.EndObject();
  }
  json.EndArray();
}

void RenderJson(const TopView& view, const TopSample& current, std::ostream& out) {
  const v1::GetStatusResponse& s = current.status;
  JsonWriter json(out);
  json.BeginObject();
  Optional(json, "interval_s", view.interval_s);
  json.StringMember("version", s.version());
  json.StringMember("engine", s.engine());
  json.StringMember("state", absl::AsciiStrToLower(v1::HealthResponse::State_Name(s.state())));
  json.UintMember("uptime_ms", s.uptime_ms());
  json.UintMember("jobs_in_flight", s.jobs_in_flight());
  ObjectArray(json, "tiers", view.tiers, [&json](const TierRow& t) {
    json.StringMember("name", t.name);
    json.UintMember("capacity_bytes", t.capacity);
    json.UintMember("used_bytes", t.used);
    Optional(json, "in_bytes_per_s", t.in_bytes_per_s);
    Optional(json, "out_bytes_per_s", t.out_bytes_per_s);
    Optional(json, "ops_per_s", t.ops_per_s);
  });
  ObjectArray(json, "jobs", view.jobs, [&json](const JobRow& j) {
    json.StringMember("kind", j.kind);
    Optional(json, "jobs_per_s", j.jobs_per_s);
    Optional(json, "failed_per_s", j.failed_per_s);
    Optional(json, "p50_seconds", j.p50);
    Optional(json, "p90_seconds", j.p90);
    Optional(json, "p99_seconds", j.p99);
  });
  ObjectArray(json, "sessions", view.sessions, [&json](const SessionRow& r) {
    const v1::SessionInfo& info = *r.info;
    json.UintMember("session_id", info.session_id());
    json.StringMember("name", info.name());
    json.IntMember("pid", info.pid());
    json.UintMember("uid", info.uid());
    json.UintMember("used_bytes", info.used_bytes());
    Optional(json, "offload_bytes_per_s", r.offload_bytes_per_s);
    Optional(json, "reload_bytes_per_s", r.reload_bytes_per_s);
    Optional(json, "jobs_per_s", r.jobs_per_s);
    json.UintMember("jobs_in_flight", info.jobs_in_flight());
    json.StringMember("waiting_on", WaitSummary(info));
  });
  json.EndObject();
  out << '\n';
}

}  // namespace

void RenderTop(const TopSample* previous, const TopSample& current, bool json, std::ostream& out) {
  TopView view = Compute(previous, current);
  if (json) {
    RenderJson(view, current, out);
  } else {
    RenderText(view, current, out);
  }
}

int RunTop(const TopSampler& sample, const TopOptions& options, std::ostream& out) {
  int exit_code = kExitOk;
  TopSample previous, current;
  if (options.once) {
    if (!sample(previous, exit_code)) return exit_code;
    std::this_thread::sleep_for(options.interval);
    if (!sample(current, exit_code)) return exit_code;
    RenderTop(&previous, current, options.json, out);
    out.flush();
    return kExitOk;
  }
  bool have_previous = false;
  for (int frame = 0; options.max_frames == 0 || frame < options.max_frames; ++frame) {
    if (frame > 0) std::this_thread::sleep_for(options.interval);
    if (!sample(current, exit_code)) return exit_code;
    if (options.terminal) {
      out << "\x1b[H\x1b[2J";  // cursor home, clear screen: the frame replaces the last
    } else if (frame > 0) {
      out << "\n";
    }
    RenderTop(have_previous ? &previous : nullptr, current, /*json=*/false, out);
    out.flush();
    previous = std::move(current);
    current = TopSample();
    have_previous = true;
  }
  return kExitOk;
}

}  // namespace tier::ctl
