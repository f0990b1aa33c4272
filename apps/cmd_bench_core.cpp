// `longhaul bench core [--json] [--device cpu|cuda|all] [--repeats N]`: throughput of the core ops —
// GEMM GFLOP/s at 3 sizes, layernorm/GELU GB/s and attention GFLOP/s forward and backward — each with
// a ratio to a baseline measured in the same run. Used by people tuning ops and by scripts/gpu_check.sh.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "core/cuda_runtime.h"
#include "core/ops.h"
#include "core/rng.h"
#include "core/tensor.h"

#ifdef LH_USE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace lh::app {
namespace {

struct BenchOptions {
  bool json = false;
  std::string device = "auto";
  int repeats = 5;
};

// One measured figure and the baseline it is compared with.
struct Row {
  std::string device, op, shape, unit, baseline;
  double ms = 0, rate = 0, ratio = 0;
};

void sync(Device d) {
#if defined(LH_USE_CUDA)
  if (d == Device::cuda) LH_CUDA_CHECK_FATAL(cudaDeviceSynchronize());
#endif
}

// Median wall time of `repeats` runs after one warm-up run, in milliseconds.
double time_ms(Device d, int repeats, const std::function<void()>& fn) {
  fn();
  sync(d);
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    sync(d);
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// A float buffer on `d` with seeded normal contents (the values do not matter for speed, only that
// they are finite and not denormal).
class Buffer {
 public:
  Buffer(Device d, int64_t n, uint64_t seed) {
    Tensor h = Tensor::empty({n});
    Rng r(seed);
    for (int64_t i = 0; i < n; ++i) h.at(i) = r.normal();
    if (d == Device::cpu) {
      t_ = h;
    } else {
      auto t = h.to(d);
      if (!t.ok()) fail("bench core: " + t.status().to_string());
      t_ = std::move(t).value();
    }
  }
  float* get() const { return t_.data<float>(); }

 private:
  Tensor t_;
};

// Plain OpenMP i-k-j triple loop: the no-BLAS baseline the CPU GEMM is compared with.
void loop_gemm(int n, const float* A, const float* B, float* C) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; ++i) {
    float* c = C + int64_t(i) * n;
    std::fill(c, c + n, 0.f);
    for (int k = 0; k < n; ++k) {
      const float a = A[int64_t(i) * n + k];
      const float* b = B + int64_t(k) * n;
      for (int j = 0; j < n; ++j) c[j] += a * b[j];
    }
  }
}

// memcpy (CPU) or device-to-device copy (CUDA) of `bytes`; GB/s counts read + write.
double copy_gbps(Device d, size_t bytes, int repeats) {
  Buffer src(d, int64_t(bytes / 4), 1), dst(d, int64_t(bytes / 4), 2);
  double ms = time_ms(d, repeats, [&] {
    if (d == Device::cpu) {
      std::memcpy(dst.get(), src.get(), bytes);
    } else {
#if defined(LH_USE_CUDA)
      LH_CUDA_CHECK_FATAL(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice));
#endif
    }
  });
  return 2.0 * bytes / (ms * 1e6);
}

