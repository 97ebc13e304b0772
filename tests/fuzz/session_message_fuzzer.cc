// libFuzzer target: the session socket's request parser (daemon/sessions/session_message.h) on arbitrary
// bytes, as a hostile client could send them. A request that parses must be exactly what its
// bytes say; nothing may read past the message.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "daemon/sessions/segment_request.h"
#include "daemon/sessions/session_message.h"

namespace {

using tier::daemon::CheckSegmentExtend;
using tier::daemon::CheckSegmentRegister;
using tier::daemon::ParseMessage;
using tier::daemon::ParseRequestHeader;
using tier::daemon::SegmentPages;

// A segment's pages that passed the checks must be what the listener relies on: one descriptor
// per page, a non-zero page size, a total without overflow.
void CheckPages(const absl::StatusOr<SegmentPages>& pages, size_t fds) {
  if (!pages.ok()) return;
  if (pages->page_count != fds || pages->page_count == 0 ||
      pages->page_count > tier::wire::kMaxSegmentPagesPerMessage || pages->page_bytes == 0 ||
      pages->bytes / pages->page_bytes != pages->page_count) {
    std::abort();
  }
}

// The descriptors that came with the message: the fuzzer's last byte says how many.
size_t FdCount(absl::Span<const char> data) {
  return data.empty() ? 0 : static_cast<uint8_t>(data.back()) % (tier::wire::kMaxFds + 2);
}

template <typename Message>
void CheckBody(absl::Span<const char> data) {
  Message message;
  if (!ParseMessage(data, &message)) {
    if (data.size() == sizeof(Message)) std::abort();  // refused a well-sized body
    return;
  }
  if (data.size() != sizeof(Message) || std::memcmp(&message, data.data(), sizeof(Message)) != 0) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  absl::Span<const char> data(reinterpret_cast<const char*>(bytes), size);
  absl::StatusOr<tier::wire::MessageHeader> header = ParseRequestHeader(data);
  if (!header.ok()) return 0;
  if (size < sizeof(tier::wire::MessageHeader) ||
      header->version != tier::wire::kProtocolVersion) {
    std::abort();  // accepted what it must refuse
  }
  switch (static_cast<tier::wire::MessageType>(header->type)) {
    case tier::wire::MessageType::kAttachRequest:
      CheckBody<tier::wire::AttachRequest>(data);
      break;
    case tier::wire::MessageType::kRegisterBuffer: {
      CheckBody<tier::wire::RegisterBuffer>(data);
      tier::wire::RegisterBuffer request;
      if (ParseMessage(data, &request) &&
          request.kind == static_cast<uint32_t>(tier::wire::BufferKind::kCudaVmmSegment)) {
        absl::StatusOr<SegmentPages> pages = CheckSegmentRegister(request, FdCount(data));
        CheckPages(pages, FdCount(data));
        if (pages.ok() && (pages->reserve_bytes < pages->bytes ||
                           pages->reserve_bytes > tier::wire::kMaxSegmentReserveBytes ||
                           pages->bytes != request.bytes)) {
          std::abort();
        }
      }
      break;
    }
    case tier::wire::MessageType::kExtendBuffer: {
      CheckBody<tier::wire::ExtendBuffer>(data);
      tier::wire::ExtendBuffer request;
      if (ParseMessage(data, &request)) {
        CheckPages(CheckSegmentExtend(request, FdCount(data)), FdCount(data));
      }
      break;
    }
    case tier::wire::MessageType::kUnregisterBuffer:
      CheckBody<tier::wire::UnregisterBuffer>(data);
      break;
    case tier::wire::MessageType::kObjectRequest:
      CheckBody<tier::wire::ObjectRequest>(data);
      break;
    default:
      std::abort();  // a type the daemon does not receive got through
  }
  return 0;
}
