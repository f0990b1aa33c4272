// defines: lh::Gpt — a byte-level GPT as embedding + a list of pre-norm blocks + head, each with its own
// parameter/gradient buffers, and per-microbatch ActivationCache. Used by the trainer, pipeline stages, tests.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/exec.h"
#include "core/status.h"
#include "core/tensor.h"

namespace lh {

struct GptConfig {
  int vocab = 256;  // byte-level
  int seq = 128;    // context length: the number of learned positions
  int layers = 4;
  int d_model = 128;
  int heads = 4;
  bool tied_head = false;  // untied by default: a pipeline's first and last stage then share no weights
  // > 0: the subspace reparametrisation of Ramasinghe et al. 2025 (see REFERENCES.md) — block output
  // projections and the token/position embeddings write through a fixed, seeded d×K orthonormal U, so
  // the residual stream is F[tok] + U·c. The last block stays full rank.
  int subspace_k = 0;

  Status validate() const;       // every bad field named
  std::string describe() const;  // "layers=4 d_model=128 heads=4 seq=128 vocab=256 head=untied"
  bool operator==(const GptConfig& o) const;
  bool operator!=(const GptConfig& o) const { return !(*this == o); }
  template <class Archive>
  void serialize(Archive& ar) {
    ar(vocab, seq, layers, d_model, heads, tied_head, subspace_k);
  }
};

// "tiny" (tests, benchmarks), "small" (the default run: about a minute on 2 cores), "base".
Result<GptConfig> gpt_preset(const std::string& name);
const char* gpt_preset_names();  // "tiny|small|base"

// One named tensor inside a parameter buffer.
struct ParamSlice {
  std::string name;
  int64_t offset = 0;  // elements from the start of the group's buffer
  Shape shape;
  bool decay = false;  // weight decay applies to matrices, not to biases and norm gains
  float init_std = 0;  // > 0: N(0, init_std²); else the constant init_value
  float init_value = 0;
  // Every tensor-parallel shard holds this slice whole and computes the same gradient for it (layernorms,
  // output-projection biases, the embedding and the head): the gradient norm counts it once.
  bool tp_replicated = false;
  int64_t numel() const { return shape_numel(shape); }
};

// A contiguous parameter buffer and its gradient: the embedding, one block, or the head. A pipeline
// stage owns whole groups; data-parallel sync sees each slice as a matrix.
struct ParamGroup {
  std::string name;  // "embedding", "block.3", "head"
  std::vector<ParamSlice> slices;
  Tensor params, grads;  // [numel] on the model's device
  int64_t numel = 0;
  float* param(int i) const { return params.data<float>() + slices[i].offset; }
  float* grad(int i) const { return grads.data<float>() + slices[i].offset; }
  bool defined() const { return params.defined(); }
};

// Slice order inside each group.
enum BlockSlice : int {
  kLn1W,
  kLn1B,
  kQkvW,
  kQkvB,
  kAttnProjW,
  kAttnProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kFcProjW,
  kFcProjB,
  kNumBlockSlices
};
enum EmbedSlice : int { kWte, kWpe };            // [V,C] and [seq,C]; [V,K] and [seq,K] with subspace
enum HeadSlice : int { kLnfW, kLnfB, kLmHead };  // kLmHead [V,C] only when untied

// What one block saves in forward for its backward.
struct BlockActivations {
  Tensor in;  // the block's input (shared with the previous block's `out` or the caller's buffer)
  Tensor ln1, ln1_mean, ln1_rstd, qkv, att, atty, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu, out;
  Tensor attn_k, fc_k;  // subspace coordinates of the two output projections [BT,K]
};

// Everything a forward pass of one microbatch keeps for its backward. A pipeline schedule with M
// microbatches in flight holds M of these; the model itself keeps only scratch shared by backwards.
class ActivationCache {
 public:
  int B = 0, T = 0;
  Tensor tokens, targets;                // int32 [B*T] on the model's device
  Tensor embed_out, embed_k;             // [B,T,C]; embed_k [B,T,K] with subspace
  std::vector<BlockActivations> blocks;  // indexed by global block index; only the blocks run are filled
  Tensor head_in;                        // the head's input (kept for its layernorm backward)
  Tensor lnf, lnf_mean, lnf_rstd, logits, probs, losses;
  Tensor grad;  // [B,T,C]: the residual-stream gradient buffer the full-model backward runs in place in
};

// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): which heads of every block this process holds. The
// MLP's hidden units follow the heads (4·head_size per head), so shard t holds heads [head_begin, head_end)
// — their Q, K, V rows and output-projection columns — and MLP units [4·hs·head_begin, 4·hs·head_end) — rows of
// the first linear, columns of the second. Uneven ranges serve unequal machines. Layernorms, the two
// output-projection biases (added by shard 0 before the sum), the embedding and the head are replicated.
struct TpShard {
  int index = 0, size = 1;
  int head_begin = 0, head_end = -1;  // -1: every head
  bool sharded() const { return size > 1; }
};

// Where a block sums partial results over its tp group ([B,T,C] each, in place): forward after the attention
// and the MLP output projections; backward the input gradients of the MLP's first linear and of the QKV one.
enum class TpSite : int { kAttnOut = 0, kMlpOut = 1, kMlpIn = 2, kAttnIn = 3 };
constexpr int kTpSitesPerBlock = 4;
// Sums `partial` over the tp group in place; every shard must end with the same bits.
using TpAllReduce = std::function<Status(Tensor& partial, int block, TpSite site)>;

struct GptParts {  // which groups a process holds: the whole model by default
  bool embedding = true;
  int first_block = 0, last_block = -1;  // -1: all layers
  bool head = true;
  TpShard tp;  // the blocks' shard: all heads by default
};

class Gpt {
 public:
  // Allocates the owned groups on `device` and initialises them from `seed` (each group from its own
  // Philox stream, so a stage holding blocks [a,b) gets the very weights a full model would).
  static Result<Gpt> create(const GptConfig& cfg, Device device, uint64_t seed, GptParts parts = {});

