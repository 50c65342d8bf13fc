// Philox determinism and distribution sanity; error messages carry file:line.
#include <gtest/gtest.h>

#include <set>

#include "common/check.h"
#include "common/philox.h"

namespace ncf {

TEST(Philox, KnownAnswerZeroKey) {
  // Random123 known-answer test for philox4x32-10, counter 0, key 0.
  Philox4 r = philox4x32(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
}

TEST(Philox, KnownAnswerPi) {
  Philox4 r = philox4x32(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u,
                         0x299f31d0u);
  EXPECT_EQ(r.v[0], 0xd16cfe09u);
  EXPECT_EQ(r.v[1], 0x94fdccebu);
  EXPECT_EQ(r.v[2], 0x5001e420u);
  EXPECT_EQ(r.v[3], 0x24126ea1u);
}

TEST(Philox, BelowIsInRangeAndCoversIt) {
  CounterRng rng{42, kStreamShuffle, 7};
  std::set<uint64_t> seen;
  for (uint64_t d = 0; d < 2000; ++d) {
    uint64_t v = rng.below(d, 10);
    ASSERT_LT(v, 10u);
    seen.insert(v);
  }
  EXPECT_EQ(seen.size(), 10u);
}

TEST(Check, MessageHasExpressionAndLocation) {
  try {
    int x = 3;
    NCF_CHECK(x == 4, "x is ", x);
    FAIL() << "no throw";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("x == 4"), std::string::npos) << m;
    EXPECT_NE(m.find("x is 3"), std::string::npos) << m;
    EXPECT_NE(m.find("test_common.cc:"), std::string::npos) << m;
  }
}

}  // namespace ncf
