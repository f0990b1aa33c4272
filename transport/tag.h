// defines: lh::Tag (step, microbatch, role, shard) with its 64-bit packing.
// Used by DataPlane callers (StageRunner, collectives) to address packets, and by LinkMeter to name roles.
#pragma once

#include <cstdint>
#include <string>

#include "core/role.h"
#include "core/status.h"

namespace lh {

// Role (what a packet carries; the LinkMeter counts bytes per (peer, role, direction)) is core/role.h's.

// A packet's address within one link. A sender and a receiver agree on it; the DataPlane matches
// a received packet to the recv() with the same (peer, Tag). Field widths: step wraps at 2^24 (the
// caller passes step % 2^24 implicitly), microbatch < 4096, shard < 256.
struct Tag {
  uint32_t step = 0;        // 24 bits used
  uint16_t microbatch = 0;  // 12 bits used
  Role role = Role::kOther;
  uint8_t shard = 0;

  static constexpr int kStepBits = 24, kMicrobatchBits = 12, kRoleBits = 8, kShardBits = 8;
  static constexpr int kBits = kStepBits + kMicrobatchBits + kRoleBits + kShardBits;  // 52

  // Packs into the low 52 bits: [step:24][microbatch:12][role:8][shard:8]. Step is taken modulo
  // 2^24; a microbatch >= 4096 is a caller bug (asserted).
  uint64_t pack() const;
  static Result<Tag> unpack(uint64_t bits);  // fails on bits above 52 or an unknown role
  std::string to_string() const;             // "step 3 mb 1 act shard 0"
  bool operator==(const Tag& o) const { return pack() == o.pack(); }
};

inline Tag make_tag(uint32_t step, uint16_t microbatch, Role role, uint8_t shard = 0) {
  return Tag{step, microbatch, role, shard};
}

}  // namespace lh