  const GptConfig& config() const { return cfg_; }
  const Exec& exec() const { return ex_; }
  Device device() const { return ex_.device; }
  const GptParts& parts() const { return parts_; }
  int num_blocks() const { return cfg_.layers; }

  ParamGroup& embedding() { return embed_; }
  ParamGroup& block(int i) { return blocks_.at(i); }
  ParamGroup& head() { return head_; }
  // The groups this process holds, in model order.
  std::vector<ParamGroup*> param_groups();
  int64_t num_params();  // of the groups held
  // Heads and MLP units of each block this process holds (all of them without tensor parallelism).
  int local_heads() const { return heads_; }
  // Sets the tp group's all-reduce; a sharded model (parts.tp.size > 1) refuses to run its blocks without one.
  void set_tp_all_reduce(TpAllReduce fn) { tp_reduce_ = std::move(fn); }
  Status zero_grad();

  // (a) tokens [B*T] int32 (host or device) -> cache.embed_out [B,T,C]; returns that tensor.
  Result<Tensor> embed_forward(ActivationCache& c, const int32_t* tokens, Device tokens_device, int B, int T);
  // Adds d(embed_out) into the embedding gradients.
  Status embed_backward(ActivationCache& c, const Tensor& dout);

  // (b) blocks [first, last) on input `in` [B,T,C]; returns the last block's output (held by the cache).
  // The cache keeps `in` for backward: the caller must not write into it until backward has run.
  Result<Tensor> blocks_forward(int first, int last, ActivationCache& c, const Tensor& in);
  // d: d(output of block last-1) on entry, d(input of block first) on return — in place. Adds into the
  // blocks' parameter gradients.
  Status blocks_backward(int first, int last, ActivationCache& c, Tensor& d);

