#include "engine/lane_jobs.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/lane_words.h"

namespace tier::engine {

std::string DescribeGpuWaits(const PendingJob& p) {
  std::string out;
  for (const GpuWait& w : p.gpu_waits) {
    uint64_t at = LoadWord(*w.word);
    if (at >= w.seq) continue;
    absl::StrAppend(&out, out.empty() ? "" : ", ", "pool write seq ", w.seq, " (word at ", at, ")");
  }
  return out;
}

void RunFailed(std::vector<FailedJob>& failed) {
  for (FailedJob& f : failed) std::move(f.done)(std::move(f.status));
  failed.clear();
}

}  // namespace tier::engine
