// defines: StreamState — what one stream (one link, one direction, one role) remembers between
// packets: ef residuals, PowerSGD warm starts, AQ-SGD per-sample memories, the packet counter.
// Used by CodecChain::encode/decode, parallel's links, and checkpoints (cereal save/load).
#pragma once

#include <cereal/types/map.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "compress/wire.h"
#include "core/tensor.h"

namespace lh::compress {

// State of one stage of a chain, keyed by the stage's place in the chain (see StreamState::stages).
struct StageState {
  std::string owner;                  // canonical spec of the stage that wrote it; a new owner resets it
  Tensor residual;                    // ef: e = (x + e) − decoded
  Tensor warm_q;                      // lowrank: Q (m×r) of the last call
  std::map<int64_t, Tensor> memory;   // delta: last decoded value per sample id

  template <class Archive>
  void save(Archive& ar) const;
  template <class Archive>
  void load(Archive& ar);
};

class StreamState {
 public:
  explicit StreamState(Role role = Role::kActivation, uint64_t seed = 0) : role_(role), seed_(seed) {}

  Role role() const { return role_; }
  uint64_t seed() const { return seed_; }
  uint64_t packets_encoded() const { return sequence_; }

  // Internal to the codecs: a stage's state, reset when a different stage claims the key.
  StageState& stage(const std::string& key, const std::string& owner);
  const std::map<std::string, StageState>& stages() const { return stages_; }
  uint64_t next_sequence() { return sequence_++; }
  // Cache of seeded subspace bases on each device (regenerated from the seed, never serialised).
  std::map<std::string, Tensor>& basis_cache() { return basis_cache_; }
  // Drops everything learnt (after a codec change the stages reset on their own).
  void reset();

  template <class Archive>
  void save(Archive& ar) const {
    ar(static_cast<uint8_t>(role_), seed_, sequence_, stages_);
  }
  template <class Archive>
  void load(Archive& ar) {
    uint8_t role = 0;
    ar(role, seed_, sequence_, stages_);
    role_ = static_cast<Role>(role < kNumCodecRoles ? role : 0);
    basis_cache_.clear();
  }

 private:
  Role role_;
  uint64_t seed_;
  uint64_t sequence_ = 0;
  std::map<std::string, StageState> stages_;
  std::map<std::string, Tensor> basis_cache_;
};

// A tensor in a checkpoint: shape and fp32 contents (copied from the GPU when it lives there);
// it comes back on the CPU and moves to the stream's device on first use.
struct TensorBlob {
  Shape shape;
  std::vector<float> values;
  bool present = false;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(present, shape, values);
  }
  static TensorBlob of(const Tensor& t);
  Tensor to_tensor() const;  // undefined Tensor when absent or inconsistent
};

template <class Archive>
void StageState::save(Archive& ar) const {
  std::map<int64_t, TensorBlob> mem;
  for (const auto& [id, t] : memory) mem[id] = TensorBlob::of(t);
  ar(owner, TensorBlob::of(residual), TensorBlob::of(warm_q), mem);
}

template <class Archive>
void StageState::load(Archive& ar) {
  TensorBlob r, q;
  std::map<int64_t, TensorBlob> mem;
  ar(owner, r, q, mem);
  residual = r.to_tensor();
  warm_q = q.to_tensor();
  memory.clear();
  for (const auto& [id, b] : mem) memory[id] = b.to_tensor();
}

}  // namespace lh::compress
