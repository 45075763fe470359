// cider tests and benchmarks: set an environment variable for a scope and restore its previous value (or absence)
// afterwards. The backends read their switches ($CIDER_PDL, $CIDER_ATTN_TC_*, $CIDER_SPIN_US, ...) at every call,
// so a test or benchmark case can flip one around the calls it makes. value nullptr: leave it as it is (and still
// restore it afterwards).
#pragma once

#include <cstdlib>
#include <string>

namespace cider::test {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* prev = std::getenv(name);
    had_ = prev != nullptr;
    if (had_) prev_ = prev;
    if (value) ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_, prev_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string prev_;
};

}  // namespace cider::test
