// A client built against the installed package only (its headers, its libtierclient.so): offloads
// a buffer with a known pattern, overwrites it, reloads it and checks every byte. Exits 0 and
// prints "round trip ok" on success.
//
//   tier_consumer [SOCKET]     (default: the library's default socket)
#include <tier/client.hpp>
#include <tier/tier.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  constexpr uint64_t kBytes = 4 << 20;
  try {
    tier::Session::Options options;
    if (argc > 1) options.socket_path = argv[1];
    options.name = "deb-consumer";
    tier::Session session(options);
    tier::HostBuffer buffer = session.AllocHost(kBytes);
    auto* bytes = static_cast<uint8_t*>(buffer.data);
    for (uint64_t i = 0; i < kBytes; ++i) bytes[i] = static_cast<uint8_t>((i * 131) ^ (i >> 11));

    auto [object, offload] = session.Offload(buffer.id, 0, kBytes);
    session.Wait(offload);
    std::memset(bytes, 0, kBytes);
    session.Wait(session.Reload(object, buffer.id, 0, kBytes, /*free_after=*/true));
    for (uint64_t i = 0; i < kBytes; ++i) {
      if (bytes[i] != static_cast<uint8_t>((i * 131) ^ (i >> 11))) {
        std::fprintf(stderr, "tier_consumer: byte %llu came back wrong\n",
                     static_cast<unsigned long long>(i));
        return 1;
      }
    }
    std::printf("round trip ok: %llu bytes, libtierclient %s\n",
                static_cast<unsigned long long>(kBytes), tier_version());
  } catch (const tier::Error& e) {
    std::fprintf(stderr, "tier_consumer: %s\n", e.what());
    return 1;
  }
  return 0;
}
