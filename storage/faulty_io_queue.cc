#include "storage/faulty_io_queue.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/mutex.h"
#include "common/status.h"

namespace tier::storage {
namespace {

std::string Describe(const IoRequest& r) {
  if (r.op == IoOp::kSync) return absl::StrCat("injected fault: fdatasync of file ", r.file);
  return absl::StrCat("injected fault: ", r.op == IoOp::kRead ? "read" : "write", " of ", r.len,
                      " bytes at offset ", r.offset, " of file ", r.file);
}

}  // namespace

absl::StatusOr<std::vector<FaultRule>> ParseFaultRules(absl::string_view spec) {
  std::vector<FaultRule> rules;
  if (spec.empty()) return rules;
  for (absl::string_view text : absl::StrSplit(spec, ',')) {
    std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("fault rule '", std::string(text), "': ", std::string(why),
                       " (expected OP:FAULT[:SKIP[:TIMES]], OP read|write|sync, "
                       "FAULT eio|enospc|short|corrupt)"));
    };
    if (parts.size() < 2 || parts.size() > 4) return bad("wrong number of fields");
    FaultRule rule;
    if (parts[0] == "read") {
      rule.op = IoOp::kRead;
    } else if (parts[0] == "write") {
      rule.op = IoOp::kWrite;
    } else if (parts[0] == "sync") {
      rule.op = IoOp::kSync;
    } else {
      return bad("unknown op");
    }
    if (parts[1] == "eio") {
      rule.error = EIO;
    } else if (parts[1] == "enospc") {
      rule.error = ENOSPC;
    } else if (parts[1] == "short" && rule.op != IoOp::kSync) {
      rule.action = FaultRule::Action::kShort;
    } else if (parts[1] == "corrupt" && rule.op == IoOp::kRead) {
      rule.action = FaultRule::Action::kCorrupt;
    } else {
      return bad("unknown fault");
    }
    if (parts.size() > 2 && !absl::SimpleAtoi(parts[2], &rule.skip)) return bad("bad SKIP");
    if (parts.size() > 3 && (!absl::SimpleAtoi(parts[3], &rule.times) || rule.times == 0 ||
                             rule.times < -1)) {
      return bad("bad TIMES");
    }
    rules.push_back(rule);
  }
  return rules;
}

FaultyIoQueue::FaultyIoQueue(std::unique_ptr<IoQueue> inner)
    : IoQueueWrapper(std::move(inner)),
      name_(absl::StrCat("faulty(", std::string(this->inner()->name()), ")")) {}

int FaultyIoQueue::AddRule(const FaultRule& rule) {
  MutexLock lock(&mu_);
  rules_.push_back(RuleState{rule, rule.skip, rule.times, 0});
  return static_cast<int>(rules_.size() - 1);
}

void FaultyIoQueue::ClearRules() {
  MutexLock lock(&mu_);
  // Keep the entries (ids stay valid for fired()) but make them inert.
  for (RuleState& r : rules_) r.times_left = 0;
}

uint64_t FaultyIoQueue::fired(int id) const {
  MutexLock lock(&mu_);
  return id >= 0 && static_cast<size_t>(id) < rules_.size() ? rules_[id].fired : 0;
}

uint64_t FaultyIoQueue::total_fired() const {
  MutexLock lock(&mu_);
  return total_fired_;
}

uint32_t FaultyIoQueue::outstanding() const {
  return inner()->outstanding() + static_cast<uint32_t>(ready_.size());
}

int FaultyIoQueue::Match(const IoRequest& request, FaultRule* fired) {
  for (size_t i = 0; i < rules_.size(); ++i) {
    RuleState& r = rules_[i];
    const FaultRule& rule = r.rule;
    if (r.times_left == 0 || rule.op != request.op) continue;
    if (rule.file >= 0 &&
        (request.file < rule.file || request.file >= rule.file + rule.file_count)) {
      continue;
    }
    if (request.op != IoOp::kSync &&
        (request.offset >= rule.offset_end || request.offset + request.len <= rule.offset_begin)) {
      continue;
    }
    if (r.skip_left > 0) {
      --r.skip_left;
      continue;
    }
    if (r.times_left > 0) --r.times_left;
    ++r.fired;
    ++total_fired_;
    *fired = rule;
    return static_cast<int>(i);
  }
  return -1;
}

absl::Status FaultyIoQueue::Enqueue(const IoRequest& request) {
  if (outstanding() >= depth()) {
    return absl::ResourceExhaustedError(absl::StrCat(name_, " queue full (depth ", depth(), ")"));
  }
  if (absl::Status s = CheckBuffer(request); !s.ok()) return s;
  FaultRule rule;
  int fired;
  {
    MutexLock lock(&mu_);
    fired = Match(request, &rule);
  }
  Tracked tracked{request, fired, rule.action, rule.error, 0};
  IoRequest inner = request;
  if (fired >= 0) {
    switch (rule.action) {
      case FaultRule::Action::kFail:
        ready_.push_back(IoCompletion{request.user_data,
                                      ErrnoStatus(Describe(request), rule.error), 0});
        return absl::OkStatus();
      case FaultRule::Action::kShort: {
        uint64_t part = rule.short_bytes != 0 ? rule.short_bytes : request.len / 2;
        if (part == 0 || part >= request.len) {
          ready_.push_back(IoCompletion{request.user_data,
                                        ErrnoStatus(Describe(request), rule.error), 0});
          return absl::OkStatus();
        }
        inner.len = part;
        break;
      }
      case FaultRule::Action::kCorrupt: {
        uint64_t lo = std::max(request.offset, rule.offset_begin);
        tracked.corrupt_offset =
            rule.corrupt_offset >= request.offset && rule.corrupt_offset < request.offset + request.len
                ? rule.corrupt_offset
                : lo;
        break;
      }
    }
  }
  inner.user_data = next_tag_;
  if (absl::Status s = IoQueueWrapper::Enqueue(inner); !s.ok()) return s;
  tracked_.emplace(next_tag_++, tracked);
  return absl::OkStatus();
}

int FaultyIoQueue::Poll(std::vector<IoCompletion>* out, bool wait) {
  std::vector<IoCompletion> inner;
  // Failures made locally are already complete: never block in the inner queue while we hold some.
  IoQueueWrapper::Poll(&inner, wait && ready_.empty());
  size_t before = out->size();
  for (IoCompletion& c : ready_) out->push_back(std::move(c));
  ready_.clear();
  for (IoCompletion& c : inner) {
    auto it = tracked_.find(c.user_data);
    if (it == tracked_.end()) continue;  // cannot happen: every inner request is tracked
    Tracked t = it->second;
    tracked_.erase(it);
    IoCompletion result{t.original.user_data, std::move(c.status), c.bytes};
    if (t.rule >= 0 && result.status.ok()) {
      if (t.action == FaultRule::Action::kShort) {
        result.status = ErrnoStatus(absl::StrCat(Describe(t.original), ": short transfer of ",
                                                 result.bytes, " bytes"),
                                    t.error);
      } else if (t.action == FaultRule::Action::kCorrupt) {
        t.original.buf[t.corrupt_offset - t.original.offset] ^= 0x10;
      }
    }
    out->push_back(std::move(result));
  }
  return static_cast<int>(out->size() - before);
}

}  // namespace tier::storage
