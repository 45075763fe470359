// core/env.h: environment switches are read as a flag, an integer or a word; unset or empty means the default, and
// any other value is an error naming the operation and the variable (never silently the default).
#include <gtest/gtest.h>

#include <string>

#include "core/env.h"
#include "core/error.h"
#include "support/scoped_env.h"

namespace cider {
namespace {

// The error of f() names op and the variable.
template <typename F>
void expect_env_error(F&& f, const char* what) {
  try {
    f();
    ADD_FAILURE() << what << " was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("test.env"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CIDER_TEST_SWITCH"), std::string::npos) << e.what();
  }
}

TEST(EnvSwitch, FlagDefaultsZeroOneAndErrors) {
  {
    const test::ScopedEnv unset("CIDER_TEST_SWITCH", nullptr);
    EXPECT_TRUE(env_flag("CIDER_TEST_SWITCH", true, "test.env"));
    EXPECT_FALSE(env_flag("CIDER_TEST_SWITCH", false, "test.env"));
  }
  {
    const test::ScopedEnv empty("CIDER_TEST_SWITCH", "");
    EXPECT_TRUE(env_flag("CIDER_TEST_SWITCH", true, "test.env"));
  }
  {
    const test::ScopedEnv zero("CIDER_TEST_SWITCH", "0");
    EXPECT_FALSE(env_flag("CIDER_TEST_SWITCH", true, "test.env"));
  }
  {
    const test::ScopedEnv one("CIDER_TEST_SWITCH", "1");
    EXPECT_TRUE(env_flag("CIDER_TEST_SWITCH", false, "test.env"));
  }
  for (const char* bad : {"off", "2", "01", "true", " 1"}) {
    const test::ScopedEnv v("CIDER_TEST_SWITCH", bad);
    expect_env_error([] { (void)env_flag("CIDER_TEST_SWITCH", true, "test.env"); }, bad);
  }
}

TEST(EnvSwitch, IntegerInRange) {
  {
    const test::ScopedEnv unset("CIDER_TEST_SWITCH", nullptr);
    EXPECT_EQ(env_int("CIDER_TEST_SWITCH", 3, 1, 16, "test.env"), 3);
  }
  {
    const test::ScopedEnv v("CIDER_TEST_SWITCH", "16");
    EXPECT_EQ(env_int("CIDER_TEST_SWITCH", 3, 1, 16, "test.env"), 16);
  }
  for (const char* bad : {"0", "17", "4x", "x", "-1", "99999999999999999999"}) {
    const test::ScopedEnv v("CIDER_TEST_SWITCH", bad);
    expect_env_error([] { (void)env_int("CIDER_TEST_SWITCH", 3, 1, 16, "test.env"); }, bad);
  }
}

TEST(EnvSwitch, WordFromSet) {
  {
    const test::ScopedEnv unset("CIDER_TEST_SWITCH", nullptr);
    EXPECT_EQ(env_word("CIDER_TEST_SWITCH", "auto", {"auto", "mma"}, "test.env"), "auto");
  }
  {
    const test::ScopedEnv v("CIDER_TEST_SWITCH", "mma");
    EXPECT_EQ(env_word("CIDER_TEST_SWITCH", "auto", {"auto", "mma"}, "test.env"), "mma");
  }
  const test::ScopedEnv v("CIDER_TEST_SWITCH", "wgmma3");
  try {
    (void)env_word("CIDER_TEST_SWITCH", "auto", {"auto", "mma"}, "test.env");
    ADD_FAILURE() << "wgmma3 was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("CIDER_TEST_SWITCH"), std::string::npos) << what;
    EXPECT_NE(what.find("auto, mma"), std::string::npos) << what;
    EXPECT_NE(what.find("wgmma3"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace cider
