// defines: lh::fuzz::replay_main — the main() of a fuzz target built without libFuzzer (gcc): `--write-corpus DIR`
// writes the seeds as files (the corpus of a libFuzzer campaign, scripts/fuzz_campaign.sh); files given as arguments
// are run once each; with no arguments every seed, every truncation of it, the caller's extra variants and
// `mutations` rewrites of 1..max_edits bytes after byte 0 (byte 0 steers the targets) are run. Used by fuzz_decode
// and fuzz_control.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "core/rng.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace lh::fuzz {

struct ReplayPlan {
  const char* name;  // printed: "<name> replay: N inputs, no crash"
  std::vector<std::vector<uint8_t>> seeds;
  uint64_t rng_seed = 1;
  int mutations = 200;  // rewrites per seed
  int max_edits = 1;    // bytes rewritten per mutation: 1..max_edits
  // More inputs per seed (e.g. the same body under every header type); each is run once.
  std::function<std::vector<std::vector<uint8_t>>(const std::vector<uint8_t>&)> variants;
};

inline int replay_main(int argc, char** argv, const ReplayPlan& plan) {
  auto run = [](const std::vector<uint8_t>& in, size_t n) { LLVMFuzzerTestOneInput(in.data(), n); };
  if (argc == 3 && std::string(argv[1]) == "--write-corpus") {
    int i = 0;
    for (const auto& in : plan.seeds) {
      std::ofstream f(std::string(argv[2]) + "/seed" + std::to_string(i++), std::ios::binary);
      f.write(reinterpret_cast<const char*>(in.data()), static_cast<std::streamsize>(in.size()));
    }
    return 0;
  }
  size_t runs = 0;
  for (int a = 1; a < argc; ++a, ++runs) {
    std::ifstream f(argv[a], std::ios::binary);
    std::vector<uint8_t> in((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    run(in, in.size());
  }
  if (argc == 1) {
    Rng r(plan.rng_seed);
    for (const auto& seed : plan.seeds) {
      for (size_t n = 0; n <= seed.size(); ++n, ++runs) run(seed, n);
      if (plan.variants)
        for (const auto& v : plan.variants(seed)) run(v, v.size()), ++runs;
      for (int k = 0; k < plan.mutations && seed.size() > 1; ++k, ++runs) {
        std::vector<uint8_t> m = seed;
        const int edits = 1 + int(r.below(uint64_t(plan.max_edits)));
        for (int e = 0; e < edits; ++e) m[1 + r.below(m.size() - 1)] = uint8_t(r.next_u32());
        run(m, m.size());
      }
    }
  }
  std::printf("%s replay: %zu inputs, no crash\n", plan.name, runs);
  return 0;
}

}  // namespace lh::fuzz
