/* tier_demo: offloads a buffer to tierd and reloads it, through the C ABI only (this file is C).
 *
 *   tier_demo [--socket=PATH] [--mib=N] [--rounds=N]
 *
 * Uses host memory shared with the daemon (the host engine path, or the GPU engine's host
 * staging path). Prints what it moved and how fast, and exits non-zero if a byte came back wrong.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tier/tier.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int check(tier_status status, const char* what) {
  if (status == TIER_OK) return 0;
  fprintf(stderr, "tier_demo: %s failed: %s: %s\n", what, tier_status_name(status), tier_last_error());
  return 1;
}

int main(int argc, char** argv) {
  const char* socket_path = NULL;
  uint64_t mib = 64;
  int rounds = 4;
  for (int i = 1; i < argc; ++i) {
    if (strncmp(argv[i], "--socket=", 9) == 0) socket_path = argv[i] + 9;
    else if (strncmp(argv[i], "--mib=", 6) == 0) mib = strtoull(argv[i] + 6, NULL, 10);
    else if (strncmp(argv[i], "--rounds=", 9) == 0) rounds = atoi(argv[i] + 9);
    else {
      fprintf(stderr, "usage: tier_demo [--socket=PATH] [--mib=N] [--rounds=N]\n");
      return 2;
    }
  }
  tier_session_options options;
  tier_session_options_init(&options);
  options.socket_path = socket_path;
  options.name = "tier_demo";
  tier_session* session = NULL;
  if (check(tier_session_open(&options, &session), "opening a session")) return 1;
  tier_session_info info;
  memset(&info, 0, sizeof(info));
  info.struct_size = sizeof(info);
  tier_session_get_info(session, &info);
  printf("session %llu on tierd (engine %s, quota %llu MiB, ring %u entries)\n",
         (unsigned long long)info.session_id, info.engine,
         (unsigned long long)(info.quota_bytes >> 20), info.ring_entries);

  const uint64_t bytes = mib << 20, chunk = 4 << 20;
  const uint64_t chunks = bytes / chunk;
  void* data = NULL;
  tier_buffer_id buffer;
  if (check(tier_buffer_alloc_host(session, bytes, &data, &buffer), "allocating a buffer")) return 1;
  tier_object_id* objects = calloc(chunks, sizeof(tier_object_id));
  tier_job_id* jobs = calloc(chunks, sizeof(tier_job_id));
  int failed = 0;
  for (int round = 0; round < rounds && !failed; ++round) {
    uint32_t* words = data;
    for (uint64_t i = 0; i < bytes / 4; ++i) words[i] = (uint32_t)(i * 2654435761u) ^ (uint32_t)round;
    double t0 = now_s();
    for (uint64_t c = 0; c < chunks; ++c) {
      failed |= check(tier_offload(session, buffer, c * chunk, chunk, NULL, &objects[c], &jobs[c]), "offload");
    }
    for (uint64_t c = 0; c < chunks && !failed; ++c) failed |= check(tier_job_wait(session, jobs[c], -1), "offload job");
    double t1 = now_s();
    memset(data, 0, bytes);
    tier_reload_options reload;
    tier_reload_options_init(&reload);
    reload.flags = TIER_RELOAD_FREE_AFTER;
    double t2 = now_s();
    for (uint64_t c = chunks; c-- > 0 && !failed;) {  /* reverse order, as activations come back */
      failed |= check(tier_reload(session, objects[c], buffer, c * chunk, chunk, &reload, &jobs[c]), "reload");
    }
    for (uint64_t c = 0; c < chunks && !failed; ++c) failed |= check(tier_job_wait(session, jobs[c], -1), "reload job");
    double t3 = now_s();
    uint64_t bad = 0;
    for (uint64_t i = 0; i < bytes / 4; ++i) bad += words[i] != ((uint32_t)(i * 2654435761u) ^ (uint32_t)round);
    printf("round %d: offloaded %llu MiB at %.2f GB/s, reloaded at %.2f GB/s, %s\n", round,
           (unsigned long long)mib, bytes / (t1 - t0) / 1e9, bytes / (t3 - t2) / 1e9,
           bad == 0 ? "every byte verified" : "MISMATCH");
    if (bad != 0) failed = 1;
  }
  free(objects);
  free(jobs);
  tier_session_close(session);
  return failed;
}
