// The CPU codec loops built for the avx2 instruction set (flags in compress/CMakeLists.txt); the
// source is kernels_cpu_isa.inc, shared by every ISA.
#define LH_ISA_NS isa_avx2
#include "compress/kernels_cpu_isa.inc"
