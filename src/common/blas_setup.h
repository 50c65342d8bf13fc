// OpenBLAS picks its GEMM kernels from the CPU model at load time; under a
// hypervisor that reports an unknown model ("Intel Xeon Processor") the
// Debian build falls back to its SSE3 "Prescott" kernels, 3-4x slower than the
// AVX2/AVX-512 ones the CPU supports. The choice can only be changed through
// OPENBLAS_CORETYPE before the library loads, so a main that cares re-executes
// itself once with the variable set.
#pragma once

namespace ncf {

// If OPENBLAS_CORETYPE is unset and OpenBLAS chose a kernel older than what
// the CPU supports, sets it (SkylakeX with AVX-512, Haswell with AVX2+FMA) and
// re-executes /proc/self/exe with the same argv. Returns if nothing to do or
// the exec fails. Call first thing in main, before MPI_Init.
void upgrade_blas_kernels(char** argv);

// The kernel family OpenBLAS uses (for logs).
const char* blas_core_name();

}  // namespace ncf
