// `longhaul selfcheck`: a quick check that the core library computes what it should on this machine
// (tensor copies, Philox reproducibility, a BLAS matmul against a plain loop). Used by newcomers and CI.
#include <cmath>
#include <cstdio>

#include "apps/commands.h"
#include "core/cuda_runtime.h"
#include "core/ops.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace lh::app {
namespace {

int run_selfcheck() {
  int failures = 0;
  auto report = [&](const char* what, bool ok) {
    std::printf("  %-40s %s\n", what, ok ? "ok" : "FAILED");
    failures += ok ? 0 : 1;
  };
  std::printf("longhaul %s selfcheck (%s)\n", LH_VERSION, cuda_device_summary().c_str());

  Rng a(42), b(42);
  bool same = true;
  for (int i = 0; i < 1000; ++i) same &= a.next_u32() == b.next_u32();
  report("Philox: same seed, same stream", same);

  const int M = 33, N = 17, K = 29;
  Tensor A = Tensor::empty({M, K}), B = Tensor::empty({K, N}), C = Tensor::zeros({M, N});
  Rng r(7);
  for (int64_t i = 0; i < A.numel(); ++i) A.at(i) = r.normal();
  for (int64_t i = 0; i < B.numel(); ++i) B.at(i) = r.normal();
  matmul(Exec::cpu(), false, false, M, N, K, 1.f, A.data<float>(), K, B.data<float>(), N, 0.f, C.data<float>(), N);
  double max_err = 0;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double ref = 0;
      for (int k = 0; k < K; ++k) ref += double(A.at(i * K + k)) * B.at(k * N + j);
      max_err = std::max(max_err, std::fabs(ref - C.at(i * N + j)));
    }
  report("matmul (BLAS) vs reference loop", max_err < 1e-4);

  Tensor v = A.view({K, M});
  report("tensor view shares storage", v.data<float>() == A.data<float>());
  if (cuda_available()) {
    auto d = A.to(Device::cuda);
    bool ok = d.ok();
    if (ok) {
      auto back = d->to(Device::cpu);
      ok = back.ok() && back->to_vector() == A.to_vector();
    }
    report("CPU -> CUDA -> CPU copy", ok);
  }
  std::printf("selfcheck: %s\n", failures == 0 ? "all ok" : "FAILED");
  return failures == 0 ? 0 : 1;
}

RegisterCommand reg("", 90, [](CLI::App& app) {
  auto* cmd = app.add_subcommand("selfcheck", "check the core library on this machine");
  cmd->callback([] {
    if (run_selfcheck() != 0) throw CLI::RuntimeError(1);
  });
});

}  // namespace
}  // namespace lh::app