void bench_device(Device d, const BenchOptions& o, std::vector<Row>& rows, double* cpu_gemm_gflops) {
  const Exec ex = d == Device::cpu ? Exec::cpu() : Exec::cuda();
  const std::string dev = d == Device::cpu ? "cpu" : "cuda";
  const int R = o.repeats;

  // GEMM: square sizes; the CPU is compared with the plain loop, CUDA with the CPU BLAS figure.
  const std::vector<int> sizes =
      d == Device::cpu ? std::vector<int>{256, 512, 1024} : std::vector<int>{1024, 2048, 4096};
  for (size_t si = 0; si < sizes.size(); ++si) {
    const int n = sizes[si];
    Buffer A(d, int64_t(n) * n, 3), B(d, int64_t(n) * n, 4), C(d, int64_t(n) * n, 5);
    double ms = time_ms(d, R, [&] { matmul(ex, false, false, n, n, n, 1.f, A.get(), n, B.get(), n, 0.f, C.get(), n); });
    double gflops = 2.0 * n * n * double(n) / (ms * 1e6);
    Row r{dev,    "gemm", std::to_string(n) + "x" + std::to_string(n) + "x" + std::to_string(n), "GFLOP/s", "", ms,
          gflops, 0};
    if (d == Device::cpu) {
      *cpu_gemm_gflops = gflops;  // the last (largest) size is the baseline for CUDA
      double loop_ms = time_ms(d, 1, [&] { loop_gemm(n, A.get(), B.get(), C.get()); });
      r.baseline = "plain OpenMP loop";
      r.ratio = gflops / (2.0 * n * n * double(n) / (loop_ms * 1e6));
    } else if (*cpu_gemm_gflops > 0) {
      r.baseline = "CPU BLAS gemm 1024";
      r.ratio = gflops / *cpu_gemm_gflops;
    } else {
      r.baseline = "none (--device all adds the CPU figure)";
    }
    rows.push_back(r);
  }

  // GPT-2-small-shaped activations: B=4, T=256, C=768, 12 heads.
  const int B = 4, T = 256, C = 768, NH = 12, N = B * T;
  const int hs = C / NH;

  // Bandwidth-bound ops, compared with a copy of the same tensor. Bytes are the minimal traffic.
  const double copy = copy_gbps(d, size_t(N) * C * 4, R);
  {
    Buffer x(d, int64_t(N) * C, 6), w(d, C, 7), b(d, C, 8), out(d, int64_t(N) * C, 9), mean(d, N, 10), rstd(d, N, 11),
        dout(d, int64_t(N) * C, 12), dx(d, int64_t(N) * C, 13), dw(d, C, 14), db(d, C, 15);
    double f = time_ms(
        d, R, [&] { layernorm_forward(ex, out.get(), mean.get(), rstd.get(), x.get(), w.get(), b.get(), N, C); });
    double g = time_ms(d, R, [&] {
      layernorm_backward(ex, dx.get(), dw.get(), db.get(), dout.get(), x.get(), w.get(), mean.get(), rstd.get(), N, C);
    });
    const std::string shape = std::to_string(N) + "x" + std::to_string(C);
    double fr = 8.0 * N * C / (f * 1e6), gr = 16.0 * N * C / (g * 1e6);
    rows.push_back({dev, "layernorm_fwd", shape, "GB/s", "copy of the same bytes", f, fr, fr / copy});
    rows.push_back({dev, "layernorm_bwd", shape, "GB/s", "copy of the same bytes", g, gr, gr / copy});
  }
  {
    const int64_t n = int64_t(N) * 4 * C;  // the MLP's hidden activation
    const double copy4 = copy_gbps(d, size_t(n) * 4, R);
    Buffer x(d, n, 16), out(d, n, 17), dout(d, n, 18), dx(d, n, 19);
    double f = time_ms(d, R, [&] { gelu_forward(ex, out.get(), x.get(), n); });
    double g = time_ms(d, R, [&] { gelu_backward(ex, dx.get(), x.get(), dout.get(), n); });
    double fr = 8.0 * n / (f * 1e6), gr = 16.0 * n / (g * 1e6);
    rows.push_back({dev, "gelu_fwd", std::to_string(n), "GB/s", "copy of the same bytes", f, fr, fr / copy4});
    rows.push_back({dev, "gelu_bwd", std::to_string(n), "GB/s", "copy of the same bytes", g, gr, gr / copy4});
  }
  {
    // GFLOP/s counts the dense GEMM work (2 GEMMs forward, 4 backward, no causal halving) and is
    // compared with the square GEMM of the middle size measured above.
    Buffer qkv(d, int64_t(N) * 3 * C, 20), out(d, int64_t(N) * C, 21), att(d, int64_t(B) * NH * T * T, 22),
        dout(d, int64_t(N) * C, 23), dqkv(d, int64_t(N) * 3 * C, 24),
        ws(d, int64_t(attention_backward_workspace(B, T, C, NH) / 4), 25);
    double f = time_ms(d, R, [&] { attention_forward(ex, out.get(), att.get(), qkv.get(), B, T, C, NH); });
    double g = time_ms(
        d, R, [&] { attention_backward(ex, dqkv.get(), dout.get(), qkv.get(), att.get(), B, T, C, NH, ws.get()); });
    const double gemm = 2.0 * B * NH * double(T) * T * hs;
    const std::string shape =
        "B" + std::to_string(B) + " T" + std::to_string(T) + " C" + std::to_string(C) + " NH" + std::to_string(NH);
    double fr = 2 * gemm / (f * 1e6), gr = 4 * gemm / (g * 1e6);
    double ref = 0;
    for (auto& r : rows)
      if (r.device == dev && r.op == "gemm") ref = r.rate;  // the largest size: the device's GEMM rate
    rows.push_back({dev, "attention_fwd", shape, "GFLOP/s", "largest gemm", f, fr, ref > 0 ? fr / ref : 0});
    rows.push_back({dev, "attention_bwd", shape, "GFLOP/s", "largest gemm", g, gr, ref > 0 ? gr / ref : 0});
  }
}

