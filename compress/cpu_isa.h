// defines: run-time dispatch of the CPU codec loops to the widest instruction set the CPU has.
// kernels_cpu_isa.inc is compiled once per ISA (kernels_cpu_baseline/avx2/avx512.cpp, each with its
// own -m flags and -ffp-contract=off), and kernels_cpu.cpp and wire.cpp call the table picked here,
// so one binary runs on any x86-64 and uses AVX2+F16C or AVX-512 where the CPU (and OS) has them.
// Every path writes the same bits as the portable functors of kernels.h (tests compare them on
// NaN, Inf, denormals and huge values).
//
// Choosing: the best supported ISA, unless the environment variable LH_CPU_ISA names one
// (baseline, avx2, avx512) — for benchmarks and for checking a slower machine's path. A name the
// CPU cannot run, or an unknown one, stops the process with a message naming it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compress/kernels.h"
#include "core/status.h"

namespace lh::compress::kern {

enum class CpuIsa : int { baseline = 0, avx2 = 1, avx512 = 2 };

const char* cpu_isa_name(CpuIsa isa);
Result<CpuIsa> parse_cpu_isa(const std::string& name);
// Every ISA this binary has code for and this CPU can run, baseline first.
std::vector<CpuIsa> supported_cpu_isas();
// The widest of supported_cpu_isas().
CpuIsa best_cpu_isa();
// The ISA the codec loops run on now (LH_CPU_ISA, else the best).
CpuIsa active_cpu_isa();
// Switches the active ISA (tests and `bench codecs --isa`); an unsupported one is an error.
Status set_cpu_isa(CpuIsa isa);

// The loops one ISA provides. Each runs on the calling thread over a range; kernels_cpu.cpp splits a
// tensor across OpenMP threads. Blocks [b0, b1) of a quantized tensor: all full except possibly the
// tensor's last.
struct CpuCodecLoops {
  // Nearest rounding only (stochastic rounding stays on the portable functor); bits 8, 4 or 2.
  void (*quantize)(const float* x, int64_t n, const QuantSpec& q, uint8_t* scales, uint8_t* codes, int64_t b0,
                   int64_t b1);
  void (*dequantize)(const uint8_t* scales, const uint8_t* codes, int64_t n, const QuantSpec& q, float* y, int64_t b0,
                     int64_t b1);
  // Elements [b, e).
  void (*to_half)(const float* x, int64_t b, int64_t e, bool bf16, uint16_t* y);
  void (*from_half)(const uint16_t* x, int64_t b, int64_t e, bool bf16, float* y);
  void (*axpby)(float* y, const float* a, const float* b, float s, int64_t lo, int64_t hi);
  // y[i, j] = Σ_k a[i, k]·bt[k, j] for rows [row0, row1) (a: rows × r, bt: r × m with row stride ld),
  // summed in k order with one rounding per product and per sum (no FMA): the same bits on every ISA.
  void (*low_rank_rows)(const float* a, const float* bt, int64_t ld, int64_t m, int64_t r, float* y, int64_t row0,
                        int64_t row1);
  // PowerSGD's two products over M (rows × m), in an order fixed by the math alone, so every ISA gives
  // the same bits. p[i, k] = Σ_j M[i, j]·qt[k, j] for rows [row0, row1): 16 partial sums (j mod 16,
  // ascending, from +0) over the first m − m mod 16 columns, added as a fixed tree (l + 8, l + 4, l + 2,
  // l + 1), then the remaining columns in order. qt: r × m, row stride ld.
  void (*project_rows)(const float* M, int64_t m, const float* qt, int64_t ld, int64_t r, float* p, int64_t row0,
                       int64_t row1);
  // qt[k, j] = Σ_i M[i, j]·p[i, k] over all rows in order (from +0), for columns [col0, col1).
  void (*back_project_cols)(const float* M, int64_t rows, int64_t m, const float* p, int64_t r, float* qt, int64_t ld,
                            int64_t col0, int64_t col1);
  // XXH3_64bits_withSeed (xxHash inlined, so its own SIMD path follows the ISA; same value on all).
  uint64_t (*xxh3)(const void* data, size_t len, uint64_t seed);
};

const CpuCodecLoops& cpu_loops();                // the active ISA's
const CpuCodecLoops& cpu_loops_for(CpuIsa isa);  // a supported ISA's (tests)

// One per compiled ISA (defined in kernels_cpu_<isa>.cpp).
namespace isa_baseline {
extern const CpuCodecLoops kLoops;
}
namespace isa_avx2 {
extern const CpuCodecLoops kLoops;
}
namespace isa_avx512 {
extern const CpuCodecLoops kLoops;
}

}  // namespace lh::compress::kern
