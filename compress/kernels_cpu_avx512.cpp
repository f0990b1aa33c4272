// The CPU codec loops built for the avx512 instruction set (flags in compress/CMakeLists.txt); the
// source is kernels_cpu_isa.inc, shared by every ISA.
#define LH_ISA_NS isa_avx512
#include "compress/kernels_cpu_isa.inc"
