// defines: value_of(Result<T>) for tests — the value, or an abort naming the Status when there is none.
// Used by the tests in tests/parallel.
#pragma once

#include <utility>

#include "core/status.h"

namespace lh {

template <class T>
T value_of(Result<T> r) {
  LH_ASSERT(r.ok(), "expected a value, got " + r.status().to_string());
  return std::move(r).value();
}

}  // namespace lh
