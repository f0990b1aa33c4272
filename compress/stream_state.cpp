// StreamState bookkeeping and the checkpoint form of its tensors. Used by the codec chain and
// by checkpoints of links.
#include "compress/stream_state.h"

#include <cstring>

namespace lh::compress {

StageState& StreamState::stage(const std::string& key, const std::string& owner) {
  StageState& s = stages_[key];
  if (s.owner != owner) {
    s = StageState{};
    s.owner = owner;
  }
  return s;
}

void StreamState::reset() {
  sequence_ = 0;
  stages_.clear();
  basis_cache_.clear();
}

TensorBlob TensorBlob::of(const Tensor& t) {
  TensorBlob b;
  if (!t.defined()) return b;
  b.present = true;
  b.shape = t.shape();
  b.values = t.to_vector();
  return b;
}

Tensor TensorBlob::to_tensor() const {
  if (!present) return Tensor();
  for (int64_t d : shape)
    if (d < 0) return Tensor();
  if (shape_numel(shape) != static_cast<int64_t>(values.size())) return Tensor();
  Tensor t = Tensor::empty(shape);
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(float));
  return t;
}

}  // namespace lh::compress
