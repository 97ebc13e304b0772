/* doomed_client: a separate client process for the kill -9 test. It opens a session, offloads
 * `--mib` MiB in 1 MiB jobs and waits for them, submits as many more and leaves them in flight,
 * prints "ready" on stdout, then sleeps until it is killed. C ABI only, like a foreign client.
 *
 *   doomed_client --socket=PATH [--mib=N]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "tier/tier.h"

static void die(tier_status status, const char* what) {
  fprintf(stderr, "doomed_client: %s: %s: %s\n", what, tier_status_name(status), tier_last_error());
  exit(1);
}

int main(int argc, char** argv) {
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test that started us */
  const char* socket_path = NULL;
  uint64_t mib = 8;
  for (int i = 1; i < argc; ++i) {
    if (strncmp(argv[i], "--socket=", 9) == 0) socket_path = argv[i] + 9;
    else if (strncmp(argv[i], "--mib=", 6) == 0) mib = strtoull(argv[i] + 6, NULL, 10);
  }
  tier_session_options options;
  tier_session_options_init(&options);
  options.socket_path = socket_path;
  options.name = "doomed";
  tier_session* session = NULL;
  tier_status status = tier_session_open(&options, &session);
  if (status != TIER_OK) die(status, "open");
  void* data = NULL;
  tier_buffer_id buffer;
  status = tier_buffer_alloc_host(session, mib << 20, &data, &buffer);
  if (status != TIER_OK) die(status, "alloc");
  memset(data, 0x5a, mib << 20);
  for (uint64_t i = 0; i < mib; ++i) {
    tier_object_id object;
    tier_job_id job;
    status = tier_offload(session, buffer, i << 20, 1 << 20, NULL, &object, &job);
    if (status != TIER_OK) die(status, "offload");
    status = tier_job_wait(session, job, -1);
    if (status != TIER_OK) die(status, "offload job");
  }
  for (uint64_t i = 0; i < mib; ++i) {  /* left in flight (or queued) when the kill comes */
    tier_object_id object;
    tier_job_id job;
    status = tier_offload(session, buffer, i << 20, 1 << 20, NULL, &object, &job);
    if (status != TIER_OK) die(status, "offload");
  }
  printf("ready\n");
  fflush(stdout);
  for (;;) pause();
}
