// defines: lh::WireOutputArchive / lh::WireInputArchive, cereal archives in cereal's binary layout whose
// reader never trusts a length prefix beyond the bytes actually present. Used by transport/messages.cpp.
#pragma once

#include <cereal/cereal.hpp>
#include <cereal/details/traits.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace lh {

class WireOutputArchive : public cereal::OutputArchive<WireOutputArchive, cereal::AllowEmptyClassElision> {
 public:
  explicit WireOutputArchive(std::vector<uint8_t>& out) : OutputArchive(this), out_(out) {}
  void saveBinary(const void* data, std::size_t size) {
    const auto* p = static_cast<const uint8_t*>(data);
    out_.insert(out_.end(), p, p + size);
  }

 private:
  std::vector<uint8_t>& out_;
};

// Throws cereal::Exception on a read past the end, and on any size prefix larger than the bytes
// left (every element we serialise takes at least one byte), so garbage cannot make it allocate.
class WireInputArchive : public cereal::InputArchive<WireInputArchive, cereal::AllowEmptyClassElision> {
 public:
  WireInputArchive(const uint8_t* data, std::size_t size) : InputArchive(this), p_(data), end_(data + size) {}
  void loadBinary(void* data, std::size_t size) {
    if (size == 0) return;  // an empty string or vector: its data() may be null, which memcpy must not get
    if (size > remaining())
      throw cereal::Exception("needs " + std::to_string(size) + " bytes, " + std::to_string(remaining()) + " left");
    std::memcpy(data, p_, size);
    p_ += size;
  }
  std::size_t remaining() const { return std::size_t(end_ - p_); }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

template <class T>
inline typename std::enable_if<std::is_arithmetic<T>::value, void>::type CEREAL_SAVE_FUNCTION_NAME(
    WireOutputArchive& ar, const T& t) {
  ar.saveBinary(std::addressof(t), sizeof(t));
}
template <class T>
inline typename std::enable_if<std::is_arithmetic<T>::value, void>::type CEREAL_LOAD_FUNCTION_NAME(WireInputArchive& ar,
                                                                                                   T& t) {
  if constexpr (std::is_same<T, bool>::value) {  // a byte other than 0 or 1 is no bool (loading it would be UB)
    uint8_t b = 0;
    ar.loadBinary(&b, 1);
    if (b > 1) throw cereal::Exception("a bool encoded as " + std::to_string(b));
    t = b == 1;
  } else {
    ar.loadBinary(std::addressof(t), sizeof(t));
  }
}
template <class T>
inline void CEREAL_SERIALIZE_FUNCTION_NAME(WireOutputArchive& ar, cereal::NameValuePair<T>& t) {
  ar(t.value);
}
template <class T>
inline void CEREAL_SERIALIZE_FUNCTION_NAME(WireInputArchive& ar, cereal::NameValuePair<T>& t) {
  ar(t.value);
}
template <class T>
inline void CEREAL_SAVE_FUNCTION_NAME(WireOutputArchive& ar, const cereal::SizeTag<T>& t) {
  ar(t.size);
}
template <class T>
inline void CEREAL_LOAD_FUNCTION_NAME(WireInputArchive& ar, cereal::SizeTag<T>& t) {
  ar(t.size);
  if (static_cast<unsigned long long>(t.size) > ar.remaining())
    throw cereal::Exception("size prefix " + std::to_string(static_cast<unsigned long long>(t.size)) + " exceeds the " +
                            std::to_string(ar.remaining()) + " bytes left");
}
template <class T>
inline void CEREAL_SAVE_FUNCTION_NAME(WireOutputArchive& ar, const cereal::BinaryData<T>& bd) {
  ar.saveBinary(bd.data, static_cast<std::size_t>(bd.size));
}
template <class T>
inline void CEREAL_LOAD_FUNCTION_NAME(WireInputArchive& ar, cereal::BinaryData<T>& bd) {
  ar.loadBinary(bd.data, static_cast<std::size_t>(bd.size));
}

}  // namespace lh

CEREAL_REGISTER_ARCHIVE(lh::WireOutputArchive)
CEREAL_REGISTER_ARCHIVE(lh::WireInputArchive)
CEREAL_SETUP_ARCHIVE_TRAITS(lh::WireInputArchive, lh::WireOutputArchive)
