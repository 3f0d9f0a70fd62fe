#include <gtest/gtest.h>
TEST(LargeTensor, Placeholder) { GTEST_SKIP() << "placeholder"; }
