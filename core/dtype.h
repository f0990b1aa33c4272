// defines: lh::DType and lh::Device, their sizes and names. Used by Tensor, codecs and the wire format.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lh {

// Values are part of the wire format and checkpoints: append only, never renumber.
enum class DType : uint8_t { f32 = 0, bf16 = 1, f16 = 2, i8 = 3, u8 = 4, i32 = 5, i64 = 6 };
constexpr int kNumDTypes = 7;

enum class Device : uint8_t { cpu = 0, cuda = 1 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i8: return 1;
    case DType::u8: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}

inline bool dtype_valid(uint32_t raw) { return raw < static_cast<uint32_t>(kNumDTypes); }

const char* dtype_name(DType t);
const char* device_name(Device d);

template <class T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::f32; };
template <> struct DTypeOf<int8_t> { static constexpr DType value = DType::i8; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::u8; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::i32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::i64; };
// bf16 and f16 are stored as uint16_t bit patterns; access them with data<uint16_t>() after a dtype check.

}  // namespace lh
