// defines: lh::PowerSgdConfig (the `powersgd:rank=R[+CODEC]` form of --compress-grad) and lh::PowerSgdBucket — one
// replica's PowerSGD state for one gradient bucket (Vogels et al. 2019): per weight matrix M (with error
// feedback added), P = M·Q is all-reduced, orthonormalized, Q = Mᵀ·P̂ is all-reduced, and M̂ = P̂·Q̂ᵀ replaces
// the gradient; Q warm-starts the next step. Vectors (biases, norm gains) and matrices too small to gain are
// averaged uncompressed. The collectives themselves are DpReducer's. Used by comm/dp_reducer.cpp.
#pragma once

#include <cereal/types/vector.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "core/gpt.h"
#include "core/status.h"

namespace lh {

struct PowerSgdConfig {
  int rank = 4;               // 1..1024
  std::string wire = "none";  // codec of P, Q and the uncompressed rest on the wire (e.g. bf16, fp16)
};
// Whether a --compress-grad spec asks for PowerSGD (starts with "powersgd").
bool is_powersgd_spec(const std::string& spec);
// "powersgd", "powersgd:rank=8", "powersgd:rank=4+bf16". Errors name the bad option or value.
Result<PowerSgdConfig> parse_powersgd(const std::string& spec);

class PowerSgdBucket {
 public:
  // The layout of `group` (its slices); `seed` makes the first Q, which must be the same on every replica.
  PowerSgdBucket(const ParamGroup& group, int rank, uint64_t seed);

  // Round 1 from this replica's gradient [group numel]: M := g + error per matrix; *p := every M·Q, *rest :=
  // the values sent uncompressed.
  void round1(const float* grads, std::vector<float>* p, std::vector<float>* rest);
  // Round 2 with P averaged over the replicas: orthonormalizes it (kept as P̂) and *q := every Mᵀ·P̂.
  void round2(const std::vector<float>& p_avg, std::vector<float>* q);
  // With Q averaged: writes M̂ = P̂·Q̂ᵀ and the averaged rest into grads, keeps error := M − M̂ and Q̂.
  void finish(float* grads, const std::vector<float>& q_avg, const std::vector<float>& rest_avg);

  int64_t matrix_values() const { return matrix_values_; }  // values the low-rank factors stand for
  int64_t p_values() const { return p_values_; }
  int64_t q_values() const { return q_values_; }
  int64_t rest_values() const { return rest_values_; }
  int matrices() const { return static_cast<int>(mats_.size()); }
  const std::vector<float>& error() const { return error_; }
  const std::vector<float>& q() const { return q_; }
  // Puts back a checkpoint's Q and error; refused when their sizes do not fit this bucket's layout.
  Status restore(std::vector<float> q, std::vector<float> error);

  template <class Archive>
  void serialize(Archive& ar) {
    ar(q_, error_);
  }

 private:
  struct Mat {
    int64_t offset = 0, rows = 0, cols = 0;  // in the group's buffer, row-major
    int r = 0;
    int64_t p_off = 0, q_off = 0, m_off = 0;  // into P, Q and the matrix-value arrays
  };
  std::vector<Mat> mats_;
  std::vector<std::pair<int64_t, int64_t>> rest_;  // [offset, numel) ranges sent uncompressed
  int64_t matrix_values_ = 0, p_values_ = 0, q_values_ = 0, rest_values_ = 0;
  std::vector<float> m_;      // M (gradient + error) of this step, per matrix, concatenated
  std::vector<float> q_;      // Q, warm start, per matrix
  std::vector<float> p_hat_;  // P̂ of this step
  std::vector<float> error_;  // per matrix, concatenated like m_
};

// Orthonormalizes the r columns of the row-major rows×r matrix `a` in place (modified Gram–Schmidt; a column
// that vanishes stays zero). Exposed for tests.
void orthonormalize_columns(float* a, int64_t rows, int r);

}  // namespace lh
