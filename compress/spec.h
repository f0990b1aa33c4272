// defines: StageSpec and the codec-spec grammar ("ef+topk:ratio=0.01+int4") turned into stage lists.
// Used by CodecChain (parse_codec_spec), the CLI flags (--compress-*) and the controller.
//
// Grammar:   spec  := stage ('+' stage)* | 'preset:' name   (codec_presets(): lossless, safe, balanced)
//            stage := name [':' option (',' option)*]
//            option:= key '=' value | flag
// Stages and options:
//   none | fp16 | bf16                      terminal: fp32, or round-to-nearest-even halves
//   int8 | int4 | int2  [block=N] [stochastic] [scale=fp16|fp32]
//                                           terminal; block-wise absmax, block in 4..65536, multiple of 4
//   topk  [ratio=R]     (0 < R <= 1, default 0.01)   the largest |x| with their indices
//   randk [ratio=R]     (default 0.1)                a seeded random subset, no indices sent
//   lowrank [rank=R] [iters=K]  (R 1..1024 default 4, K 1..16 default 1)   PowerSGD
//   subspace [k=K] [seed=S]     (K 1..4096 default 32)                    x·U on a seeded basis
//   spikes [block=B] [n=S] [values=bf16|fp32]   (B 4..256 default 64, S 1..8 and < B, default 1)
//                               each block's S largest |x| travel apart (offset in the block + value,
//                               bf16 by default); the rest, those S set to 0, goes to later stages
//                               ("spike reserving": `spikes+int4` quantizes without the outliers)
//   delta                       AQ-SGD change from the last value of the same sample (first only)
//   ef                          error feedback (first only)
//   zstd  [level=N]     (1..19, default 3)           lossless: zstd of the whole packet the stages
//                                                    before it make (last only; `zstd` alone = none+zstd)
// Transforms (topk, randk, lowrank, subspace, spikes) may follow one another; a terminal stage comes last
// (before a zstd) and, when absent, the last transform's outputs travel as fp32 (`none`).
// zstd is a CPU stage for tensors on any device: it compresses the encoded packet's host bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compress/wire.h"
#include "core/status.h"

namespace lh::compress {

struct StageSpec {
  CodecId id = CodecId::none;
  // int8/int4/int2
  int block = 64;
  bool stochastic = false;
  bool fp32_scale = false;
  // topk/randk
  double ratio = 0.01;
  // lowrank
  int rank = 4;
  int iters = 1;
  // subspace
  int k = 32;
  uint64_t seed = 0x5EEDBA5Eull;
  // zstd
  int level = 3;
  // spikes
  int spike_block = 64;
  int spikes = 1;
  bool spike_fp32 = false;

  bool terminal() const;
  bool transform() const;  // has children: topk, randk, lowrank, subspace, spikes
  int bits() const;        // 8/4/2 for the integer quantizers, else 0
  std::string to_string() const;  // canonical text, options always written out
};

// Number of values topk/randk keep of n: round(ratio·n), at least 1 when n > 0.
int64_t sparse_count(double ratio, int64_t n);
// Limits of the spikes stage: offsets are one byte, a block keeps at most kMaxSpikes values.
constexpr int kMaxSpikeBlock = 256;
constexpr int kMaxSpikes = 8;
// Number of values spikes keeps of n: per block of `block`, min(s, the block's length).
int64_t spike_count(int64_t n, int block, int s);

// Named chains from the compression frontier: `preset:NAME` anywhere a spec is taken stands for `spec`.
struct CodecPreset {
  const char* name;
  const char* spec;
};
const std::vector<CodecPreset>& codec_presets();
// The preset called `name` (without "preset:"), or nullptr.
const CodecPreset* find_preset(const std::string& name);

// The chain a known `preset:NAME` stands for; any other text unchanged (so that metrics and messages name the
// chain a job really runs).
std::string expand_preset(const std::string& spec);

// A codec spec or `preset:NAME` to its stages.
Result<std::vector<StageSpec>> parse_stages(const std::string& spec);
std::string stages_to_string(const std::vector<StageSpec>& stages);

}  // namespace lh::compress