int run_bench_core(const BenchOptions& o) {
  std::vector<Device> devices;
  if (o.device == "cpu" || o.device == "all" || o.device == "auto") devices.push_back(Device::cpu);
  if (o.device == "cuda" || o.device == "all" || (o.device == "auto" && cuda_available())) {
    if (!cuda_available()) fail("bench core: --device " + o.device + " needs CUDA: " + cuda_device_summary());
    devices.push_back(Device::cuda);
  }
  std::vector<Row> rows;
  double cpu_gemm = 0;
  for (Device d : devices) bench_device(d, o, rows, &cpu_gemm);
  if (!o.json) {
    std::printf("longhaul bench core: %d threads, %s, median of %d runs\n", num_threads(),
                cuda_device_summary().c_str(), o.repeats);
    std::printf("%-5s %-14s %-24s %10s %12s %-8s %8s  %s\n", "dev", "op", "shape", "ms", "rate", "unit", "ratio",
                "baseline");
  }
  for (const auto& r : rows) {
    if (o.json) {
      nlohmann::json j = {{"bench", "core"},         {"device", r.device}, {"op", r.op},
                          {"shape", r.shape},        {"ms", r.ms},         {"rate", r.rate},
                          {"unit", r.unit},          {"ratio", r.ratio},   {"baseline", r.baseline},
                          {"threads", num_threads()}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%-5s %-14s %-24s %10.3f %12.2f %-8s %8.2f  %s\n", r.device.c_str(), r.op.c_str(), r.shape.c_str(),
                  r.ms, r.rate, r.unit.c_str(), r.ratio, r.baseline.c_str());
    }
  }
  return 0;
}

RegisterCommand reg("bench", 10, [](CLI::App& bench) {
  auto opts = std::make_shared<BenchOptions>();
  auto* cmd = bench.add_subcommand("core", "GEMM, layernorm, GELU and attention throughput on CPU (and CUDA)");
  cmd->add_flag("--json", opts->json, "one JSON object per line");
  cmd->add_option("--device", opts->device, "cpu, cuda, all, or auto (CPU plus CUDA when a device is found)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda", "all"}))
      ->capture_default_str();
  cmd->add_option("--repeats", opts->repeats, "timed runs per figure (the median is reported)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->callback([opts] {
    if (run_bench_core(*opts) != 0) throw CLI::RuntimeError(1);
  });
});

}  // namespace
}  // namespace lh::app
