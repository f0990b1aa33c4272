// Size and depth limits on JSON from other processes, checked before parsing (see json_limits.h).
#include "core/json_limits.h"

namespace lh {

Status check_json_limits(std::string_view text, const JsonLimits& limits, const std::string& what) {
  if (text.size() > limits.max_bytes)
    return invalid_argument(what + ": " + std::to_string(text.size()) + " bytes of JSON, more than the " +
                            std::to_string(limits.max_bytes) + " allowed");
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limits.max_depth)
        return invalid_argument(what + ": JSON nested more than " + std::to_string(limits.max_depth) +
                                " levels deep (at byte " + std::to_string(i) + ")");
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return Status::Ok();
}

Result<nlohmann::json> parse_json_bounded(std::string_view text, const JsonLimits& limits, const std::string& what) {
  LH_RETURN_IF_ERROR(check_json_limits(text, limits, what));
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return invalid_argument(what + ": not valid JSON (at byte " + std::to_string(e.byte) + ")");
  } catch (const nlohmann::json::exception& e) {  // out_of_range on a number such as 1e999
    return invalid_argument(what + ": not valid JSON (" + e.what() + ")");
  }
}

}  // namespace lh
