// What a job runs on (daemon/jobs/offload_job.h, reload_job.h): the tiers that hold its object's
// bytes, the engine that copies them, how it ends, the named objects that outlive sessions, and
// the order offloads were accepted in. The JobExecutor holds them for every job.
#ifndef TIER_DAEMON_JOBS_JOB_PARTS_H_
#define TIER_DAEMON_JOBS_JOB_PARTS_H_

#include "daemon/jobs/job_ends.h"
#include "daemon/jobs/offload_order.h"
#include "daemon/persistent/persistent_store.h"
#include "daemon/tiers/tier_manager.h"
#include "engine/copy_engine.h"

namespace tier::daemon {

struct JobParts {
  TierManager& tiers;
  engine::CopyEngine& engine;
  JobEnds& ends;
  PersistentStore* persistent;  // null: none (unit tests)
  OffloadOrder& order;
};

}  // namespace tier::daemon

#endif  // TIER_DAEMON_JOBS_JOB_PARTS_H_
