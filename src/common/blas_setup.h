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
// the exec fails. Call first thing in main, before MPI_Init. The re-executed process
// takes its binary's name back first (name_after_own_binary).
void upgrade_blas_kernels(char** argv);

// A process started through /proc/self/exe is named "exe" (its /proc/PID/comm, what ps,
// top, pgrep and pkill match): where that is this process's name, it takes its binary's
// file name instead (15 bytes of it, as the kernel keeps); else nothing changes. Exec'ing
// the file's path instead would keep the name but could start another binary, one
// written to that path since.
void name_after_own_binary();

// The kernel family OpenBLAS uses (for logs).
const char* blas_core_name();

}  // namespace ncf
