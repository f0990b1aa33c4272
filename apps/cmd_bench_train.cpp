// `longhaul bench train [--json] [--device cpu|cuda] [--steps N] [--batch N]`: tokens/s and achieved
// GFLOP/s of whole training steps (tiny and small GPT) against GEMM GFLOP/s measured in the same run.
// Used by people tuning the model and ops, and by the closing figures.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "core/cuda_runtime.h"
#include "core/exec.h"
#include "core/gpt.h"
#include "core/ops.h"
#include "core/rng.h"
#include "core/trainer.h"

#ifdef LH_USE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace lh::app {
namespace {

struct Options {
  bool json = false;
  std::string device = "cpu";
  int steps = 8;
  int batch = 16;
  std::vector<std::string> models = {"tiny", "small"};
};

struct Row {
  std::string model, device;
  int batch = 0, seq = 0;
  int64_t params = 0;
  double step_ms = 0, fwd_ms = 0, bwd_ms = 0, opt_ms = 0, tokens_per_s = 0, gflops = 0;
  int gemm_m = 0, gemm_n = 0, gemm_k = 0;
  double gemm_gflops = 0, square_gemm_gflops = 0;
};

void sync(Device d) {
#if defined(LH_USE_CUDA)
  if (d == Device::cuda) LH_CUDA_CHECK_FATAL(cudaDeviceSynchronize());
#endif
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Tensor seeded(Device d, int64_t n, uint64_t seed) {
  Tensor h = Tensor::empty({n});
  Rng r(seed);
  for (int64_t i = 0; i < n; ++i) h.at(i) = r.normal();
  auto t = h.to(d);
  if (!t.ok()) fail("bench train: " + t.status().to_string());
  return std::move(t).value();
}

// Median GFLOP/s of C[M×N] = A[M×K]·B[N×K]ᵀ — the form linear_forward uses — over `repeats` runs.
double gemm_gflops(Device d, int M, int N, int K, int repeats) {
  const Exec ex{d, nullptr};
  Tensor A = seeded(d, int64_t(M) * K, 1), B = seeded(d, int64_t(N) * K, 2), C = seeded(d, int64_t(M) * N, 3);
  auto run = [&] {
    matmul(ex, false, true, M, N, K, 1.f, A.data<float>(), K, B.data<float>(), K, 0.f, C.data<float>(), N);
  };
  run();
  sync(d);
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    const double t0 = now_ms();
    run();
    sync(d);
    ms.push_back(now_ms() - t0);
  }
  return 2.0 * M * N * double(K) / (median(ms) * 1e6);
}

Row bench_model(const std::string& name, Device device, const Options& o) {
  auto preset = gpt_preset(name);
  if (!preset.ok()) fail(preset.status().to_string(), 2);
  const GptConfig cfg = *preset;
  auto made = Gpt::create(cfg, device, 1);
  if (!made.ok()) fail("bench train: " + made.status().to_string());
  Gpt& m = *made;
  AdamW opt;
  Status s = opt.init(m.param_groups(), device);
  if (!s.ok()) fail(s.to_string());
  const int B = o.batch, T = cfg.seq;
  // Random bytes: the speed of a step does not depend on the text, and the benchmark needs no corpus.
  std::vector<int32_t> tokens(size_t(B) * T), targets(size_t(B) * T);
  Rng rng(2);
  ActivationCache cache;
  AdamWConfig acfg;
  std::vector<double> fwd, bwd, upd, total;
  for (int step = 0; step < o.steps + 2; ++step) {  // two warm-up steps allocate caches and scratch
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int32_t>(rng.below(256));
      targets[i] = static_cast<int32_t>(rng.below(256));
    }
    const double t0 = now_ms();
    if (!(s = m.zero_grad()).ok()) fail(s.to_string());
    auto loss = m.forward(cache, tokens.data(), targets.data(), B, T);
    if (!loss.ok()) fail(loss.status().to_string());
    sync(device);
    const double t1 = now_ms();
    if (!(s = m.backward(cache)).ok()) fail(s.to_string());
    sync(device);
    const double t2 = now_ms();
    auto norm = opt.step(m.exec(), m.param_groups(), acfg, 1.0f, step + 1);
    if (!norm.ok()) fail(norm.status().to_string());
    sync(device);
    const double t3 = now_ms();
    if (step >= 2) {
      fwd.push_back(t1 - t0);
      bwd.push_back(t2 - t1);
      upd.push_back(t3 - t2);
      total.push_back(t3 - t0);
    }
  }
  Row r;
  r.model = name;
  r.device = device_name(device);
  r.batch = B;
  r.seq = T;
  r.params = m.num_params();
  r.step_ms = median(total);
  r.fwd_ms = median(fwd);
  r.bwd_ms = median(bwd);
  r.opt_ms = median(upd);
  r.tokens_per_s = double(B) * T / (r.step_ms * 1e-3);
  r.gflops = m.train_flops_per_token(T) * r.tokens_per_s * 1e-9;
  // The baseline: the model's own largest GEMM shape (the MLP's BT × 4C × C), then bench core's 1024³.
  r.gemm_m = B * T;
  r.gemm_n = 4 * cfg.d_model;
  r.gemm_k = cfg.d_model;
  r.gemm_gflops = gemm_gflops(device, r.gemm_m, r.gemm_n, r.gemm_k, 7);
  r.square_gemm_gflops = gemm_gflops(device, 1024, 1024, 1024, 5);
  return r;
}

