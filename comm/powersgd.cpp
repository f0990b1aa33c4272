// PowerSGD's per-bucket math: rank-r factors with error feedback and warm-started Q, on the CPU through
// OpenBLAS (core/ops matmul). Used by comm/dp_reducer.cpp.
#include "comm/powersgd.h"

#include <cmath>

#include "core/ops.h"
#include "core/rng.h"
#include "grid/parse_number.h"

namespace lh {

bool is_powersgd_spec(const std::string& spec) {
  return spec.rfind("powersgd", 0) == 0;
}

Result<PowerSgdConfig> parse_powersgd(const std::string& spec) {
  PowerSgdConfig c;
  const std::string grammar = "expected powersgd[:rank=R][+CODEC], e.g. powersgd:rank=4+bf16";
  const size_t plus = spec.find('+');
  const std::string head = spec.substr(0, plus);
  if (plus != std::string::npos) {
    c.wire = spec.substr(plus + 1);
    if (c.wire.empty()) return invalid_argument("'" + spec + "': nothing after '+'; " + grammar);
  }
  if (head == "powersgd") return c;
  if (head.rfind("powersgd:", 0) != 0) return invalid_argument("'" + spec + "': " + grammar);
  const std::string opts = head.substr(9);
  size_t pos = 0;
  while (true) {
    const size_t comma = opts.find(',', pos);
    const std::string item = opts.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key != "rank") return invalid_argument("'" + spec + "': unknown option '" + key + "'; " + grammar);
    auto r = parse_int(value, "rank");
    if (!r.ok() || *r < 1 || *r > 1024)
      return invalid_argument("'" + spec + "': rank must be an integer in 1..1024, got '" + value + "'");
    c.rank = *r;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return c;
}

void orthonormalize_columns(float* a, int64_t rows, int r) {
  for (int j = 0; j < r; ++j) {
    for (int k = 0; k < j; ++k) {
      double dot = 0;
      for (int64_t i = 0; i < rows; ++i) dot += double(a[i * r + k]) * a[i * r + j];
      for (int64_t i = 0; i < rows; ++i) a[i * r + j] -= float(dot) * a[i * r + k];
    }
    double norm = 0;
    for (int64_t i = 0; i < rows; ++i) norm += double(a[i * r + j]) * a[i * r + j];
    norm = std::sqrt(norm);
    const float inv = norm > 1e-20 ? float(1.0 / norm) : 0.0f;
    for (int64_t i = 0; i < rows; ++i) a[i * r + j] *= inv;
  }
}

PowerSgdBucket::PowerSgdBucket(const ParamGroup& group, int rank, uint64_t seed) {
  for (const ParamSlice& s : group.slices) {
    if (s.shape.size() == 2) {
      const int64_t rows = s.shape[0], cols = s.shape[1];
      const int r = int(std::min<int64_t>({int64_t(rank), rows, cols}));
      if ((rows + cols) * r < rows * cols) {  // the factors are smaller than the matrix
        Mat m;
        m.offset = s.offset;
        m.rows = rows;
        m.cols = cols;
        m.r = r;
        m.p_off = p_values_;
        m.q_off = q_values_;
        m.m_off = matrix_values_;
        p_values_ += rows * r;
        q_values_ += cols * r;
        matrix_values_ += rows * cols;
        mats_.push_back(m);
        continue;
      }
    }
    rest_.push_back({s.offset, s.numel()});
    rest_values_ += s.numel();
  }
  m_.assign(matrix_values_, 0.0f);
  error_.assign(matrix_values_, 0.0f);
  p_hat_.assign(p_values_, 0.0f);
  q_.resize(q_values_);
  Rng rng(seed, 0x5057534744ull);  // the same first Q on every replica
  for (float& v : q_) v = rng.normal();
}

Status PowerSgdBucket::restore(std::vector<float> q, std::vector<float> error) {
  if (q.size() != q_.size() || error.size() != error_.size())
    return corrupt("PowerSGD state: Q of " + std::to_string(q.size()) + " and error of " +
                   std::to_string(error.size()) + " values, but the bucket has " + std::to_string(q_.size()) + " and " +
                   std::to_string(error_.size()));
  q_ = std::move(q);
  error_ = std::move(error);
  return Status::Ok();
}

void PowerSgdBucket::round1(const float* grads, std::vector<float>* p, std::vector<float>* rest) {
  p->assign(p_values_, 0.0f);
  for (const Mat& m : mats_) {
    float* M = m_.data() + m.m_off;
    const float* g = grads + m.offset;
    const float* e = error_.data() + m.m_off;
    for (int64_t k = 0, n = m.rows * m.cols; k < n; ++k) M[k] = g[k] + e[k];
    // P[rows×r] = M[rows×cols] · Q[cols×r]
    matmul(Exec::cpu(), false, false, int(m.rows), m.r, int(m.cols), 1.0f, M, int(m.cols), q_.data() + m.q_off, m.r,
           0.0f, p->data() + m.p_off, m.r);
  }
  rest->clear();
  rest->reserve(rest_values_);
  for (auto [off, n] : rest_) rest->insert(rest->end(), grads + off, grads + off + n);
}

void PowerSgdBucket::round2(const std::vector<float>& p_avg, std::vector<float>* q) {
  p_hat_ = p_avg;
  q->assign(q_values_, 0.0f);
  for (const Mat& m : mats_) {
    orthonormalize_columns(p_hat_.data() + m.p_off, m.rows, m.r);
    // Q[cols×r] = Mᵀ[cols×rows] · P̂[rows×r]
    matmul(Exec::cpu(), true, false, int(m.cols), m.r, int(m.rows), 1.0f, m_.data() + m.m_off, int(m.cols),
           p_hat_.data() + m.p_off, m.r, 0.0f, q->data() + m.q_off, m.r);
  }
}

void PowerSgdBucket::finish(float* grads, const std::vector<float>& q_avg, const std::vector<float>& rest_avg) {
  q_ = q_avg;
  for (const Mat& m : mats_) {
    float* g = grads + m.offset;
    // M̂[rows×cols] = P̂[rows×r] · Q̂ᵀ[r×cols]
    matmul(Exec::cpu(), false, true, int(m.rows), int(m.cols), m.r, 1.0f, p_hat_.data() + m.p_off, m.r,
           q_.data() + m.q_off, m.r, 0.0f, g, int(m.cols));
    const float* M = m_.data() + m.m_off;
    float* e = error_.data() + m.m_off;
    for (int64_t k = 0, n = m.rows * m.cols; k < n; ++k) e[k] = M[k] - g[k];
  }
  size_t at = 0;
  for (auto [off, n] : rest_) {
    for (int64_t k = 0; k < n; ++k) grads[off + k] = rest_avg[at + k];
    at += size_t(n);
  }
}

}  // namespace lh
