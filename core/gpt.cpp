// The GPT model: config and presets, parameter layout and seeded init, and the forward/backward of the
// embedding, of a range of blocks and of the head, built from core/ops.h. Used by the trainer and stages.
#include "core/gpt.h"

#include <cmath>
#include <sstream>

#include "core/ops.h"
#include "core/rng.h"

namespace lh {

// ---------------------------------------------------------------------------------------------
// Config

Status GptConfig::validate() const {
  auto bad = [](const std::string& field, int v, const std::string& why) {
    return invalid_argument("model config: " + field + "=" + std::to_string(v) + " " + why);
  };
  if (vocab < 2 || vocab > 65536) return bad("vocab", vocab, "must be in [2, 65536]");
  if (seq < 1 || seq > 16384) return bad("seq", seq, "must be in [1, 16384]");
  if (layers < 1 || layers > 1024) return bad("layers", layers, "must be in [1, 1024]");
  if (d_model < 1 || d_model > 65536) return bad("d_model", d_model, "must be in [1, 65536]");
  if (heads < 1) return bad("heads", heads, "must be at least 1");
  if (d_model % heads != 0) return bad("heads", heads, "must divide d_model=" + std::to_string(d_model));
  if (subspace_k < 0 || subspace_k > d_model)
    return bad("subspace_k", subspace_k, "must be in [0, d_model=" + std::to_string(d_model) + "]");
  if (subspace_k > 0 && tied_head)
    return invalid_argument("model config: a tied head cannot be used with subspace_k > 0 (the embedding is K-wide)");
  return Status::Ok();
}

std::string GptConfig::describe() const {
  std::ostringstream os;
  os << "layers=" << layers << " d_model=" << d_model << " heads=" << heads << " seq=" << seq << " vocab=" << vocab
     << " head=" << (tied_head ? "tied" : "untied");
  if (subspace_k > 0) os << " subspace_k=" << subspace_k;
  return os.str();
}

bool GptConfig::operator==(const GptConfig& o) const {
  return vocab == o.vocab && seq == o.seq && layers == o.layers && d_model == o.d_model && heads == o.heads &&
         tied_head == o.tied_head && subspace_k == o.subspace_k;
}

const char* gpt_preset_names() {
  return "tiny|small|base";
}

Result<GptConfig> gpt_preset(const std::string& name) {
  GptConfig c;
  if (name == "tiny") {
    c.layers = 2;
    c.d_model = 64;
    c.heads = 4;
    c.seq = 64;
  } else if (name == "small") {
    c.layers = 4;
    c.d_model = 128;
    c.heads = 4;
    c.seq = 128;
  } else if (name == "base") {
    c.layers = 8;
    c.d_model = 384;
    c.heads = 6;
    c.seq = 256;
  } else {
    return invalid_argument("unknown model '" + name + "'; choose one of " + gpt_preset_names());
  }
  return c;
}

// ---------------------------------------------------------------------------------------------
// Parameters

namespace {

Status ensure(Tensor& t, const Shape& shape, Device dev, DType dt = DType::f32) {
  if (t.defined() && t.shape() == shape && t.device() == dev && t.dtype() == dt) return Status::Ok();
  LH_ASSIGN_OR_RETURN(t, Tensor::create(shape, dt, dev));
  return Status::Ok();
}

// Grows a flat scratch tensor to at least n elements.
Status grow(Tensor& t, int64_t n, Device dev, DType dt = DType::f32) {
  if (t.defined() && t.numel() >= n) return Status::Ok();
  LH_ASSIGN_OR_RETURN(t, Tensor::create({n}, dt, dev));
  return Status::Ok();
}

float* f(const Tensor& t) {
  return static_cast<float*>(t.raw_data());
}
const int32_t* i32(const Tensor& t) {
  return static_cast<const int32_t*>(t.raw_data());
}

void layout(ParamGroup& g, std::vector<ParamSlice> slices) {
  int64_t off = 0;
  for (auto& s : slices) {
    s.offset = off;
    off += s.numel();
  }
  g.slices = std::move(slices);
  g.numel = off;
}

ParamSlice mat(const std::string& n, Shape s, float std) {
  return {n, 0, std::move(s), true, std, 0.f};
}
ParamSlice vec(const std::string& n, int64_t len, float value) {
  return {n, 0, {len}, false, 0.f, value};
}

// Columns of a seeded d×k Gaussian made orthonormal (modified Gram-Schmidt in double): the U of the
// subspace scheme; every stage derives the same U from the seed.
std::vector<float> orthonormal_basis(int d, int k, uint64_t seed) {
  std::vector<double> a(static_cast<size_t>(d) * k);
  Rng rng(seed, 0xB0515ull);
  for (auto& x : a) x = rng.normal();
  for (int j = 0; j < k; ++j) {
    for (int i = 0; i < j; ++i) {
      double dot = 0;
      for (int r = 0; r < d; ++r) dot += a[r * k + i] * a[r * k + j];
      for (int r = 0; r < d; ++r) a[r * k + j] -= dot * a[r * k + i];
    }
    double n = 0;
    for (int r = 0; r < d; ++r) n += a[r * k + j] * a[r * k + j];
    n = std::sqrt(n);
    for (int r = 0; r < d; ++r) a[r * k + j] /= n;
  }
  return std::vector<float>(a.begin(), a.end());
}

constexpr uint64_t kInitStream = 0x1A17000ull;  // + group index: embedding 0, block i → 1+i, head → L+1

// This shard's part of a whole block's values: Q, K and V rows and MLP rows of its heads' units, columns of
// the two output projections; replicated slices whole. `local` is the shard's layout of the same block.
std::vector<float> shard_block(const std::vector<float>& whole, const ParamGroup& full, const ParamGroup& local, int C,
                               int hs, int h0, int h1) {
  std::vector<float> out(local.numel);
  auto rows = [&](int slice, int64_t r0, int64_t r1, int64_t width, int64_t& dst) {
    const float* src = whole.data() + full.slices[slice].offset + r0 * width;
    std::copy(src, src + (r1 - r0) * width, out.begin() + dst);
    dst += (r1 - r0) * width;
  };
  auto cols = [&](int slice, int64_t c0, int64_t c1) {
    const int64_t width = full.slices[slice].shape[1], n_rows = full.slices[slice].shape[0];
    int64_t dst = local.slices[slice].offset;
    for (int64_t r = 0; r < n_rows; ++r) {
      const float* src = whole.data() + full.slices[slice].offset + r * width;
      std::copy(src + c0, src + c1, out.begin() + dst);
      dst += c1 - c0;
    }
  };
  for (int i = 0; i < kNumBlockSlices; ++i) {
    int64_t dst = local.slices[i].offset;
    switch (i) {
      case kQkvW:
      case kQkvB: {
        const int64_t width = i == kQkvW ? C : 1;
        for (int part = 0; part < 3; ++part) rows(i, part * C + h0 * hs, part * C + h1 * hs, width, dst);
        break;
      }
      case kFcW:
        rows(i, 4 * hs * h0, 4 * hs * h1, C, dst);
        break;
      case kFcB:
        rows(i, 4 * hs * h0, 4 * hs * h1, 1, dst);
        break;
      case kAttnProjW:
        cols(i, hs * h0, hs * h1);
        break;
      case kFcProjW:
        cols(i, 4 * hs * h0, 4 * hs * h1);
        break;
      default:
        rows(i, 0, full.slices[i].numel(), 1, dst);
    }
  }
  return out;
}

}  // namespace

Status Gpt::init_group(ParamGroup& g, uint64_t seed, uint64_t stream, const ParamGroup* full) {
  const ParamGroup& drawn = full ? *full : g;
  std::vector<float> host(drawn.numel);
  Rng rng(seed, kInitStream + stream);
  for (const auto& s : drawn.slices) {
    float* p = host.data() + s.offset;
    for (int64_t i = 0; i < s.numel(); ++i) p[i] = s.init_std > 0 ? s.init_std * rng.normal() : s.init_value;
  }
  if (full) {
    const int hs = cfg_.d_model / cfg_.heads;
    host = shard_block(host, *full, g, cfg_.d_model, hs, parts_.tp.head_begin, parts_.tp.head_end);
  }
  LH_ASSIGN_OR_RETURN(g.params, Tensor::create({g.numel}, DType::f32, ex_.device));
  LH_ASSIGN_OR_RETURN(g.grads, Tensor::create({g.numel}, DType::f32, ex_.device));
  LH_RETURN_IF_ERROR(copy_bytes(g.params.raw_data(), ex_.device, host.data(), Device::cpu, host.size() * 4));
  return g.grads.zero();
}

Result<Gpt> Gpt::create(const GptConfig& cfg, Device device, uint64_t seed, GptParts parts) {
  LH_RETURN_IF_ERROR(cfg.validate());
  if (parts.last_block < 0) parts.last_block = cfg.layers;
  if (parts.first_block < 0 || parts.first_block > parts.last_block || parts.last_block > cfg.layers)
    return invalid_argument("model parts: blocks [" + std::to_string(parts.first_block) + ", " +
                            std::to_string(parts.last_block) + ") are not a range inside [0, " +
                            std::to_string(cfg.layers) + ")");
  if (cfg.tied_head && parts.head && !parts.embedding)
    return invalid_argument("model parts: a tied head needs the embedding in the same process; use an untied head");
  TpShard& tp = parts.tp;
  if (tp.head_end < 0) tp.head_end = cfg.heads;
  if (tp.size < 1 || tp.index < 0 || tp.index >= tp.size || tp.head_begin < 0 || tp.head_begin >= tp.head_end ||
      tp.head_end > cfg.heads)
    return invalid_argument("model parts: tensor shard " + std::to_string(tp.index) + " of " + std::to_string(tp.size) +
                            " with heads [" + std::to_string(tp.head_begin) + ", " + std::to_string(tp.head_end) +
                            ") is not a shard of " + std::to_string(cfg.heads) + " heads");
  if (!tp.sharded() && (tp.head_begin != 0 || tp.head_end != cfg.heads))
    return invalid_argument("model parts: a model without tensor parallelism holds every head");
  if (tp.sharded() && cfg.subspace_k > 0)
    return invalid_argument("model parts: tensor parallelism (--tp) does not support a subspace model (--subspace-k)");
  Gpt m;
  m.cfg_ = cfg;
  m.parts_ = parts;
  m.ex_.device = device;
  m.heads_ = tp.head_end - tp.head_begin;
  const int C = cfg.d_model, V = cfg.vocab, T = cfg.seq, L = cfg.layers, K = cfg.subspace_k;
  const float std = 0.02f, proj_std = 0.02f / std::sqrt(2.0f * L);
  auto replicated = [](ParamSlice s) {
    s.tp_replicated = true;
    return s;
  };

  m.embed_.name = "embedding";
  layout(m.embed_,
         {replicated(mat("wte", {V, K > 0 ? K : C}, std)), replicated(mat("wpe", {T, K > 0 ? K : C}, 0.01f))});
  // A block's layout for `heads` of its heads (Cs = heads·hs wide): the whole block, or one shard's part.
  auto block_layout = [&](ParamGroup& g, int l, int heads) {
    const int out = m.subspace_block(l) ? K : C;  // width of the two output projections before U
    const int Cs = heads * (C / cfg.heads);
    layout(g, {replicated(vec("ln1.w", C, 1.f)), replicated(vec("ln1.b", C, 0.f)), mat("attn.qkv.w", {3 * Cs, C}, std),
               vec("attn.qkv.b", 3 * Cs, 0.f), mat("attn.proj.w", {out, Cs}, proj_std),
               replicated(vec("attn.proj.b", out, 0.f)), replicated(vec("ln2.w", C, 1.f)),
               replicated(vec("ln2.b", C, 0.f)), mat("mlp.fc.w", {4 * Cs, C}, std), vec("mlp.fc.b", 4 * Cs, 0.f),
               mat("mlp.proj.w", {out, 4 * Cs}, proj_std), replicated(vec("mlp.proj.b", out, 0.f))});
  };
  m.blocks_.resize(L);
  for (int l = 0; l < L; ++l) {
    ParamGroup& g = m.blocks_[l];
    g.name = "block." + std::to_string(l);
    block_layout(g, l, m.heads_);
  }
  m.head_.name = "head";
  std::vector<ParamSlice> hs = {replicated(vec("lnf.w", C, 1.f)), replicated(vec("lnf.b", C, 0.f))};
  if (!cfg.tied_head) hs.push_back(replicated(mat("lm_head.w", {V, C}, std)));
  layout(m.head_, std::move(hs));

  if (parts.embedding) LH_RETURN_IF_ERROR(m.init_group(m.embed_, seed, 0));
  for (int l = parts.first_block; l < parts.last_block; ++l) {
    if (m.heads_ == cfg.heads) {
      LH_RETURN_IF_ERROR(m.init_group(m.blocks_[l], seed, 1 + l));
    } else {
      ParamGroup whole;
      block_layout(whole, l, cfg.heads);
      LH_RETURN_IF_ERROR(m.init_group(m.blocks_[l], seed, 1 + l, &whole));
    }
  }
  if (parts.head) LH_RETURN_IF_ERROR(m.init_group(m.head_, seed, 1 + L));

  if (K > 0) {
    std::vector<float> u = orthonormal_basis(C, K, seed);
    LH_ASSIGN_OR_RETURN(m.basis_, Tensor::create({C, K}, DType::f32, device));
    LH_RETURN_IF_ERROR(copy_bytes(m.basis_.raw_data(), device, u.data(), Device::cpu, u.size() * 4));
    std::vector<float> fe(static_cast<size_t>(V) * C);
    Rng rng(seed, 0xF1BEDull);
    for (auto& x : fe) x = std * rng.normal();
    LH_ASSIGN_OR_RETURN(m.fixed_embed_, Tensor::create({V, C}, DType::f32, device));
    LH_RETURN_IF_ERROR(copy_bytes(m.fixed_embed_.raw_data(), device, fe.data(), Device::cpu, fe.size() * 4));
    LH_ASSIGN_OR_RETURN(m.zero_pos_, Tensor::create({T, C}, DType::f32, device));
    LH_RETURN_IF_ERROR(m.zero_pos_.zero());
  }
  return m;
}

std::vector<ParamGroup*> Gpt::param_groups() {
  std::vector<ParamGroup*> out;
  if (embed_.defined()) out.push_back(&embed_);
  for (auto& b : blocks_)
    if (b.defined()) out.push_back(&b);
  if (head_.defined()) out.push_back(&head_);
  return out;
}

int64_t Gpt::num_params() {
  int64_t n = 0;
  for (auto* g : param_groups()) n += g->numel;
  return n;
}

Status Gpt::zero_grad() {
  for (auto* g : param_groups()) LH_RETURN_IF_ERROR(g->grads.zero());
  return Status::Ok();
}

double Gpt::train_flops_per_token(int T) const {
  const double C = cfg_.d_model, V = cfg_.vocab, K = cfg_.subspace_k;
  double n = V * C;  // head
  for (int l = 0; l < cfg_.layers; ++l) {
    const double out = subspace_block(l) ? K : C;
    n += 3 * C * C + out * C + 4 * C * C + out * 4 * C;
    if (subspace_block(l)) n += 2 * K * C;  // the two products with U
  }
  // causal attention: QKᵀ and att·V over T/2 keys on average, 2 flops each, ×3 for backward
  return 6.0 * n + 6.0 * cfg_.layers * T * C;
}

// ---------------------------------------------------------------------------------------------
// Forward and backward

Status Gpt::ensure_scratch(int B, int T) {
  const int64_t BT = int64_t(B) * T, C = cfg_.d_model, V = cfg_.vocab;
  const int64_t Cs = int64_t(heads_) * (cfg_.d_model / cfg_.heads);  // this shard's attention width
  const Device d = ex_.device;
  LH_RETURN_IF_ERROR(grow(s_tmp_, BT * C, d));
  LH_RETURN_IF_ERROR(grow(s_dln_, BT * C, d));
  LH_RETURN_IF_ERROR(grow(s_dqkv_, BT * 3 * Cs, d));
  LH_RETURN_IF_ERROR(grow(s_datty_, BT * Cs, d));
  LH_RETURN_IF_ERROR(grow(s_dfch_, BT * 4 * Cs, d));
  LH_RETURN_IF_ERROR(grow(s_dfchg_, BT * 4 * Cs, d));
  LH_RETURN_IF_ERROR(grow(s_dlogits_, BT * V, d));
  LH_RETURN_IF_ERROR(grow(s_dk_, BT * std::max(1, cfg_.subspace_k), d));
  const int64_t ws = static_cast<int64_t>(attention_backward_workspace(B, T, static_cast<int>(Cs), heads_));
  LH_RETURN_IF_ERROR(grow(s_attn_ws_, std::max<int64_t>(ws, 1), d, DType::u8));
  return Status::Ok();
}

static Status check_bt(const GptConfig& cfg, int B, int T) {
  if (B < 1) return invalid_argument("batch size " + std::to_string(B) + " must be at least 1");
  if (T < 1 || T > cfg.seq)
    return invalid_argument("sequence length " + std::to_string(T) + " must be in [1, " + std::to_string(cfg.seq) +
                            "] (the model's context)");
  return Status::Ok();
}

Result<Tensor> Gpt::embed_forward(ActivationCache& c, const int32_t* tokens, Device tokens_device, int B, int T) {
  if (!embed_.defined()) return invalid_argument("embed_forward on a model part without the embedding");
  LH_RETURN_IF_ERROR(check_bt(cfg_, B, T));
  const int C = cfg_.d_model, K = cfg_.subspace_k;
  const Device dev = ex_.device;
  c.B = B;
  c.T = T;
  if (c.blocks.size() != static_cast<size_t>(cfg_.layers)) c.blocks.resize(cfg_.layers);
  LH_RETURN_IF_ERROR(ensure(c.tokens, {int64_t(B) * T}, dev, DType::i32));
  LH_RETURN_IF_ERROR(copy_bytes(c.tokens.raw_data(), dev, tokens, tokens_device, size_t(B) * T * 4));
  LH_RETURN_IF_ERROR(ensure(c.embed_out, {B, T, C}, dev));
  LH_RETURN_IF_ERROR(ensure_scratch(B, T));
  if (K == 0) {
    embedding_forward(ex_, f(c.embed_out), i32(c.tokens), embed_.param(kWte), embed_.param(kWpe), B, T, C);
  } else {
    LH_RETURN_IF_ERROR(ensure(c.embed_k, {B, T, K}, dev));
    embedding_forward(ex_, f(c.embed_k), i32(c.tokens), embed_.param(kWte), embed_.param(kWpe), B, T, K);
    matmul(ex_, false, true, B * T, C, K, 1.f, f(c.embed_k), K, f(basis_), K, 0.f, f(c.embed_out), C);
    embedding_forward(ex_, f(s_tmp_), i32(c.tokens), f(fixed_embed_), f(zero_pos_), B, T, C);
    add_inplace(ex_, f(c.embed_out), f(s_tmp_), int64_t(B) * T * C);
  }
  return c.embed_out;
}

Status Gpt::embed_backward(ActivationCache& c, const Tensor& dout) {
  if (!embed_.defined()) return invalid_argument("embed_backward on a model part without the embedding");
  const int B = c.B, T = c.T, C = cfg_.d_model, K = cfg_.subspace_k;
  if (dout.shape() != Shape{B, T, C})
    return invalid_argument("embed_backward: gradient " + dout.describe() + " does not match the forward's [" +
                            std::to_string(B) + ", " + std::to_string(T) + ", " + std::to_string(C) + "]");
  if (K == 0) {
    embedding_backward(ex_, embed_.grad(kWte), embed_.grad(kWpe), f(dout), i32(c.tokens), B, T, C);
  } else {
    LH_RETURN_IF_ERROR(ensure_scratch(B, T));
    matmul(ex_, false, false, B * T, K, C, 1.f, f(dout), C, f(basis_), K, 0.f, f(s_dk_), K);
    embedding_backward(ex_, embed_.grad(kWte), embed_.grad(kWpe), f(s_dk_), i32(c.tokens), B, T, K);
  }
  return Status::Ok();
}

Status Gpt::tp_sum(Tensor& scratch, int64_t n, int block, TpSite site) {
  if (!parts_.tp.sharded()) return Status::Ok();
  if (!tp_reduce_)
    return internal_error("block " + std::to_string(block) + ": tensor shard " + std::to_string(parts_.tp.index) +
                          " has no all-reduce to sum its partial results with");
  Tensor partial = scratch.slice(0, n).view({n / cfg_.d_model, cfg_.d_model});  // [B·T, C]: rows are tokens
  return tp_reduce_(partial, block, site);
}

Status Gpt::block_forward(int l, ActivationCache& c, const Tensor& in) {
  const int B = c.B, T = c.T, C = cfg_.d_model, K = cfg_.subspace_k, BT = B * T;
  const int NH = heads_, Cs = heads_ * (C / cfg_.heads);  // this shard's heads and attention width
  const Device dev = ex_.device;
  ParamGroup& g = blocks_[l];
  BlockActivations& a = c.blocks[l];
  a.in = in;
  const Shape bt1{BT};
  LH_RETURN_IF_ERROR(ensure(a.ln1, {B, T, C}, dev));
  LH_RETURN_IF_ERROR(ensure(a.ln1_mean, bt1, dev));
  LH_RETURN_IF_ERROR(ensure(a.ln1_rstd, bt1, dev));
  LH_RETURN_IF_ERROR(ensure(a.qkv, {B, T, 3 * Cs}, dev));
  LH_RETURN_IF_ERROR(ensure(a.att, {B, NH, T, T}, dev));
  LH_RETURN_IF_ERROR(ensure(a.atty, {B, T, Cs}, dev));
  LH_RETURN_IF_ERROR(ensure(a.res2, {B, T, C}, dev));
  LH_RETURN_IF_ERROR(ensure(a.ln2, {B, T, C}, dev));
  LH_RETURN_IF_ERROR(ensure(a.ln2_mean, bt1, dev));
  LH_RETURN_IF_ERROR(ensure(a.ln2_rstd, bt1, dev));
  LH_RETURN_IF_ERROR(ensure(a.fch, {B, T, 4 * Cs}, dev));
  LH_RETURN_IF_ERROR(ensure(a.fch_gelu, {B, T, 4 * Cs}, dev));
  LH_RETURN_IF_ERROR(ensure(a.out, {B, T, C}, dev));
  const bool sub = subspace_block(l);
  if (sub) {
    LH_RETURN_IF_ERROR(ensure(a.attn_k, {BT, K}, dev));
    LH_RETURN_IF_ERROR(ensure(a.fc_k, {BT, K}, dev));
  }
  float* tmp = f(s_tmp_);
  // The replicated output biases enter the sum once: shard 0 adds them.
  const bool bias = parts_.tp.index == 0;
  // Output projection into the residual stream: full rank, or U·(W_k x + b_k) in subspace blocks; with tensor
  // parallelism each shard's partial product, summed over the group.
  auto project = [&](float* z, const float* x, int in_dim, int w, int b, TpSite site) {
    if (!sub) {
      linear_forward(ex_, tmp, x, g.param(w), bias ? g.param(b) : nullptr, BT, in_dim, C);
    } else {
      linear_forward(ex_, z, x, g.param(w), g.param(b), BT, in_dim, K);
      matmul(ex_, false, true, BT, C, K, 1.f, z, K, f(basis_), K, 0.f, tmp, C);
    }
    return tp_sum(s_tmp_, int64_t(BT) * C, l, site);
  };
  layernorm_forward(ex_, f(a.ln1), f(a.ln1_mean), f(a.ln1_rstd), f(in), g.param(kLn1W), g.param(kLn1B), BT, C);
  linear_forward(ex_, f(a.qkv), f(a.ln1), g.param(kQkvW), g.param(kQkvB), BT, C, 3 * Cs);
  attention_forward(ex_, f(a.atty), f(a.att), f(a.qkv), B, T, Cs, NH);
  LH_RETURN_IF_ERROR(project(sub ? f(a.attn_k) : nullptr, f(a.atty), Cs, kAttnProjW, kAttnProjB, TpSite::kAttnOut));
  residual_forward(ex_, f(a.res2), f(in), tmp, int64_t(BT) * C);
  layernorm_forward(ex_, f(a.ln2), f(a.ln2_mean), f(a.ln2_rstd), f(a.res2), g.param(kLn2W), g.param(kLn2B), BT, C);
  linear_forward(ex_, f(a.fch), f(a.ln2), g.param(kFcW), g.param(kFcB), BT, C, 4 * Cs);
  gelu_forward(ex_, f(a.fch_gelu), f(a.fch), int64_t(BT) * 4 * Cs);
  LH_RETURN_IF_ERROR(project(sub ? f(a.fc_k) : nullptr, f(a.fch_gelu), 4 * Cs, kFcProjW, kFcProjB, TpSite::kMlpOut));
  residual_forward(ex_, f(a.out), f(a.res2), tmp, int64_t(BT) * C);
  return Status::Ok();
}

// d holds d(out) on entry and d(in) on return. The residual identity paths are the accumulation into
// d itself: layernorm backward adds its input gradient onto what flows straight through. With tensor
// parallelism d is the same on every shard; each shard's part of a layernorm's input gradient is summed over
// the group before the layernorm's backward, so d stays the same everywhere.
Status Gpt::block_backward(int l, ActivationCache& c, float* d) {
  const int B = c.B, T = c.T, C = cfg_.d_model, K = cfg_.subspace_k, BT = B * T;
  const int NH = heads_, Cs = heads_ * (C / cfg_.heads);
  ParamGroup& g = blocks_[l];
  BlockActivations& a = c.blocks[l];
  const bool sub = subspace_block(l);
  const int64_t n = int64_t(BT) * C;
  float *dln = f(s_dln_), *dqkv = f(s_dqkv_), *datty = f(s_datty_), *dfch = f(s_dfch_), *dfchg = f(s_dfchg_);
  float* dk = f(s_dk_);
  // Backward ops accumulate, so every scratch gradient starts at zero (memset, not 0·x: x may be NaN).
  auto clear = [&](Tensor& t, int64_t count) { return t.slice(0, count).zero(); };
  // Gradient of an output projection given dy = d (the residual-stream gradient).
  auto project_back = [&](float* dx, const float* x, int in_dim, int w, int b) {
    if (!sub) {
      linear_backward(ex_, dx, g.grad(w), g.grad(b), d, x, g.param(w), BT, in_dim, C);
    } else {
      matmul(ex_, false, false, BT, K, C, 1.f, d, C, f(basis_), K, 0.f, dk, K);
      linear_backward(ex_, dx, g.grad(w), g.grad(b), dk, x, g.param(w), BT, in_dim, K);
    }
  };
  // MLP branch: out = res2 + proj(gelu(fc(ln2(res2))))
  LH_RETURN_IF_ERROR(clear(s_dfchg_, int64_t(BT) * 4 * Cs));
  project_back(dfchg, f(a.fch_gelu), 4 * Cs, kFcProjW, kFcProjB);
  LH_RETURN_IF_ERROR(clear(s_dfch_, int64_t(BT) * 4 * Cs));
  gelu_backward(ex_, dfch, f(a.fch), dfchg, int64_t(BT) * 4 * Cs);
  LH_RETURN_IF_ERROR(clear(s_dln_, n));
  linear_backward(ex_, dln, g.grad(kFcW), g.grad(kFcB), dfch, f(a.ln2), g.param(kFcW), BT, C, 4 * Cs);
  LH_RETURN_IF_ERROR(tp_sum(s_dln_, n, l, TpSite::kMlpIn));
  layernorm_backward(ex_, d, g.grad(kLn2W), g.grad(kLn2B), dln, f(a.res2), g.param(kLn2W), f(a.ln2_mean), f(a.ln2_rstd),
                     BT, C);
  // Attention branch: res2 = in + proj(attn(qkv(ln1(in))))
  LH_RETURN_IF_ERROR(clear(s_datty_, int64_t(BT) * Cs));
  project_back(datty, f(a.atty), Cs, kAttnProjW, kAttnProjB);
  LH_RETURN_IF_ERROR(clear(s_dqkv_, int64_t(BT) * 3 * Cs));
  attention_backward(ex_, dqkv, datty, f(a.qkv), f(a.att), B, T, Cs, NH, s_attn_ws_.raw_data());
  LH_RETURN_IF_ERROR(clear(s_dln_, n));
  linear_backward(ex_, dln, g.grad(kQkvW), g.grad(kQkvB), dqkv, f(a.ln1), g.param(kQkvW), BT, C, 3 * Cs);
  LH_RETURN_IF_ERROR(tp_sum(s_dln_, n, l, TpSite::kAttnIn));
  layernorm_backward(ex_, d, g.grad(kLn1W), g.grad(kLn1B), dln, f(a.in), g.param(kLn1W), f(a.ln1_mean), f(a.ln1_rstd),
                     BT, C);
  return Status::Ok();
}

Result<Tensor> Gpt::blocks_forward(int first, int last, ActivationCache& c, const Tensor& in) {
  if (first < parts_.first_block || last > parts_.last_block || first > last)
    return invalid_argument("blocks_forward [" + std::to_string(first) + ", " + std::to_string(last) +
                            ") is outside the blocks this model holds [" + std::to_string(parts_.first_block) + ", " +
                            std::to_string(parts_.last_block) + ")");
  if (in.ndim() != 3 || in.dim(2) != cfg_.d_model || in.device() != ex_.device || in.dtype() != DType::f32)
    return invalid_argument("blocks_forward: input " + in.describe() + " is not f32 [B, T, " +
                            std::to_string(cfg_.d_model) + "] on " + device_name(ex_.device));
  const int B = static_cast<int>(in.dim(0)), T = static_cast<int>(in.dim(1));
  LH_RETURN_IF_ERROR(check_bt(cfg_, B, T));
  c.B = B;
  c.T = T;
  if (c.blocks.size() != static_cast<size_t>(cfg_.layers)) c.blocks.resize(cfg_.layers);
  LH_RETURN_IF_ERROR(ensure_scratch(B, T));
  Tensor x = in;
  for (int l = first; l < last; ++l) {
    LH_RETURN_IF_ERROR(block_forward(l, c, x));
    x = c.blocks[l].out;
  }
  return x;
}

Status Gpt::blocks_backward(int first, int last, ActivationCache& c, Tensor& d) {
  if (first < parts_.first_block || last > parts_.last_block || first > last)
    return invalid_argument("blocks_backward [" + std::to_string(first) + ", " + std::to_string(last) +
                            ") is outside the blocks this model holds");
  if (d.shape() != Shape{c.B, c.T, cfg_.d_model} || d.device() != ex_.device)
    return invalid_argument("blocks_backward: gradient " + d.describe() + " does not match the forward's [" +
                            std::to_string(c.B) + ", " + std::to_string(c.T) + ", " + std::to_string(cfg_.d_model) +
                            "]");
  LH_RETURN_IF_ERROR(ensure_scratch(c.B, c.T));
  for (int l = last - 1; l >= first; --l) {
    if (!c.blocks[l].out.defined())
      return invalid_argument("blocks_backward: block " + std::to_string(l) + " has no forward in this cache");
    LH_RETURN_IF_ERROR(block_backward(l, c, f(d)));
  }
  return Status::Ok();
}

Status Gpt::logits_forward(ActivationCache& c, const Tensor& in) {
  if (!head_.defined()) return invalid_argument("head forward on a model part without the head");
  if (in.ndim() != 3 || in.dim(2) != cfg_.d_model || in.device() != ex_.device)
    return invalid_argument("head forward: input " + in.describe() + " is not [B, T, " + std::to_string(cfg_.d_model) +
                            "]");
  const int B = static_cast<int>(in.dim(0)), T = static_cast<int>(in.dim(1)), C = cfg_.d_model, V = cfg_.vocab;
  LH_RETURN_IF_ERROR(check_bt(cfg_, B, T));
  const Device dev = ex_.device;
  c.B = B;
  c.T = T;
  LH_RETURN_IF_ERROR(ensure(c.lnf, {B, T, C}, dev));
  LH_RETURN_IF_ERROR(ensure(c.lnf_mean, {B * T}, dev));
  LH_RETURN_IF_ERROR(ensure(c.lnf_rstd, {B * T}, dev));
  LH_RETURN_IF_ERROR(ensure(c.logits, {B, T, V}, dev));
  c.head_in = in;
  const float* w_head = cfg_.tied_head ? embed_.param(kWte) : head_.param(kLmHead);
  layernorm_forward(ex_, f(c.lnf), f(c.lnf_mean), f(c.lnf_rstd), f(in), head_.param(kLnfW), head_.param(kLnfB), B * T,
                    C);
  linear_forward(ex_, f(c.logits), f(c.lnf), w_head, nullptr, B * T, C, V);
  return Status::Ok();
}

Result<float> Gpt::head_forward(ActivationCache& c, const Tensor& in, const int32_t* targets, Device targets_device) {
  LH_RETURN_IF_ERROR(logits_forward(c, in));
  const int BT = c.B * c.T, V = cfg_.vocab;
  const Device dev = ex_.device;
  LH_RETURN_IF_ERROR(ensure(c.targets, {BT}, dev, DType::i32));
  LH_RETURN_IF_ERROR(copy_bytes(c.targets.raw_data(), dev, targets, targets_device, size_t(BT) * 4));
  LH_RETURN_IF_ERROR(ensure(c.probs, {c.B, c.T, V}, dev));
  LH_RETURN_IF_ERROR(ensure(c.losses, {BT}, dev));
  crossentropy_forward(ex_, f(c.losses), f(c.probs), f(c.logits), i32(c.targets), BT, V);
  return sum(ex_, f(c.losses), BT) / static_cast<float>(BT);
}

Status Gpt::head_backward(ActivationCache& c, float loss_scale, Tensor& dx) {
  const int B = c.B, T = c.T, BT = B * T, C = cfg_.d_model, V = cfg_.vocab;
  if (!c.probs.defined() || c.probs.dim(0) != B || c.probs.dim(1) != T)
    return invalid_argument("head_backward without a head_forward of the same batch in this cache");
  if (dx.shape() != Shape{B, T, C} || dx.device() != ex_.device)
    return invalid_argument("head_backward: gradient buffer " + dx.describe() + " is not [" + std::to_string(B) + ", " +
                            std::to_string(T) + ", " + std::to_string(C) + "]");
  LH_RETURN_IF_ERROR(ensure_scratch(B, T));
  float* dlogits = f(s_dlogits_);
  float* dlnf = f(s_dln_);
  LH_RETURN_IF_ERROR(s_dlogits_.slice(0, int64_t(BT) * V).zero());
  crossentropy_backward(ex_, dlogits, f(c.probs), i32(c.targets), loss_scale / static_cast<float>(BT), BT, V);
  const float* w_head = cfg_.tied_head ? embed_.param(kWte) : head_.param(kLmHead);
  float* dw_head = cfg_.tied_head ? embed_.grad(kWte) : head_.grad(kLmHead);
  LH_RETURN_IF_ERROR(s_dln_.slice(0, int64_t(BT) * C).zero());
  linear_backward(ex_, dlnf, dw_head, nullptr, dlogits, f(c.lnf), w_head, BT, C, V);
  LH_RETURN_IF_ERROR(dx.zero());
  layernorm_backward(ex_, f(dx), head_.grad(kLnfW), head_.grad(kLnfB), dlnf, f(c.head_in), head_.param(kLnfW),
                     f(c.lnf_mean), f(c.lnf_rstd), BT, C);
  return Status::Ok();
}

Result<float> Gpt::forward(ActivationCache& c, const int32_t* tokens, const int32_t* targets, int B, int T,
                           Device host_or_device) {
  LH_ASSIGN_OR_RETURN(Tensor x, embed_forward(c, tokens, host_or_device, B, T));
  LH_ASSIGN_OR_RETURN(x, blocks_forward(0, cfg_.layers, c, x));
  return head_forward(c, x, targets, host_or_device);
}

Status Gpt::backward(ActivationCache& c, float loss_scale) {
  LH_RETURN_IF_ERROR(ensure(c.grad, {c.B, c.T, cfg_.d_model}, ex_.device));
  LH_RETURN_IF_ERROR(head_backward(c, loss_scale, c.grad));
  LH_RETURN_IF_ERROR(blocks_backward(0, cfg_.layers, c, c.grad));
  return embed_backward(c, c.grad);
}

// ---------------------------------------------------------------------------------------------
// Subspace stage boundaries

Status Gpt::subspace_check(const Tensor& t, int width, const char* what) const {
  if (cfg_.subspace_k == 0) return invalid_argument(std::string(what) + ": the model has no subspace (subspace_k=0)");
  if (t.ndim() != 3 || t.dim(2) != width || t.device() != ex_.device || t.dtype() != DType::f32)
    return invalid_argument(std::string(what) + ": " + t.describe() + " is not f32 [B, T, " + std::to_string(width) +
                            "] on " + device_name(ex_.device));
  return check_bt(cfg_, static_cast<int>(t.dim(0)), static_cast<int>(t.dim(1)));
}

Status Gpt::gather_fixed(const int32_t* tokens, Device tokens_device, int B, int T) {
  LH_RETURN_IF_ERROR(ensure_scratch(B, T));
  LH_RETURN_IF_ERROR(ensure(s_tokens_, {int64_t(B) * T}, ex_.device, DType::i32));
  LH_RETURN_IF_ERROR(copy_bytes(s_tokens_.raw_data(), ex_.device, tokens, tokens_device, size_t(B) * T * 4));
  embedding_forward(ex_, f(s_tmp_), i32(s_tokens_), f(fixed_embed_), f(zero_pos_), B, T, cfg_.d_model);
  return Status::Ok();
}

Status Gpt::subspace_encode(const Tensor& x, const int32_t* tokens, Device tokens_device, Tensor& c) {
  LH_RETURN_IF_ERROR(subspace_check(x, cfg_.d_model, "subspace_encode"));
  const int B = static_cast<int>(x.dim(0)), T = static_cast<int>(x.dim(1)), C = cfg_.d_model, K = cfg_.subspace_k;
  LH_RETURN_IF_ERROR(gather_fixed(tokens, tokens_device, B, T));
  LH_RETURN_IF_ERROR(ensure(c, {B, T, K}, ex_.device));
  // c = x·U − F[tok]·U: two products instead of a temporary x − F[tok].
  matmul(ex_, false, false, B * T, K, C, 1.f, f(x), C, f(basis_), K, 0.f, f(c), K);
  matmul(ex_, false, false, B * T, K, C, -1.f, f(s_tmp_), C, f(basis_), K, 1.f, f(c), K);
  return Status::Ok();
}

Status Gpt::subspace_decode(const Tensor& c, const int32_t* tokens, Device tokens_device, Tensor& x) {
  LH_RETURN_IF_ERROR(subspace_check(c, cfg_.subspace_k, "subspace_decode"));
  const int B = static_cast<int>(c.dim(0)), T = static_cast<int>(c.dim(1)), C = cfg_.d_model, K = cfg_.subspace_k;
  LH_RETURN_IF_ERROR(gather_fixed(tokens, tokens_device, B, T));
  LH_RETURN_IF_ERROR(ensure(x, {B, T, C}, ex_.device));
  // x = F[tok], then x += c·Uᵀ
  LH_RETURN_IF_ERROR(copy_bytes(x.raw_data(), ex_.device, s_tmp_.raw_data(), ex_.device, size_t(B) * T * C * 4));
  matmul(ex_, false, true, B * T, C, K, 1.f, f(c), K, f(basis_), K, 1.f, f(x), C);
  return Status::Ok();
}

Status Gpt::subspace_grad_encode(const Tensor& dx, Tensor& dc) {
  LH_RETURN_IF_ERROR(subspace_check(dx, cfg_.d_model, "subspace_grad_encode"));
  const int B = static_cast<int>(dx.dim(0)), T = static_cast<int>(dx.dim(1)), C = cfg_.d_model, K = cfg_.subspace_k;
  LH_RETURN_IF_ERROR(ensure(dc, {B, T, K}, ex_.device));
  matmul(ex_, false, false, B * T, K, C, 1.f, f(dx), C, f(basis_), K, 0.f, f(dc), K);
  return Status::Ok();
}

Status Gpt::subspace_grad_decode(const Tensor& dc, Tensor& dx) {
  LH_RETURN_IF_ERROR(subspace_check(dc, cfg_.subspace_k, "subspace_grad_decode"));
  const int B = static_cast<int>(dc.dim(0)), T = static_cast<int>(dc.dim(1)), C = cfg_.d_model, K = cfg_.subspace_k;
  LH_RETURN_IF_ERROR(ensure(dx, {B, T, C}, ex_.device));
  matmul(ex_, false, true, B * T, C, K, 1.f, f(dc), K, f(basis_), K, 0.f, f(dx), C);
  return Status::Ok();
}

}  // namespace lh
