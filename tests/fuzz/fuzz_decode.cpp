// libFuzzer target for the packet decoder: any bytes must yield a Status or a tensor within the
// limits. Built with clang as `fuzz_decode` (see CMakeLists.txt); other compilers get a replay
// driver that runs the seed packets and files given on the command line (ctest label `fuzz`).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "compress/codec_chain.h"
#include "core/rng.h"
#include "tests/fuzz/replay_driver.h"

using namespace lh;
using namespace lh::compress;

// Byte 0 picks the options: bit0 skips the hash (so the fuzzer reaches the checks behind it),
// bits 1-2 the receiving stream's role. The rest is the packet.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  DecodeOptions o;
  o.limits.max_numel = 1 << 16;
  o.limits.verify_hash = (data[0] & 1) == 0;
  static StreamState states[kNumCodecRoles] = {StreamState(Role::kActivation), StreamState(Role::kActivationGrad),
                                               StreamState(Role::kWeightGrad), StreamState(Role::kTpPartial)};
  StreamState& st = states[(data[0] >> 1) & 3];
  Tensor out;
  Status s = decode_packet(data + 1, size - 1, st, &out, o);
  if (s.ok() && (!out.defined() || out.numel() > o.limits.max_numel)) std::abort();
  if (!s.ok() && s.code() != StatusCode::kCorrupt) std::abort();
  if (st.stages().size() > 4) st.reset();  // delta memories must not grow across a whole campaign
  return 0;
}

// Valid packets of every codec: the seed corpus (`--write-corpus DIR`) and the replay inputs.
static std::vector<std::vector<uint8_t>> seed_inputs() {
  const char* specs[] = {"none",
                         "fp16",
                         "bf16",
                         "int8",
                         "int4:block=32,scale=fp32",
                         "int2:stochastic",
                         "topk:ratio=0.2",
                         "randk:ratio=0.3",
                         "lowrank:rank=2",
                         "subspace:k=4",
                         "ef+topk:ratio=0.1+int4",
                         "delta+int8",
                         "lowrank:rank=3+int8",
                         "subspace:k=8+fp16",
                         "int8+zstd",
                         "ef+int4+zstd",
                         "spikes:block=16,n=2+int4",
                         "spikes:values=fp32+int2+zstd"};
  std::vector<std::vector<uint8_t>> out;
  std::vector<int64_t> ids = {1, 2, 3};
  EncodeOptions eo;
  eo.sample_ids = &ids;
  for (const char* spec : specs) {
    auto chain = parse_codec_spec(spec);
    if (!chain.ok()) std::abort();
    StreamState tx(Role::kActivation, 3);
    Tensor x = Tensor::empty({3, 20});
    Rng r(7);
    for (int64_t i = 0; i < x.numel(); ++i) x.at(i) = r.normal();
    Packet p;
    if (!chain->encode(x, tx, &p, eo).ok()) std::abort();
    for (uint8_t mode : {0, 1}) {
      std::vector<uint8_t> in{mode};
      in.insert(in.end(), p.bytes.begin(), p.bytes.end());
      out.push_back(in);
    }
  }
  return out;
}

#if !defined(LH_LIBFUZZER)
int main(int argc, char** argv) {
  // Without a fuzzer: every seed, every truncation of it, and single-byte rewrites.
  lh::fuzz::ReplayPlan plan{"fuzz_decode", seed_inputs()};
  plan.rng_seed = 99;
  plan.mutations = 200;
  return lh::fuzz::replay_main(argc, argv, plan);
}
#endif
