// defines: device discovery that works on machines with no GPU or driver, and the CUDA/cuBLAS
// members of the check-macro family (LH_CUDA_CHECK, LH_CUDA_CHECK_FATAL, LH_CUBLAS_CHECK).
// Used by Tensor, ops, codecs and tests (GPU tests skip when cuda_device_count() == 0).
#pragma once

#include <string>

#include "core/status.h"

namespace lh {

// Number of usable CUDA devices; 0 in a CPU-only build or without a driver/device. Never fails.
int cuda_device_count();
bool cuda_available();
// "NVIDIA H200 (sm_90, 139 GiB)" or why there is none.
std::string cuda_device_summary();
// Waits for the work queued on the current CUDA device (cuda == true); nothing to wait for on the CPU.
Status device_synchronize(bool cuda);

}  // namespace lh

#if defined(LH_USE_CUDA)
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace lh {
template <>
struct ErrorDomain<cudaError_t> {
  static bool ok(cudaError_t c) { return c == cudaSuccess; }
  static const char* name() { return "CUDA"; }
  static std::string describe(cudaError_t c) { return std::string(cudaGetErrorName(c)) + " (" + cudaGetErrorString(c) + ")"; }
  static StatusCode status_code(cudaError_t) { return StatusCode::kUnavailable; }
};
template <>
struct ErrorDomain<cublasStatus_t> {
  static bool ok(cublasStatus_t c) { return c == CUBLAS_STATUS_SUCCESS; }
  static const char* name() { return "cuBLAS"; }
  static std::string describe(cublasStatus_t c) { return "status " + std::to_string(static_cast<int>(c)); }
  static StatusCode status_code(cublasStatus_t) { return StatusCode::kInternal; }
};
// The cuBLAS handle for the current thread (created on first use).
cublasHandle_t cublas_handle();
}  // namespace lh

#define LH_CUDA_CHECK(expr) LH_CHECK_CODE(expr)
#define LH_CUDA_CHECK_FATAL(expr) LH_CHECK_CODE_FATAL(expr)
#define LH_CUBLAS_CHECK_FATAL(expr) LH_CHECK_CODE_FATAL(expr)
#endif
