// `tierctl top`: a live view of tierd, refreshed every interval (like nvidia-smi dmon or htop). Per
// tier and per session: bandwidth in each direction and jobs per second; per job kind: rate,
// failures and latency percentiles (submit to completion); what each session's lanes wait for.
// Rates and percentiles come from the difference between two samples of the status API.
//
// On a terminal each frame replaces the last; elsewhere (a pipe, a file) frames follow each other
// as plain text. --once prints one frame (two samples an interval apart) and exits; with --json
// that frame is one JSON object.
#ifndef TIER_TIERCTL_TOP_H_
#define TIER_TIERCTL_TOP_H_

#include <chrono>
#include <functional>
#include <ostream>

#include "tier.grpc.pb.h"

namespace tier::ctl {

// One look at the daemon: its status and sessions, and when (seconds, any steady clock).
struct TopSample {
  v1::GetStatusResponse status;
  v1::ListSessionsResponse sessions;
  double time_s = 0;
};

// A frame from `current` alone (previous null: rates show as "-") or from the change since
// `previous`.
void RenderTop(const TopSample* previous, const TopSample& current, bool json, std::ostream& out);

struct TopOptions {
  bool once = false;
  bool json = false;      // with once only
  bool terminal = false;  // clear the screen before each frame
  std::chrono::milliseconds interval{1000};
  int max_frames = 0;     // 0: until interrupted or the daemon goes away (once: 1)
};

// Takes a sample; on failure reports it and returns false with the exit status set.
using TopSampler = std::function<bool(TopSample& sample, int& exit_code)>;

// The refresh loop. Returns the exit status: 0 after max_frames (or --once), else the sampler's.
int RunTop(const TopSampler& sample, const TopOptions& options, std::ostream& out);

}  // namespace tier::ctl

#endif  // TIER_TIERCTL_TOP_H_
