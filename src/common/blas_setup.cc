// See blas_setup.h.
#include "common/blas_setup.h"

#include <cblas.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" char* openblas_get_corename(void);

namespace ncf {

const char* blas_core_name() { return openblas_get_corename(); }

void name_after_own_binary() {
  char comm[32] = {};
  if (FILE* f = std::fopen("/proc/self/comm", "r")) {
    if (!std::fgets(comm, sizeof comm, f)) comm[0] = '\0';
    std::fclose(f);
  }
  comm[strcspn(comm, "\n")] = '\0';
  if (std::strcmp(comm, "exe") != 0) return;
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return;
  path[n] = '\0';
  // A binary replaced or removed since it started reads "PATH (deleted)".
  const char* deleted = " (deleted)";
  const size_t len = std::strlen(path), dl = std::strlen(deleted);
  if (len > dl && std::strcmp(path + len - dl, deleted) == 0) path[len - dl] = '\0';
  const char* slash = std::strrchr(path, '/');
  prctl(PR_SET_NAME, slash ? slash + 1 : path, 0, 0, 0);  // the kernel keeps 15 bytes
}

void upgrade_blas_kernels(char** argv) {
  name_after_own_binary();  // the process this function re-executed, if it is one
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
