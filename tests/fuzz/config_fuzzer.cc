// libFuzzer target: the config parser (daemon/config/config.h) on arbitrary text, as an operator's typo
// or a broken file could be. What it accepts must describe itself as text that parses back to
// the same settings (the round trip --print-config relies on).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "daemon/config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(bytes), size);
  tier::daemon::ConfigEnv env;
  env.root = true;
  tier::daemon::Config config = tier::daemon::DefaultConfig(env);
  if (!tier::daemon::ApplyConfigText(text, "fuzz.conf", &config).ok()) return 0;
  const std::string described = tier::daemon::DescribeConfig(config);
  tier::daemon::Config again = tier::daemon::DefaultConfig(env);
  again.socket_group = "not the same";  // so that a key left out of the description shows
  if (!tier::daemon::ApplyConfigText(described, "described", &again).ok()) std::abort();
  if (tier::daemon::DescribeConfig(again) != described) std::abort();
  return 0;
}
