// The table of tierd's settings: one Key per setting, with its parser (which range-checks the
// value and names the key in its error) and its printer (the parser's inverse). The config file,
// the flags, --print-config and --help all go through this one table, so they cannot drift.
#ifndef TIER_DAEMON_CONFIG_CONFIG_KEYS_H_
#define TIER_DAEMON_CONFIG_CONFIG_KEYS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "daemon/config/config.h"

namespace tier::daemon::config {

// A setter parses and range-checks one value; its error names the key but not where the value came
// from (the caller adds "file:line" or "flag --x").
using Setter = std::function<absl::Status(absl::string_view value, Config& config)>;
using Printer = std::function<std::string(const Config& config)>;

struct Key {
  absl::string_view name;
  absl::string_view section;  // heading in DescribeConfig and the shipped tierd.conf
  std::string hint;           // value placeholder in --help
  absl::string_view help;     // one line
  Setter set;
  Printer print;
  bool flag_only = false;  // `config` names the file, so it cannot be in one
};

// Every key, in the order --print-config and --help show them (grouped by section).
const std::vector<Key>& Keys();
// The key `name`, or null.
const Key* FindKey(absl::string_view name);

}  // namespace tier::daemon::config

#endif  // TIER_DAEMON_CONFIG_CONFIG_KEYS_H_
