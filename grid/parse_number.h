// defines: strict whole-string parsing of integers and numbers from user text (flags, link names,
// partition strings). Used by grid/topology, partition and codec_plan.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace lh {

// The whole of `text` as a base-10 integer (optional sign, no spaces, no trailing characters, in
// range); otherwise an InvalidArgument naming `what` and quoting the text.
Result<int64_t> parse_int64(const std::string& text, const std::string& what);
Result<int> parse_int(const std::string& text, const std::string& what);
// The whole of `text` as a finite floating-point number.
Result<double> parse_double(const std::string& text, const std::string& what);

// Strips ASCII spaces and tabs from both ends.
std::string trim_spaces(const std::string& text);

}  // namespace lh
