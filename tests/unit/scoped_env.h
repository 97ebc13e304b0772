// Sets (or unsets) an environment variable for one scope and puts the old value back, for tests
// of code that reads the environment (config defaults, NOTIFY_SOCKET).
#ifndef TIER_TESTS_UNIT_SCOPED_ENV_H_
#define TIER_TESTS_UNIT_SCOPED_ENV_H_

#include <stdlib.h>

#include <cstdlib>
#include <optional>
#include <string>

namespace tier::testing {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace tier::testing

#endif  // TIER_TESTS_UNIT_SCOPED_ENV_H_
