// CUDA device discovery that never fails on a machine without a GPU, and the per-thread cuBLAS handle.
// Used by Tensor, ops, codecs, `longhaul --version` and the GPU tests' skip check.
#include "core/cuda_runtime.h"

#include <mutex>

namespace lh {

#if defined(LH_USE_CUDA)
int cuda_device_count() {
  static int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no driver" error
      return 0;
    }
    return n;
  }();
  return count;
}

std::string cuda_device_summary() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("CUDA build, no usable device: ") + cudaGetErrorString(e);
  }
  if (n == 0) return "CUDA build, no device";
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "CUDA build, device properties unavailable";
  return std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
         std::to_string(p.totalGlobalMem >> 30) + " GiB), " + std::to_string(n) + " device(s)";
}

cublasHandle_t cublas_handle() {
  thread_local cublasHandle_t handle = [] {
    cublasHandle_t h = nullptr;
    LH_CUBLAS_CHECK_FATAL(cublasCreate(&h));
    return h;
  }();
  return handle;
}

Status device_synchronize(bool cuda) {
  if (cuda) LH_CUDA_CHECK(cudaDeviceSynchronize());
  return Status::Ok();
}
#else
int cuda_device_count() { return 0; }
Status device_synchronize(bool) {
  return Status::Ok();
}
std::string cuda_device_summary() { return "built without CUDA"; }
#endif

bool cuda_available() { return cuda_device_count() > 0; }

}  // namespace lh
