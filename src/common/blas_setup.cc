// See blas_setup.h.
#include "common/blas_setup.h"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

extern "C" char* openblas_get_corename(void);

namespace ncf {

const char* blas_core_name() { return openblas_get_corename(); }

void upgrade_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE")) return;
  const char* have = openblas_get_corename();
  const char* want = nullptr;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    want = "SkylakeX";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    want = "Haswell";
  if (!want || !have) return;
  // Only the generic fallbacks are replaced; a model OpenBLAS recognised stays.
  const char* generic[] = {"Prescott", "Core2", "Nehalem", "Sandybridge", "Penryn", "Dunnington"};
  bool fallback = false;
  for (const char* g : generic)
    if (strcasecmp(have, g) == 0) fallback = true;
  if (!fallback || strcasecmp(have, want) == 0) return;
  setenv("OPENBLAS_CORETYPE", want, 1);
  execv("/proc/self/exe", argv);
  // exec failed: keep running with the kernels we have.
}

}  // namespace ncf
