// Strict number parsing for user-typed text: the whole string must be the number.
// Used by grid/topology, partition and codec_plan.
#include "grid/parse_number.h"

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>

namespace lh {

std::string trim_spaces(const std::string& text) {
  size_t b = text.find_first_not_of(" \t");
  if (b == std::string::npos) return {};
  size_t e = text.find_last_not_of(" \t");
  return text.substr(b, e - b + 1);
}

Result<int64_t> parse_int64(const std::string& text, const std::string& what) {
  if (text.empty()) return invalid_argument(what + ": expected an integer, got an empty string");
  // strtoll skips leading spaces and accepts "0x"; neither belongs in a strict parse.
  const char first = text[0];
  if (!(first == '-' || first == '+' || (first >= '0' && first <= '9')))
    return invalid_argument(what + ": expected an integer, got '" + text + "'");
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0') return invalid_argument(what + ": expected an integer, got '" + text + "'");
  if (errno == ERANGE) return invalid_argument(what + ": integer '" + text + "' is out of range");
  return static_cast<int64_t>(v);
}

Result<int> parse_int(const std::string& text, const std::string& what) {
  LH_ASSIGN_OR_RETURN(int64_t v, parse_int64(text, what));
  if (v < INT_MIN || v > INT_MAX) return invalid_argument(what + ": integer '" + text + "' is out of range");
  return static_cast<int>(v);
}

Result<double> parse_double(const std::string& text, const std::string& what) {
  if (text.empty()) return invalid_argument(what + ": expected a number, got an empty string");
  const char first = text[0];
  if (!(first == '-' || first == '+' || first == '.' || (first >= '0' && first <= '9')))
    return invalid_argument(what + ": expected a number, got '" + text + "'");
  if (text.find_first_of("xXpP") != std::string::npos)  // no hexadecimal floats
    return invalid_argument(what + ": expected a decimal number, got '" + text + "'");
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0') return invalid_argument(what + ": expected a number, got '" + text + "'");
  if (errno == ERANGE || !std::isfinite(v)) return invalid_argument(what + ": number '" + text + "' is out of range");
  return v;
}

}  // namespace lh
