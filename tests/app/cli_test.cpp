#include <gtest/gtest.h>
#include "tests/testing.h"
TEST(Cli, Runs) { auto r = vlmtest::run({vlmtest::vlmtrain_bin()}); EXPECT_EQ(r.exit_code, 0) << r.output; }
