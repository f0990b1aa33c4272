// Thread budget shared by OpenMP loops and OpenBLAS. Used by apps (--threads) and launch.
#include <omp.h>

#include <algorithm>

#include "core/exec.h"

extern "C" void openblas_set_num_threads(int);

namespace lh {

static int g_threads = 0;

void set_num_threads(int n) {
  n = std::max(1, n);
  g_threads = n;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return g_threads > 0 ? g_threads : omp_get_max_threads(); }

}  // namespace lh
