#include "common/thread_role.h"

namespace tier {
namespace {

thread_local ThreadRole current_role = ThreadRole::kOther;

}  // namespace

void SetThreadRole(ThreadRole role) { current_role = role; }
ThreadRole CurrentThreadRole() { return current_role; }

const char* ThreadRoleName(ThreadRole role) {
  switch (role) {
    case ThreadRole::kOther:
      return "other";
    case ThreadRole::kDeviceWorker:
      return "device worker";
    case ThreadRole::kReleaser:
      return "release thread";
    case ThreadRole::kRingPoller:
      return "ring poller";
    case ThreadRole::kSpillIo:
      return "spill I/O";
  }
  return "?";
}

const char* GpuCallClassName(GpuCallClass call) {
  switch (call) {
    case GpuCallClass::kEnqueue:
      return "enqueue";
    case GpuCallClass::kSetup:
      return "setup";
    case GpuCallClass::kRelease:
      return "release";
  }
  return "?";
}

bool MayCall(ThreadRole role, GpuCallClass call) {
  switch (role) {
    case ThreadRole::kDeviceWorker:
      return call == GpuCallClass::kEnqueue;
    case ThreadRole::kReleaser:
      return call == GpuCallClass::kRelease;
    case ThreadRole::kRingPoller:
    case ThreadRole::kSpillIo:
      return false;
    case ThreadRole::kOther:
      return call == GpuCallClass::kSetup;
  }
  return false;
}

}  // namespace tier
