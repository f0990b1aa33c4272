// defines: matrix_and_bias_group — a parameter group ("block.0") of one rows×cols weight followed by a bias of cols,
// params and grads zeroed on the CPU. Used by the PowerSGD and dp-reducer tests.
#pragma once

#include "core/gpt.h"

namespace lh {

inline ParamGroup matrix_and_bias_group(int64_t rows, int64_t cols) {
  ParamGroup g;
  g.name = "block.0";
  ParamSlice w;
  w.name = "w";
  w.shape = {rows, cols};
  ParamSlice b;
  b.name = "b";
  b.offset = rows * cols;
  b.shape = {cols};
  g.slices = {w, b};
  g.numel = rows * cols + cols;
  g.grads = Tensor::zeros({g.numel});
  g.params = Tensor::zeros({g.numel});
  return g;
}

}  // namespace lh