  // (c) final layernorm + head + cross-entropy against targets [B*T] (host or device): mean loss.
  Result<float> head_forward(ActivationCache& c, const Tensor& in, const int32_t* targets, Device targets_device);
  // dx := d(loss_scale · mean loss)/d(in) (overwritten, [B,T,C]); adds into the head's gradients.
  Status head_backward(ActivationCache& c, float loss_scale, Tensor& dx);
  // Logits of the last head_forward/logits_forward: [B,T,V] in the cache.
  Status logits_forward(ActivationCache& c, const Tensor& in);  // head without a loss (sampling)

  // The whole model: the three parts in sequence.
  Result<float> forward(ActivationCache& c, const int32_t* tokens, const int32_t* targets, int B, int T,
                        Device host_or_device = Device::cpu);
  Status backward(ActivationCache& c, float loss_scale = 1.0f);

  // Subspace buffers (fixed, seeded, shared by all stages): U [C,K] orthonormal columns, F [V,C].
  const Tensor& subspace_basis() const { return basis_; }
  const Tensor& subspace_fixed_embedding() const { return fixed_embed_; }
  // A stage boundary in a subspace model (subspace_k > 0, boundary before the last block) carries K
  // values per token instead of C. Forward: c = (x − F[tok])·U [B,T,K]; x = c·Uᵀ + F[tok] rebuilds x
  // exactly because x − F[tok] lies in span(U). Backward: dc = dx·U; dx = dc·Uᵀ loses nothing either,
  // since every parameter before the boundary moves x only within span(U). Outputs are (re)allocated
  // by the call; tokens are [B*T] on `tokens_device`.
  Status subspace_encode(const Tensor& x, const int32_t* tokens, Device tokens_device, Tensor& c);
  Status subspace_decode(const Tensor& c, const int32_t* tokens, Device tokens_device, Tensor& x);
  Status subspace_grad_encode(const Tensor& dx, Tensor& dc);
  Status subspace_grad_decode(const Tensor& dc, Tensor& dx);

  // Training FLOPs per token (forward + backward, matmuls and attention; 6·N + 6·L·T·C).
  double train_flops_per_token(int T) const;

 private:
  // Draws the group's initial values from its seeded stream. With `full` (a block's whole layout), draws the
  // whole block, as an unsharded model does, and keeps this shard's part: every shard gets the very weights.
  Status init_group(ParamGroup& g, uint64_t seed, uint64_t stream, const ParamGroup* full = nullptr);
  Status ensure_scratch(int B, int T);
  Status block_forward(int l, ActivationCache& c, const Tensor& in);
  Status block_backward(int l, ActivationCache& c, float* d);
  Status subspace_check(const Tensor& t, int width, const char* what) const;
  Status tp_sum(Tensor& scratch, int64_t n, int block, TpSite site);               // a no-op unless sharded
  Status gather_fixed(const int32_t* tokens, Device tokens_device, int B, int T);  // F[tok] into s_tmp_
  // y[BT,C] = U · (x W_kᵀ + b_k) stored as z = x W_kᵀ + b_k [BT,K] and y = z Uᵀ.
  bool subspace_block(int l) const { return cfg_.subspace_k > 0 && l < cfg_.layers - 1; }

  GptConfig cfg_;
  GptParts parts_;
  Exec ex_;
  ParamGroup embed_, head_;
  std::vector<ParamGroup> blocks_;
  Tensor basis_, fixed_embed_, zero_pos_;
  int heads_ = 0;  // heads of each block held here: all, or this tp shard's
  TpAllReduce tp_reduce_;

  // Backward scratch (one backward runs at a time per model), sized for the largest B·T seen.
  int64_t scratch_bt_ = 0;
  Tensor s_tokens_, s_tmp_, s_dln_, s_dqkv_, s_datty_, s_dfch_, s_dfchg_, s_dlogits_, s_dk_, s_attn_ws_;
};

}  // namespace lh
