#include "daemon/config/config.h"

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/config/config_keys.h"
#include "daemon/config/config_values.h"

namespace tier::daemon {
namespace {

// This Abseil build has its own string_view type; the public header speaks std::string_view.
absl::string_view ToAbsl(std::string_view text) {
  return absl::string_view(text.data(), text.size());
}

// Where a value came from, prefixed to its error: "tierd.conf:12: " or "flag --x=y: ".
absl::Status WithOrigin(absl::string_view origin, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(origin, ": ", status.message()));
}

// Environment values that name directories count only when absolute (as the XDG spec says).
std::string AbsoluteEnv(const char* name, bool first_of_list = false) {
  const char* value = std::getenv(name);
  if (value == nullptr || value[0] != '/') return "";
  std::string text = value;
  // systemd joins several RuntimeDirectory=/StateDirectory= entries with ':'.
  if (first_of_list) text = text.substr(0, text.find(':'));
  return text;
}

}  // namespace

ConfigEnv ProcessConfigEnv() {
  ConfigEnv env;
  env.root = ::geteuid() == 0;
  env.runtime_directory = AbsoluteEnv("RUNTIME_DIRECTORY", /*first_of_list=*/true);
  env.state_directory = AbsoluteEnv("STATE_DIRECTORY", /*first_of_list=*/true);
  env.xdg_runtime_dir = AbsoluteEnv("XDG_RUNTIME_DIR");
  env.xdg_state_home = AbsoluteEnv("XDG_STATE_HOME");
  env.home = AbsoluteEnv("HOME");
  return env;
}

Config DefaultConfig(const ConfigEnv& env) {
  auto absolute = [](const std::string& path) { return absl::StartsWith(path, "/"); };
  std::string socket_dir = "/run/tierd";
  if (absolute(env.runtime_directory)) {
    socket_dir = env.runtime_directory;
  } else if (!env.root && absolute(env.xdg_runtime_dir)) {
    socket_dir = env.xdg_runtime_dir + "/tierd";
  }
  std::string state_dir = "/var/lib/tierd";
  if (absolute(env.state_directory)) {
    state_dir = env.state_directory;
  } else if (!env.root && absolute(env.xdg_state_home)) {
    state_dir = env.xdg_state_home + "/tierd";
  } else if (!env.root && absolute(env.home)) {
    state_dir = env.home + "/.local/state/tierd";
  }
  Config config;
  config.socket_path = socket_dir + "/tierd.sock";
  config.state_dir = state_dir;
  return config;
}

Config DefaultConfig() { return DefaultConfig(ProcessConfigEnv()); }

absl::Status ApplyConfigText(std::string_view text_in, std::string_view origin_in, Config* config) {
  absl::string_view text = ToAbsl(text_in);
  absl::string_view origin = ToAbsl(origin_in);
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);  // also drops a '\r' of CRLF files
    if (line.empty() || line[0] == '#') continue;
    std::string where = absl::StrCat(origin, ":", line_number);
    size_t equals = line.find('=');
    if (equals == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected 'key = value', got '", line, "'"));
    }
    absl::string_view name = absl::StripTrailingAsciiWhitespace(line.substr(0, equals));
    absl::string_view value = absl::StripLeadingAsciiWhitespace(line.substr(equals + 1));
    const config::Key* key = config::FindKey(name);
    if (key == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown key '", name, "'"));
    }
    if (key->flag_only) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": '", name, "' can only be given as a flag (--", name, "=...)"));
    }
    if (absl::Status status = key->set(value, *config); !status.ok())
      return WithOrigin(where, status);
  }
  return absl::OkStatus();
}

absl::Status ApplyConfigFile(const std::string& path, Config* config) {
  absl::StatusOr<std::string> text = config::ReadWholeFile(path);
  if (!text.ok())
    return absl::Status(text.status().code(),
                        absl::StrCat("config file: ", text.status().message()));
  if (absl::Status status = ApplyConfigText(*text, path, config); !status.ok()) return status;
  config->config_file = path;
  return absl::OkStatus();
}

absl::StatusOr<Config> LoadConfig(const std::vector<std::string>& args) {
  // One pass to split the flags into (flag text, key, value); the file goes in before any of them
  // applies, so flags win wherever they stand relative to --config.
  struct Flag {
    std::string text;
    const config::Key* key;
    std::string value;
  };
  std::vector<Flag> flags;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!absl::StartsWith(arg, "--") || arg.size() == 2) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    size_t equals = arg.find('=');
    std::string name = arg.substr(2, equals == std::string::npos ? std::string::npos : equals - 2);
    for (char& c : name) {
      if (c == '-') c = '_';
    }
    const config::Key* key = config::FindKey(name);
    if (key == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (see --help)"));
    }
    Flag flag{arg, key, ""};
    if (equals != std::string::npos) {
      flag.value = arg.substr(equals + 1);
    } else if (i + 1 < args.size() && !absl::StartsWith(args[i + 1], "--")) {
      flag.value = args[++i];
      flag.text = absl::StrCat(arg, " ", flag.value);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("flag ", arg, " needs a value (--", name, "=VALUE)"));
    }
    flags.push_back(std::move(flag));
  }

  std::string file;
  bool file_named_by_flag = false;
  for (const Flag& flag : flags) {
    if (flag.key->flag_only) {
      file = flag.value;  // the last --config wins; --config= reads none
      file_named_by_flag = true;
    }
  }
  if (!file_named_by_flag) {
    if (const char* env = std::getenv("TIERD_CONFIG"); env != nullptr) file = env;
  }

  Config config = DefaultConfig();
  if (!file.empty()) {
    if (absl::Status status = ApplyConfigFile(file, &config); !status.ok()) {
      if (!file_named_by_flag && absl::IsNotFound(status)) {
        return absl::Status(status.code(),
                            absl::StrCat(status.message(), " (named by $TIERD_CONFIG)"));
      }
      return status;
    }
  }
  for (const Flag& flag : flags) {
    if (flag.key->flag_only) continue;
    if (absl::Status status = flag.key->set(flag.value, config); !status.ok()) {
      return WithOrigin(absl::StrCat("flag ", flag.text), status);
    }
  }
  if (absl::Status status = Finalize(&config); !status.ok()) return status;
  return config;
}

std::string DescribeConfig(const Config& config) {
  std::string text =
      config.config_file.empty()
          ? "# tierd settings (no config file)\n"
          : absl::StrCat("# tierd settings (config file: ", config.config_file, ")\n");
  absl::string_view section;
  for (const config::Key& key : config::Keys()) {
    if (key.flag_only) continue;
    if (key.section != section) {
      section = key.section;
      absl::StrAppend(&text, "\n# ", section, "\n");
    }
    std::string value = key.print(config);
    absl::StrAppend(&text, key.name, value.empty() ? " =" : " = ", value, "\n");
  }
  return text;
}

std::string ConfigUsage() {
  const Config defaults = DefaultConfig();
  std::string text;
  for (const config::Key& key : config::Keys()) {
    std::string flag = absl::StrCat("--", key.name, "=", key.hint);
    if (flag.size() < 30) flag.resize(30, ' ');
    std::string value = key.print(defaults);
    absl::StrAppend(&text, "  ", flag, " ", key.help);
    if (!value.empty()) absl::StrAppend(&text, " [", value, "]");
    absl::StrAppend(&text, "\n");
  }
  return text;
}

}  // namespace tier::daemon
