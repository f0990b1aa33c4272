// defines: lh::Exec — where an op runs (device and CUDA stream) — and thread budgeting for BLAS and
// OpenMP. Used by every op, codec and the model.
#pragma once

#include "core/dtype.h"

namespace lh {

struct Exec {
  Device device = Device::cpu;
  void* stream = nullptr;  // cudaStream_t on CUDA; nullptr = the default stream

  static Exec cpu() { return Exec{}; }
  static Exec cuda(void* s = nullptr) { return Exec{Device::cuda, s}; }
};

// Threads for OpenMP loops and OpenBLAS in this process (at least 1). `launch` divides the cores
// among the workers it starts on one machine.
void set_num_threads(int n);
int num_threads();

}  // namespace lh
