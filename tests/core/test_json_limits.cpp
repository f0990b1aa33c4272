// Tests for check_json_limits / parse_json_bounded: size and nesting checked in one pass before parsing, brackets
// inside strings (escaped quotes included) not counted, every refusal naming what and where. Label `core`.
#include <gtest/gtest.h>

#include <string>

#include "core/json_limits.h"

namespace lh {
namespace {

std::string nested(int depth) {
  return std::string(size_t(depth), '[') + std::string(size_t(depth), ']');
}

TEST(JsonLimits, NestingAndSizeAreBoundedBeforeParsing) {
  const JsonLimits limits{1000, 8};
  EXPECT_TRUE(check_json_limits(nested(8), limits, "x").ok());
  Status deep = check_json_limits(nested(9), limits, "the metrics line");
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(deep.message(), "the metrics line: JSON nested more than 8 levels deep (at byte 8)");
  // Objects count as arrays do; depth returns after each close.
  EXPECT_TRUE(check_json_limits(R"({"a":{"b":[1,{"c":[]}]},"d":[[[[[[]]]]]]})", limits, "x").ok());
  EXPECT_FALSE(check_json_limits(R"({"a":[{"b":[{"c":[{"d":[{"e":1}]}]}]}]})", limits, "x").ok());
  // Brackets in strings are text, an escaped quote does not end its string, an escaped backslash does not escape.
  EXPECT_TRUE(check_json_limits("[\"" + std::string(50, '[') + "\"]", limits, "x").ok());
  EXPECT_TRUE(check_json_limits(R"(["\"[[[[[[[[[[", "\\"])", limits, "x").ok());
  EXPECT_FALSE(check_json_limits(R"(["\\"[[[[[[[[[[]]]]]]]]]]])", limits, "x").ok());
  Status big = check_json_limits(std::string(1001, ' '), limits, "a ctl request");
  EXPECT_EQ(big.message(), "a ctl request: 1001 bytes of JSON, more than the 1000 allowed");
  // 100,000 levels (what crashed the coordinator) are refused without recursion, at the default limits too.
  EXPECT_FALSE(check_json_limits(nested(100000), JsonLimits{size_t(1) << 20}, "x").ok());
}

TEST(JsonLimits, ParseBoundedGivesTheValueOrANamedError) {
  auto v = parse_json_bounded(R"({"step": 3, "links": [{"src": 0}]})", JsonLimits{}, "m");
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ((*v)["step"].get<int>(), 3);
  EXPECT_NE(parse_json_bounded("{\"step\":", JsonLimits{}, "m").status().message().find("m: not valid JSON (at byte "),
            std::string::npos);
  EXPECT_NE(parse_json_bounded("[1e999]", JsonLimits{}, "m").status().message().find("m: not valid JSON ("),
            std::string::npos);
  EXPECT_NE(parse_json_bounded(nested(kMaxJsonDepth + 1), JsonLimits{}, "m").status().message().find("nested more"),
            std::string::npos);
}

}  // namespace
}  // namespace lh
