// defines: lh::JsonLimits, check_json_limits, parse_json_bounded — JSON text from another process (a worker's step
// metrics, a ctl request's arguments, a checkpoint manifest, a plan's configuration) is checked for size and
// nesting before nlohmann parses it: a 200 KB line nested 100,000 deep would overflow the stack where a parsed
// value is copied or compared (those recurse). Used by the coordinator, the checkpoint store, launch and ctl.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/status.h"

namespace lh {

// Every JSON document longhaul writes nests fewer than 16 levels (a manifest's job configuration is the deepest).
inline constexpr int kMaxJsonDepth = 64;

struct JsonLimits {
  size_t max_bytes = size_t(1) << 20;
  int max_depth = kMaxJsonDepth;
};

// kInvalidArgument naming `what` when `text` is longer than max_bytes or nests arrays/objects deeper than max_depth
// (counted outside strings, in one pass without recursion; whether it is valid JSON is the parser's to say).
Status check_json_limits(std::string_view text, const JsonLimits& limits, const std::string& what);

// check_json_limits, then a parse that does not throw: kInvalidArgument naming `what` and the byte where parsing
// failed.
Result<nlohmann::json> parse_json_bounded(std::string_view text, const JsonLimits& limits, const std::string& what);

}  // namespace lh
