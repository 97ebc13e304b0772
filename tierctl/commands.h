// tierctl's commands: each makes one call on the daemon's control API and renders the answer to a
// stream, as aligned tables for people or as one JSON object for scripts.
#ifndef TIER_TIERCTL_COMMANDS_H_
#define TIER_TIERCTL_COMMANDS_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>

#include "tier.grpc.pb.h"

namespace tier::ctl {

// Exit statuses, stable for scripts.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;     // an RPC error, not serving, or not drained in time
inline constexpr int kExitUsage = 2;
inline constexpr int kExitNotRunning = 3;  // no socket, connection refused, UNAVAILABLE

inline constexpr std::chrono::milliseconds kDefaultCallTimeout{5000};

struct CommandContext {
  v1::Control::StubInterface* stub = nullptr;
  std::string socket_path;  // named in error messages
  // The admin token's file (drain, objects): --admin-token, $TIER_ADMIN_TOKEN, or beside the socket.
  std::string admin_token_path;
  bool json = false;
  std::chrono::milliseconds call_timeout = kDefaultCallTimeout;  // deadline of each call
  uint32_t drain_timeout_ms = 0;  // how long the daemon waits for jobs; 0 = as long as it takes
  // top: one frame and exit (else refresh until interrupted), the refresh interval, and whether
  // stdout is a terminal (frames replace each other; else they follow as plain text).
  bool once = false;
  std::chrono::milliseconds interval{1000};
  bool terminal = false;
  std::ostream* out = nullptr;
  std::ostream* err = nullptr;
};

// A stub on the daemon's control socket at `socket_path`. Connects lazily, on the first call.
std::unique_ptr<v1::Control::Stub> ConnectControl(const std::string& socket_path);

// Whether `command` names a command RunCommand knows ("sessions" is an alias of "clients").
bool IsCommand(std::string_view command);

// Runs `command` against ctx.stub; returns the exit status. Results go to ctx.out, one line per
// error to ctx.err.
int RunCommand(std::string_view command, const CommandContext& ctx);

// "tierctl: tierd is not running (<detail>)", the one line printed when the daemon cannot be
// reached; returns kExitNotRunning.
int ReportNotRunning(std::string_view detail, std::ostream& err);

// Renderers, also used by the tests.
void RenderStatus(const v1::GetStatusResponse& status, bool json, std::ostream& out);
void RenderTiers(const v1::GetStatusResponse& status, bool json, std::ostream& out);
// The NVMe tier, one row per spill file (device).
void RenderSpill(const v1::GetStatusResponse& status, bool json, std::ostream& out);
void RenderSessions(const v1::ListSessionsResponse& sessions, bool json, std::ostream& out);
// Persistent objects: name, owner uid, size, tier, age.
void RenderObjects(const v1::ListObjectsResponse& objects, bool json, std::ostream& out);
// What a session's GPU lanes wait for, in one cell ("-" when nothing waits).
std::string WaitSummary(const v1::SessionInfo& session);
void RenderHealth(const v1::HealthResponse& health, bool json, std::ostream& out);
void RenderVersion(const v1::GetVersionResponse& version, bool json, std::ostream& out);
void RenderDrain(const v1::DrainResponse& drain, uint32_t drain_timeout_ms, bool json,
                 std::ostream& out);

}  // namespace tier::ctl

#endif  // TIER_TIERCTL_COMMANDS_H_
