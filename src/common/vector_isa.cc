#include "common/vector_isa.h"

#include <atomic>
#include <cstdlib>

#include "common/check.h"

namespace ncf {

namespace {

std::atomic<int> g_isa{-1};  // -1: the environment not read yet

}  // namespace

const char* vector_isa_name(VectorIsa isa) {
  switch (isa) {
    case VectorIsa::kAvx512:
      return "avx512";
    case VectorIsa::kAvx2:
      return "avx2";
    case VectorIsa::kBaseline:
      break;
  }
  return "baseline";
}

VectorIsa parse_vector_isa(const std::string& value, const std::string& what) {
  for (VectorIsa isa : {VectorIsa::kAvx512, VectorIsa::kAvx2, VectorIsa::kBaseline})
    if (value == vector_isa_name(isa)) return isa;
  NCF_FAIL(what, "=", value, ": expected avx512, avx2 or baseline");
}

VectorIsa best_vector_isa() {
  static const VectorIsa best =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")
          ? VectorIsa::kAvx512
      : __builtin_cpu_supports("avx2") ? VectorIsa::kAvx2
                                       : VectorIsa::kBaseline;
  return best;
}

namespace {

// NCF_VECTOR_ISA's path, or `unset` where the variable is unset or empty.
VectorIsa environment_isa(VectorIsa unset, bool* set = nullptr) {
  const char* e = std::getenv("NCF_VECTOR_ISA");
  if (set) *set = e != nullptr && *e != '\0';
  if (e == nullptr || *e == '\0') return unset;
  return parse_vector_isa(e, "environment variable NCF_VECTOR_ISA");
}

}  // namespace

bool vector_isa_from_environment() {
  bool set = false;
  environment_isa(VectorIsa::kBaseline, &set);
  return set;
}

VectorIsa runnable_vector_isa(VectorIsa want) {
  return want < best_vector_isa() ? best_vector_isa() : want;  // kAvx512 < kAvx2 < kBaseline
}

VectorIsa vector_isa() {
  int v = g_isa.load(std::memory_order_relaxed);
  if (v < 0) {
    const VectorIsa isa = runnable_vector_isa(environment_isa(best_vector_isa()));
    int expected = -1;
    g_isa.compare_exchange_strong(expected, int(isa));
    v = g_isa.load();
  }
  return VectorIsa(v);
}

}  // namespace ncf
