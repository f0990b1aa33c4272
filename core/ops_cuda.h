// defines: the CUDA launchers behind core/ops.h (implemented in core/*.cu, only with LH_USE_CUDA).
// Used by the CPU/CUDA dispatch in core/ops_*.cpp; nothing else includes it.
#pragma once

#include "core/ops.h"

#if defined(LH_USE_CUDA)
namespace lh::cuda {
void matmul(void* stream, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc);
}  // namespace lh::cuda
#define LH_CUDA_DISPATCH(ex, call)                                   \
  do {                                                               \
    if ((ex).device == ::lh::Device::cuda) { ::lh::cuda::call; return; } \
  } while (0)
#else
#define LH_CUDA_DISPATCH(ex, call) \
  LH_ASSERT((ex).device == ::lh::Device::cpu, "CUDA op in a build without CUDA")
#endif
