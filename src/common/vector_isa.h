// The CPU's vector instruction sets, and loop bodies compiled for the widest one the CPU
// has. The build's baseline is plain x86-64 (SSE2: 4 floats per instruction), which runs
// anywhere; the loops that bound a CPU step (the masked sums, the fused top, the row sums
// and the table's Adam sweep) also get an AVX2 and an AVX-512 copy, picked at run time.
//
// Every copy computes the same bits: C++ is compiled with -ffp-contract=off (no fused
// multiply-adds), the compiler vectorizes element-wise loops only (a float sum keeps its
// order without -ffast-math), and each vector instruction is the baseline's correctly
// rounded IEEE operation on more lanes. NCF_VECTOR_ISA=avx2 or baseline narrows the choice,
// so that any path can be timed and checked against the others on one machine.
#pragma once

#include <cstdint>
#include <string>

#include "common/parallel.h"

namespace ncf {

enum class VectorIsa { kAvx512, kAvx2, kBaseline };  // widest first

const char* vector_isa_name(VectorIsa isa);
// avx512, avx2 or baseline (the names vector_isa_name gives); anything else fails with a
// message naming `what` and the value.
VectorIsa parse_vector_isa(const std::string& value, const std::string& what);

// The widest this CPU runs: AVX-512 (F, BW, VL and DQ), AVX2, or the baseline.
VectorIsa best_vector_isa();
// `want` where this CPU runs it, else the CPU's best (kAvx512 < kAvx2 < kBaseline: a wider
// path than the CPU has runs the CPU's best).
VectorIsa runnable_vector_isa(VectorIsa want);
// The one the loops use: best_vector_isa(), or NCF_VECTOR_ISA where that names a narrower
// one (runnable_vector_isa). Read once per process.
VectorIsa vector_isa();
// Whether NCF_VECTOR_ISA is set (to a valid value; else this fails like parse_vector_isa).
bool vector_isa_from_environment();

namespace detail {
// GCC's generic tuning vectorizes with 256-bit registers unless told to prefer 512 (clang
// has no such target option).
#if defined(__clang__)
#define NCF_AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512dq"
#else
#define NCF_AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512"
#endif
// f(args...) with f and everything it calls inlined (flatten), compiled for the target.
template <typename F, typename... A>
__attribute__((target(NCF_AVX512_TARGET), flatten)) void run_avx512(const F& f, A... args) {
  f(args...);
}
template <typename F, typename... A>
__attribute__((target("avx2"), flatten)) void run_avx2(const F& f, A... args) {
  f(args...);
}
}  // namespace detail

// f(args...) as compiled for isa, which the CPU must run (runnable_vector_isa).
template <typename F, typename... A>
void run_on(VectorIsa isa, const F& f, A... args) {
  switch (isa) {
    case VectorIsa::kAvx512:
      detail::run_avx512(f, args...);
      return;
    case VectorIsa::kAvx2:
      detail::run_avx2(f, args...);
      return;
    case VectorIsa::kBaseline:
      break;
  }
  f(args...);
}

// A callable that runs f(args...) as compiled for vector_isa(). f is held by reference:
// the result lives no longer than the full expression around it.
template <typename F>
auto widest(const F& f) {
  return [&f](auto... args) { run_on(vector_isa(), f, args...); };
}

// parallel_for and block_sums (common/parallel.h) with their loop body run by widest().
template <typename F>
void parallel_for_wide(int threads, int64_t n, int64_t grain, const F& body) {
  parallel_for(threads, n, grain, widest(body));
}
template <typename F>
void block_sums_wide(int threads, int64_t n, int k, const F& partial, double* totals) {
  block_sums(threads, n, k, widest(partial), totals);
}

}  // namespace ncf