void run_bench(const Options& o) {
  Device device = Device::cpu;
  if (o.device == "cuda")
    device = Device::cuda;
  else if (o.device != "cpu")
    fail("--device '" + o.device + "': choose cpu or cuda", 2);
  if (device == Device::cuda && !cuda_available()) fail("--device cuda: " + cuda_device_summary(), 1);
  std::vector<Row> rows;
  for (const auto& name : o.models) rows.push_back(bench_model(name, device, o));
  if (o.json) {
    nlohmann::json out = {{"bench", "train"}, {"threads", num_threads()}, {"steps", o.steps}};
    for (const Row& r : rows) {
      out["results"].push_back({{"model", r.model},
                                {"device", r.device},
                                {"batch", r.batch},
                                {"seq", r.seq},
                                {"params", r.params},
                                {"step_ms", r.step_ms},
                                {"forward_ms", r.fwd_ms},
                                {"backward_ms", r.bwd_ms},
                                {"optimizer_ms", r.opt_ms},
                                {"tokens_per_s", r.tokens_per_s},
                                {"gflops", r.gflops},
                                {"gemm_shape", {r.gemm_m, r.gemm_n, r.gemm_k}},
                                {"gemm_gflops", r.gemm_gflops},
                                {"fraction_of_gemm", r.gflops / r.gemm_gflops},
                                {"gemm1024_gflops", r.square_gemm_gflops},
                                {"fraction_of_gemm1024", r.gflops / r.square_gemm_gflops}});
    }
    std::printf("%s\n", out.dump().c_str());
    return;
  }
  std::printf("bench train: %d measured steps after 2 warm-up, %d threads\n", o.steps, num_threads());
  std::printf("%-6s %-4s %9s %8s %8s %8s %8s %10s %8s  %-16s %8s %7s %9s %7s\n", "model", "dev", "params", "step ms",
              "fwd ms", "bwd ms", "opt ms", "tokens/s", "GFLOP/s", "GEMM shape", "GFLOP/s", "ratio", "GEMM1024",
              "ratio");
  for (const Row& r : rows) {
    const std::string shape =
        std::to_string(r.gemm_m) + "x" + std::to_string(r.gemm_n) + "x" + std::to_string(r.gemm_k);
    std::printf("%-6s %-4s %9lld %8.1f %8.1f %8.1f %8.1f %10.0f %8.2f  %-16s %8.2f %7.3f %9.2f %7.3f\n",
                r.model.c_str(), r.device.c_str(), static_cast<long long>(r.params), r.step_ms, r.fwd_ms, r.bwd_ms,
                r.opt_ms, r.tokens_per_s, r.gflops, shape.c_str(), r.gemm_gflops, r.gflops / r.gemm_gflops,
                r.square_gemm_gflops, r.gflops / r.square_gemm_gflops);
  }
  std::printf("ratio: a whole training step's GFLOP/s over the GEMM's, both measured in this run\n");
}

RegisterCommand reg("bench", 30, [](CLI::App& bench) {
  auto o = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand("train", "tokens/s and GFLOP/s of GPT training steps vs GEMM GFLOP/s");
  cmd->add_flag("--json", o->json, "one JSON object on stdout");
  cmd->add_option("--device", o->device, "cpu|cuda")->capture_default_str();
  cmd->add_option("--steps", o->steps, "measured steps per model")->capture_default_str()->check(CLI::Range(1, 100000));
  cmd->add_option("--batch", o->batch, "sequences per step")->capture_default_str()->check(CLI::Range(1, 65536));
  cmd->add_option("--models", o->models, std::string("models to run (") + gpt_preset_names() + ")")
      ->capture_default_str();
  cmd->callback([o] { run_bench(*o); });
});

}  // namespace
}  // namespace lh::app
