// defines: the device-dispatching entry points of the codec kernels (CPU via OpenMP Thrust, CUDA via
// CUDA Thrust, same functors from kernels.h). Pointers live on ex.device. Used by the codec stages.
#pragma once

#include <cstdint>

#include "compress/kernels.h"
#include "core/exec.h"
#include "core/status.h"

namespace lh::compress::kern {

inline int64_t quant_blocks(int64_t n, int block) { return (n + block - 1) / block; }
inline int64_t quant_code_bytes(int64_t n, int bits) { return (n * bits + 7) / 8; }

void quantize(const Exec& ex, const float* x, int64_t n, const QuantSpec& q, uint8_t* scales, uint8_t* codes);
void dequantize(const Exec& ex, const uint8_t* scales, const uint8_t* codes, int64_t n, const QuantSpec& q, float* y);
void to_half(const Exec& ex, const float* x, int64_t n, bool bf16, uint16_t* y);
void from_half(const Exec& ex, const uint16_t* x, int64_t n, bool bf16, float* y);
// y[rows × m] = a[rows × r] · b[m × r]ᵀ: the decode of lowrank (P·Qᵀ) and subspace (C·Uᵀ). On the
// CPU, for r <= kLowRankMaxR (beyond it BLAS wins), a kernel of the active ISA that sums over r in order (the same bits on
// every ISA and thread count); BLAS / cuBLAS otherwise.
constexpr int64_t kLowRankMaxR = 64;
void low_rank_product(const Exec& ex, const float* a, const float* b, int64_t rows, int64_t m, int64_t r, float* y);
// PowerSGD's products with M (rows × m): p (rows × r) = M·q and q (m × r) = Mᵀ·p. On the CPU, for
// r <= kLowRankMaxR, kernels of the active ISA whose summation order is fixed (the same bits on every
// ISA and thread count); BLAS / cuBLAS otherwise.
void project(const Exec& ex, const float* M, int64_t rows, int64_t m, const float* q, int64_t r, float* p);
void back_project(const Exec& ex, const float* M, int64_t rows, int64_t m, const float* p, int64_t r, float* q);
// memcpy between host buffers, split across the OpenMP threads when large (the `none` codec).
void copy_host(void* dst, const void* src, size_t bytes);
// y = a + s·b (y may alias a or b).
void axpby(const Exec& ex, float* y, const float* a, const float* b, float s, int64_t n);
void randk_gather(const Exec& ex, const float* x, uint64_t n, uint64_t seed, int64_t k, float* v);
void randk_scatter(const Exec& ex, const float* v, uint64_t n, uint64_t seed, int64_t k, float* y);
void index_gather(const Exec& ex, const float* x, const uint32_t* idx, int64_t k, float* v);
void index_scatter(const Exec& ex, const float* v, const uint32_t* idx, int64_t k, float* y);
// spikes: rest = x with each block's s largest |x| set to 0, their in-block offsets (ascending) and
// values at [b·s, …) (kernels.h SpikesExtract); restore writes them back over y.
void spikes_extract(const Exec& ex, const float* x, int64_t n, int block, int s, float* rest, uint8_t* offs,
                    float* vals);
void spikes_restore(const Exec& ex, const uint8_t* offs, const float* vals, int64_t n, int block, int s, float* y);
// The k largest |x| under the strict order (|x| desc, index asc; NaN largest), written to idx
// (device memory, k entries) in ascending index order. A total order makes the set unique, so CPU
// and GPU pick the same elements.
Status topk_indices(const Exec& ex, const float* x, int64_t n, int64_t k, uint32_t* idx);

#if defined(LH_USE_CUDA)
namespace cuda {
void quantize(void* stream, const float* x, int64_t n, const QuantSpec& q, uint8_t* scales, uint8_t* codes);
void dequantize(void* stream, const uint8_t* scales, const uint8_t* codes, int64_t n, const QuantSpec& q, float* y);
void to_half(void* stream, const float* x, int64_t n, bool bf16, uint16_t* y);
void from_half(void* stream, const uint16_t* x, int64_t n, bool bf16, float* y);
void axpby(void* stream, float* y, const float* a, const float* b, float s, int64_t n);
void randk_gather(void* stream, const float* x, uint64_t n, uint64_t seed, int64_t k, float* v);
void randk_scatter(void* stream, const float* v, uint64_t n, uint64_t seed, int64_t k, float* y);
void index_gather(void* stream, const float* x, const uint32_t* idx, int64_t k, float* v);
void index_scatter(void* stream, const float* v, const uint32_t* idx, int64_t k, float* y);
Status topk_indices(void* stream, const float* x, int64_t n, int64_t k, uint32_t* idx);
void spikes_extract(void* stream, const float* x, int64_t n, int block, int s, float* rest, uint8_t* offs, float* vals);
void spikes_restore(void* stream, const uint8_t* offs, const float* vals, int64_t n, int block, int s, float* y);
}  // namespace cuda
#endif

}  // namespace lh::compress::kern
