// core/env_switch.h: well-formed values set the setting, everything else leaves it (warned).
#include "core/env_switch.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace deepinfer {
namespace {

constexpr const char* kVar = "DEEPINFER_TEST_ENV_SWITCH";

struct EnvSwitch : ::testing::Test {
  void TearDown() override { unsetenv(kVar); }
  void set(const char* v) { setenv(kVar, v, 1); }
};

TEST_F(EnvSwitch, SwitchTakesZeroOrOneOnly) {
  bool flag = false;
  EXPECT_FALSE(read_env_switch(kVar, flag));  // unset
  set("1");
  EXPECT_TRUE(read_env_switch(kVar, flag));
  EXPECT_TRUE(flag);
  set("0");
  EXPECT_TRUE(read_env_switch(kVar, flag));
  EXPECT_FALSE(flag);
  for (const char* bad : {"", "yes", "2", "1 ", "01", "true"}) {
    set(bad);
    flag = true;
    EXPECT_FALSE(read_env_switch(kVar, flag)) << "'" << bad << "'";
    EXPECT_TRUE(flag) << "'" << bad << "' changed the flag";
  }
}

TEST_F(EnvSwitch, IntTakesTheRangeAndTheStep) {
  int64_t v = 128;
  EXPECT_FALSE(read_env_int(kVar, 32, 4096, 32, v));  // unset
  set("64");
  EXPECT_TRUE(read_env_int(kVar, 32, 4096, 32, v));
  EXPECT_EQ(v, 64);
  set("4096");
  EXPECT_TRUE(read_env_int(kVar, 32, 4096, 32, v));
  EXPECT_EQ(v, 4096);
  for (const char* bad : {"", "48", "0", "8192", "64k", " 64", "0x40", "-32", "99999999999999999999999"}) {
    set(bad);
    v = 128;
    EXPECT_FALSE(read_env_int(kVar, 32, 4096, 32, v)) << "'" << bad << "'";
    EXPECT_EQ(v, 128) << "'" << bad << "' changed the value";
  }
  set("5");  // step 1: any integer in range
  EXPECT_TRUE(read_env_int(kVar, 0, 5, 1, v));
  EXPECT_EQ(v, 5);
  set("6");
  EXPECT_FALSE(read_env_int(kVar, 0, 5, 1, v));
  EXPECT_EQ(v, 5);
}

}  // namespace
}  // namespace deepinfer
