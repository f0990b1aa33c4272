// `longhaul bench codecs`: compression ratio, error and encode/decode bandwidth of every codec, each
// beside memcpy of the same buffer in the same run (on the CPU a memcpy split across all the codec
// threads, the speed the streaming codecs are held to). --isa runs the CPU rows once per instruction
// set (compress/cpu_isa.h), so the portable and the dispatched paths are compared in one run.
// Used by engineers and CI to check the codec targets; scripts/bench_codecs_vs_torch.sh puts PyTorch's
// figures beside them.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/commands.h"
#include "compress/codec_chain.h"
#include "compress/cpu_isa.h"
#include "core/cuda_runtime.h"
#include "core/exec.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace lh::app {
namespace {

using compress::CodecChain;
using compress::Packet;
using compress::StreamState;

struct CodecBenchOptions {
  bool json = false;
  std::string device = "cpu";
  std::vector<int64_t> sizes = {1 << 20, 1 << 24};
  std::string specs;  // ';'-separated; empty = the default list
  int repeats = 5;
  std::vector<std::string> isas;  // CPU instruction sets; empty = the active one
};

const char* kDefaultSpecs =
    "none;fp16;bf16;int8;int4;int2;int8:stochastic;int4:block=32;topk:ratio=0.01;randk:ratio=0.1;"
    "lowrank:rank=8;subspace:k=64;ef+topk:ratio=0.01+int4;lowrank:rank=8+int8;subspace:k=32+int8;int8+zstd;int4+zstd;"
    "spikes+int4;spikes+int4+zstd";

void sync(Device d) {
#if defined(LH_USE_CUDA)
  if (d == Device::cuda) LH_CUDA_CHECK_FATAL(cudaDeviceSynchronize());
#else
  (void)d;
#endif
}

// Median seconds of `repeats` runs of f, after one warm-up run.
template <class F>
double median_seconds(Device d, int repeats, F&& f) {
  f();
  sync(d);
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    auto a = std::chrono::steady_clock::now();
    f();
    sync(d);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Row {
  std::string spec, shape, device, isa;
  double ratio, rel_rms, encode_gbps, decode_gbps, memcpy_gbps;
};

Tensor gaussian(const Shape& s, Device d) {
  Tensor x = Tensor::empty(s);
  float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) p[i] = philox_normal(1234, 0, static_cast<uint64_t>(i));
  if (d == Device::cpu) return x;
  auto r = x.to(d);
  if (!r.ok()) fail(r.status().to_string());
  return *r;
}

double rel_rms(const Tensor& a, const Tensor& b) {
  std::vector<float> x = a.to_vector(), y = b.to_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    den += double(x[i]) * x[i];
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

void parallel_memcpy(void* dst, const void* src, size_t bytes) {
  const int64_t chunk = 1 << 20, chunks = static_cast<int64_t>((bytes + chunk - 1) / chunk);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < chunks; ++i) {
    const size_t off = static_cast<size_t>(i * chunk);
    std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off,
                std::min<size_t>(static_cast<size_t>(chunk), bytes - off));
  }
}

Row bench_one(const std::string& spec, int64_t n, Device d, int repeats) {
  auto chain = compress::parse_codec_spec(spec);
  if (!chain.ok()) fail(chain.status().to_string());
  const int64_t cols = 1024;
  const Shape shape{n / cols, cols};  // 2-D, so lowrank and subspace have a matrix
  Tensor x = gaussian(shape, d);
  auto dst = Tensor::create(shape, DType::f32, d);
  if (!dst.ok()) fail(dst.status().to_string());
  const double raw = double(CodecChain::raw_bytes(x));
  // The baseline: memcpy of the same bytes, split across the threads the codecs use (cudaMemcpy
  // device to device on CUDA).
  double tc = median_seconds(d, repeats, [&] {
    if (d == Device::cpu) {
      parallel_memcpy(dst->raw_data(), x.raw_data(), x.nbytes());
      return;
    }
    Status s = copy_bytes(dst->raw_data(), d, x.raw_data(), d, x.nbytes());
    if (!s.ok()) fail(s.to_string());
  });
  StreamState tx(Role::kActivation, 1), rx(Role::kActivation);
  Packet p;
  std::vector<int64_t> ids;
  compress::EncodeOptions eo;
  if (chain->needs_sample_ids()) {
    for (int64_t i = 0; i < shape[0]; ++i) ids.push_back(i);
    eo.sample_ids = &ids;
  }
  double te = median_seconds(d, repeats, [&] {
    Status s = chain->encode(x, tx, &p, eo);
    if (!s.ok()) fail(spec + ": " + s.to_string());
  });
  Tensor y = *dst;  // decode in place, as a receiver with a preallocated buffer does
  compress::DecodeOptions o;
  o.limits.max_numel = int64_t{1} << 31;
  double td = median_seconds(d, repeats, [&] {
    Status s = compress::decode_packet(p.bytes.data(), p.size(), rx, &y, o);
    if (!s.ok()) fail(spec + ": " + s.to_string());
  });
  Row r;
  r.spec = spec;
  r.shape = shape_string(shape);
  r.device = device_name(d);
  r.isa = d == Device::cpu ? compress::kern::cpu_isa_name(compress::kern::active_cpu_isa()) : "-";
  r.ratio = raw / double(p.size());
  r.rel_rms = rel_rms(x, y);
  r.encode_gbps = raw / te / 1e9;
  r.decode_gbps = raw / td / 1e9;
  r.memcpy_gbps = raw / tc / 1e9;
  return r;
}

