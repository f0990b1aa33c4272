// Picks the CPU codec loops (cpu_isa.h) once per process: the widest ISA the CPU and the OS
// support, or the one LH_CPU_ISA names.
#include "compress/cpu_isa.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace lh::compress::kern {

namespace {

bool cpu_runs(CpuIsa isa) {
#if defined(LH_CPU_ISA_X86)
  // __builtin_cpu_supports also checks that the OS saves the wider registers (XCR0).
  __builtin_cpu_init();
  switch (isa) {
    case CpuIsa::baseline:
      return true;
    case CpuIsa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi") &&
             __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("popcnt");
    case CpuIsa::avx512:
      return cpu_runs(CpuIsa::avx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }
  return false;
#else
  return isa == CpuIsa::baseline;
#endif
}

const CpuCodecLoops& loops_of(CpuIsa isa) {
#if defined(LH_CPU_ISA_X86)
  if (isa == CpuIsa::avx512) return isa_avx512::kLoops;
  if (isa == CpuIsa::avx2) return isa_avx2::kLoops;
#endif
  return isa_baseline::kLoops;
}

std::string allowed_names() {
  std::string s;
  for (CpuIsa i : supported_cpu_isas()) s += std::string(s.empty() ? "" : ", ") + cpu_isa_name(i);
  return s;
}

// The ISA from LH_CPU_ISA, else the best. A bad value ends the process: it is a typo in a
// benchmark's setup, and running another ISA than the one asked for would mislabel its figures.
CpuIsa initial_isa() {
  const char* env = std::getenv("LH_CPU_ISA");
  if (env == nullptr || *env == '\0') return best_cpu_isa();
  Result<CpuIsa> isa = parse_cpu_isa(env);
  if (isa.ok() && !cpu_runs(*isa))
    isa = invalid_argument(std::string("this CPU cannot run ") + env + "; it runs " + allowed_names());
  if (!isa.ok()) {
    std::fprintf(stderr, "longhaul: LH_CPU_ISA='%s': %s\n", env, isa.status().message().c_str());
    std::exit(2);
  }
  return *isa;
}

std::atomic<int>& active() {
  static std::atomic<int> a{static_cast<int>(initial_isa())};
  return a;
}

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::baseline:
      return "baseline";
    case CpuIsa::avx2:
      return "avx2";
    case CpuIsa::avx512:
      return "avx512";
  }
  return "?";
}

Result<CpuIsa> parse_cpu_isa(const std::string& name) {
  for (CpuIsa i : {CpuIsa::baseline, CpuIsa::avx2, CpuIsa::avx512})
    if (name == cpu_isa_name(i)) return i;
  return invalid_argument("unknown CPU instruction set '" + name + "'; allowed: baseline, avx2, avx512");
}

std::vector<CpuIsa> supported_cpu_isas() {
  std::vector<CpuIsa> v;
  for (CpuIsa i : {CpuIsa::baseline, CpuIsa::avx2, CpuIsa::avx512})
    if (cpu_runs(i)) v.push_back(i);
  return v;
}

CpuIsa best_cpu_isa() {
  return supported_cpu_isas().back();
}

CpuIsa active_cpu_isa() {
  return static_cast<CpuIsa>(active().load(std::memory_order_relaxed));
}

Status set_cpu_isa(CpuIsa isa) {
  if (!cpu_runs(isa))
    return invalid_argument(std::string("this CPU cannot run ") + cpu_isa_name(isa) + "; it runs " + allowed_names());
  active().store(static_cast<int>(isa), std::memory_order_relaxed);
  return Status::Ok();
}

const CpuCodecLoops& cpu_loops() {
  return loops_of(active_cpu_isa());
}

const CpuCodecLoops& cpu_loops_for(CpuIsa isa) {
  LH_ASSERT(cpu_runs(isa), std::string("cpu_loops_for: this CPU cannot run ") + cpu_isa_name(isa));
  return loops_of(isa);
}

}  // namespace lh::compress::kern
