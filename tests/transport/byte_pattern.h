// defines: pattern(n, seed) — deterministic test bytes that differ per seed and position, so a packet
// that arrives truncated, reordered or from the wrong sender fails its comparison. Used by the data-plane tests.
#pragma once

#include <cstdint>

#include "transport/data_plane.h"

namespace lh::test {

inline Bytes pattern(size_t n, uint32_t seed) {
  Bytes b(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    b[i] = uint8_t(x >> 24);
  }
  return b;
}

}  // namespace lh::test
