/* object_peer: another client of the persistent-object tests, as another user. It drops to --uid
 * (setgid and setuid: the test runs as root) before it opens its session, does one thing with a
 * named object, and prints one line: "<op> <STATUS_NAME>". C ABI only, like a foreign client.
 *
 *   object_peer --socket=PATH [--uid=N] open|read|stat|delete|create NAME [OWNER_UID]
 *
 * open: tier_object_open; stat: tier_object_stat; read: open, then reload the object into a buffer; delete: delete NAME of
 * OWNER_UID (default: its own); create: offload 4096 bytes into a new persistent object NAME.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "tier/tier.h"

int main(int argc, char** argv) {
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test that started us */
  const char* socket_path = NULL;
  long uid = -1;
  const char* positional[3] = {NULL, NULL, NULL};
  int n = 0;
  for (int i = 1; i < argc; ++i) {
    if (strncmp(argv[i], "--socket=", 9) == 0) socket_path = argv[i] + 9;
    else if (strncmp(argv[i], "--uid=", 6) == 0) uid = strtol(argv[i] + 6, NULL, 10);
    else if (n < 3) positional[n++] = argv[i];
  }
  if (n < 2) {
    fprintf(stderr, "usage: object_peer --socket=PATH [--uid=N] OP NAME [OWNER_UID]\n");
    return 2;
  }
  const char* op = positional[0];
  const char* name = positional[1];
  if (uid >= 0 && (setgid((gid_t)uid) != 0 || setuid((uid_t)uid) != 0)) {
    perror("object_peer: setuid");
    return 2;
  }
  tier_session_options options;
  tier_session_options_init(&options);
  options.socket_path = socket_path;
  options.name = "object_peer";
  tier_session* session = NULL;
  tier_status status = tier_session_open(&options, &session);
  if (status != TIER_OK) {
    printf("session %s %s\n", tier_status_name(status), tier_last_error());
    return 1;
  }
  if (strcmp(op, "open") == 0 || strcmp(op, "read") == 0) {
    tier_object_id object = 0;
    uint64_t len = 0;
    status = tier_object_open(session, name, &object, &len);
    if (status == TIER_OK && strcmp(op, "read") == 0) {
      void* data = NULL;
      tier_buffer_id buffer = 0;
      tier_job_id job = 0;
      status = tier_buffer_alloc_host(session, len, &data, &buffer);
      if (status == TIER_OK) status = tier_reload(session, object, buffer, 0, len, NULL, &job);
      if (status == TIER_OK) status = tier_job_wait(session, job, -1);
    }
  } else if (strcmp(op, "stat") == 0) {
    tier_object_info info;
    memset(&info, 0, sizeof(info));
    info.struct_size = sizeof(info);
    status = tier_object_stat(session, name, &info);
  } else if (strcmp(op, "delete") == 0) {
    uint32_t owner = positional[2] != NULL ? (uint32_t)strtoul(positional[2], NULL, 10)
                                           : TIER_UID_SELF;
    status = tier_object_delete(session, name, owner);
  } else if (strcmp(op, "create") == 0) {
    void* data = NULL;
    tier_buffer_id buffer = 0;
    tier_object_id object = 0;
    tier_job_id job = 0;
    status = tier_buffer_alloc_host(session, 4096, &data, &buffer);
    if (status == TIER_OK) {
      memset(data, 0x5a, 4096);
      status = tier_offload_persistent(session, name, buffer, 0, 4096, NULL, &object, &job);
    }
    if (status == TIER_OK) status = tier_job_wait(session, job, -1);
  } else {
    fprintf(stderr, "object_peer: unknown op %s\n", op);
    return 2;
  }
  printf("%s %s\n", op, tier_status_name(status));
  fflush(stdout);
  tier_session_close(session);
  return 0;
}
