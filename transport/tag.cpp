// Tag packing. Used by the DataPlane, LinkMeter and their callers.
#include "transport/tag.h"

namespace lh {

uint64_t Tag::pack() const {
  LH_ASSERT(microbatch < (1u << kMicrobatchBits), "microbatch " + std::to_string(microbatch) + " >= 4096");
  uint64_t s = step & ((1u << kStepBits) - 1);
  return (s << (kMicrobatchBits + kRoleBits + kShardBits)) | (uint64_t(microbatch) << (kRoleBits + kShardBits)) |
         (uint64_t(static_cast<uint8_t>(role)) << kShardBits) | shard;
}

Result<Tag> Tag::unpack(uint64_t bits) {
  if (bits >> kBits) return corrupt("tag has bits set above bit " + std::to_string(kBits));
  Tag t;
  t.shard = bits & 0xff;
  uint8_t r = (bits >> kShardBits) & 0xff;
  if (r >= kNumRoles) return corrupt("tag role " + std::to_string(r) + " is not a known role");
  t.role = static_cast<Role>(r);
  t.microbatch = (bits >> (kRoleBits + kShardBits)) & ((1u << kMicrobatchBits) - 1);
  t.step = uint32_t(bits >> (kMicrobatchBits + kRoleBits + kShardBits));
  return t;
}

std::string Tag::to_string() const {
  return "step " + std::to_string(step) + " mb " + std::to_string(microbatch) + " " + role_name(role) + " shard " +
         std::to_string(shard);
}

}  // namespace lh