int run(const CodecBenchOptions& o) {
  std::vector<Device> devices;
  if (o.device == "cpu" || o.device == "all") devices.push_back(Device::cpu);
  if (o.device == "cuda" || o.device == "all") {
    if (!cuda_available()) fail("bench codecs: --device " + o.device + " needs CUDA: " + cuda_device_summary());
    devices.push_back(Device::cuda);
  }
  std::vector<std::string> specs;
  std::stringstream ss(o.specs.empty() ? kDefaultSpecs : o.specs);
  for (std::string s; std::getline(ss, s, ';');)
    if (!s.empty()) specs.push_back(s);
  for (const auto& s : specs) {
    auto c = compress::parse_codec_spec(s);
    if (!c.ok()) fail(c.status().to_string());
  }
  std::vector<compress::kern::CpuIsa> isas;
  for (const auto& name : o.isas) {
    if (name == "all") {
      isas = compress::kern::supported_cpu_isas();
      break;
    }
    auto isa = compress::kern::parse_cpu_isa(name);
    if (isa.ok()) {
      Status s = compress::kern::set_cpu_isa(*isa);
      if (!s.ok()) isa = s;
    }
    if (!isa.ok()) fail("bench codecs: --isa " + name + ": " + isa.status().message());
    isas.push_back(*isa);
  }
  if (isas.empty()) isas.push_back(compress::kern::active_cpu_isa());
  if (!o.json) {
    std::printf(
        "longhaul bench codecs: %d threads, %s, median of %d runs; GB/s of raw fp32 bytes; memcpy on %d threads\n",
        num_threads(), cuda_device_summary().c_str(), o.repeats, num_threads());
    std::printf("%-4s %-8s %-28s %-13s %8s %9s %9s %9s %9s %7s %7s\n", "dev", "isa", "spec", "shape", "ratio",
                "rel_rms", "enc GB/s", "dec GB/s", "memcpy", "enc/mc", "dec/mc");
  }
  struct Run {
    Device device;
    compress::kern::CpuIsa isa;
  };
  std::vector<Run> runs;
  for (Device d : devices) {
    if (d != Device::cpu) runs.push_back({d, isas.front()});
    if (d == Device::cpu)
      for (auto isa : isas) runs.push_back({d, isa});
  }
  for (int64_t n : o.sizes)
    for (const auto& spec : specs)
      for (const Run& run : runs) {  // the ISAs of one codec side by side, in the same minute
        if (run.device == Device::cpu) {
          Status s = compress::kern::set_cpu_isa(run.isa);
          if (!s.ok()) fail(s.to_string());
        }
        Row r = bench_one(spec, n, run.device, o.repeats);
        if (o.json) {
          nlohmann::json j = {{"bench", "codecs"},
                              {"device", r.device},
                              {"isa", r.isa},
                              {"spec", r.spec},
                              {"shape", r.shape},
                              {"ratio", r.ratio},
                              {"rel_rms", r.rel_rms},
                              {"encode_gbps", r.encode_gbps},
                              {"decode_gbps", r.decode_gbps},
                              {"memcpy_gbps", r.memcpy_gbps},
                              {"encode_vs_memcpy", r.encode_gbps / r.memcpy_gbps},
                              {"decode_vs_memcpy", r.decode_gbps / r.memcpy_gbps},
                              {"threads", num_threads()}};
          std::printf("%s\n", j.dump().c_str());
        } else {
          std::printf("%-4s %-8s %-28s %-13s %8.2f %9.2e %9.2f %9.2f %9.2f %7.2f %7.2f\n", r.device.c_str(),
                      r.isa.c_str(), r.spec.c_str(), r.shape.c_str(), r.ratio, r.rel_rms, r.encode_gbps, r.decode_gbps,
                      r.memcpy_gbps, r.encode_gbps / r.memcpy_gbps, r.decode_gbps / r.memcpy_gbps);
        }
        std::fflush(stdout);
      }
  return 0;
}

RegisterCommand reg("bench", 20, [](CLI::App& bench) {
  auto opts = std::make_shared<CodecBenchOptions>();
  auto* cmd = bench.add_subcommand("codecs", "ratio, error and encode/decode GB/s of every codec beside memcpy");
  cmd->add_flag("--json", opts->json, "one JSON object per codec and size");
  cmd->add_option("--device", opts->device, "cpu, cuda or all")
      ->check(CLI::IsMember({"cpu", "cuda", "all"}))
      ->capture_default_str();
  cmd->add_option("--sizes", opts->sizes, "tensor sizes in elements (multiples of 1024)")
      ->check(CLI::Range(int64_t{1024}, int64_t{1} << 30))
      ->capture_default_str();
  cmd->add_option("--specs", opts->specs, "codec specs separated by ';' (default: every codec and the main chains)");
  cmd->add_option("--repeats", opts->repeats, "timed runs per figure (the median is reported)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--isa", opts->isas,
                  "CPU instruction sets to run the CPU rows on: baseline, avx2, avx512, or all that this CPU runs "
                  "(default: the best, or LH_CPU_ISA)");
  cmd->callback([opts] {
    for (int64_t n : opts->sizes)
      if (n % 1024 != 0) fail("bench codecs: --sizes must be multiples of 1024, got " + std::to_string(n));
    if (run(*opts) != 0) throw CLI::RuntimeError(1);
  });
});

}  // namespace
}  // namespace lh::app
