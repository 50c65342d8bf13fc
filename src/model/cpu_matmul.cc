// cpu_matmul: oneDNN matmul primitives, made once per shape and kept, run on
// the calling thread with the epilogue as post-ops.
#include "model/cpu_matmul.h"

// GCC 12 warns inside its own AVX-512 headers (the undefined vectors of
// _mm512_srli_epi32, _mm512_cvtepi32_epi16, _mm512_reduce_add_ps); the warnings
// point into the header, so they are silenced where it is read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "common/bf16.h"
#include "common/check.h"

namespace ncf {
namespace {

using dnnl::memory;

const dnnl::engine& engine() {
  static const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

// oneDNN (built on OpenMP) sizes its parallel regions from the calling
// thread's OpenMP thread count; one per thread keeps each product on the
// thread that asked for it, whatever OMP_NUM_THREADS says.
dnnl::stream& thread_stream() {
  thread_local bool single = [] {
    omp_set_num_threads(1);
    return true;
  }();
  (void)single;
  thread_local dnnl::stream strm(engine());
  return strm;
}

struct Key {
  int M, N, K, lda, ldb, ldc;
  bool trans_a, trans_b, bf16, bias, relu, c_bf16;
  float alpha, beta;
  bool operator==(const Key& o) const { return std::memcmp(this, &o, sizeof(Key)) == 0; }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    const unsigned char* p = reinterpret_cast<const unsigned char*>(&k);
    size_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof(Key); ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
  }
};

struct Entry {
  dnnl::matmul prim;
  memory::desc a, b, c, bias, scratch;
};

// Every shape seen, with its primitive. A run sees a few dozen shapes (the fixed
// blocks of each product, plus the last, shorter block); the map is cleared if
// it ever grows past kMaxEntries (entries in use stay alive through their
// shared_ptr).
constexpr size_t kMaxEntries = 4096;

std::shared_ptr<const Entry> primitive_for(const Key& k) {
  static std::mutex mu;
  static std::unordered_map<Key, std::shared_ptr<const Entry>, KeyHash> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(k);
    if (it != cache.end()) return it->second;
  }
  const memory::data_type dt = k.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  auto e = std::make_shared<Entry>();
  e->a = memory::desc({k.M, k.K}, dt, k.trans_a ? memory::dims{1, k.lda} : memory::dims{k.lda, 1});
  e->b = memory::desc({k.K, k.N}, dt, k.trans_b ? memory::dims{1, k.ldb} : memory::dims{k.ldb, 1});
  e->c = memory::desc({k.M, k.N}, k.c_bf16 ? memory::data_type::bf16 : memory::data_type::f32,
                      memory::dims{k.ldc, 1});
  dnnl::primitive_attr attr;
  if (k.alpha != 1.0f) attr.set_output_scales(0, {k.alpha});
  dnnl::post_ops po;
  // beta·C is added before the bias and the ReLU: act(alpha·AB + C + bias).
  if (k.beta != 0.0f) po.append_sum(k.beta);
  if (k.relu) po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  attr.set_post_ops(po);
  // Two pool threads may run one primitive at once (blocks of the same shape):
  // each passes its own scratchpad, which a primitive would otherwise share.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  try {
    dnnl::matmul::primitive_desc pd;
    if (k.bias) {
      e->bias = memory::desc({1, k.N}, memory::data_type::f32, memory::dims{k.N, 1});
      pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(e->a, e->b, e->bias, e->c), attr,
                                        engine());
    } else {
      pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(e->a, e->b, e->c), attr, engine());
    }
    e->scratch = pd.scratchpad_desc();
    e->prim = dnnl::matmul(pd);
  } catch (const dnnl::error& err) {
    NCF_FAIL("oneDNN refused a ", k.bf16 ? "bf16" : "f32", " matmul M=", k.M, " N=", k.N,
             " K=", k.K, (k.trans_a ? " A^T" : ""), (k.trans_b ? " B^T" : ""), " lda=", k.lda,
             " ldb=", k.ldb, " ldc=", k.ldc, ": ", err.what());
  }
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() >= kMaxEntries) cache.clear();
  return cache.emplace(k, std::move(e)).first->second;
}

// float_to_bf16_bits on 16 lanes of float bits.
__attribute__((target("avx512f"))) inline __m256i bf16_of_avx512(__m512i u) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
  const __m512i half = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1);
  const __m512i quiet = _mm512_set1_epi32(0x0040);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(hi, one);
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(half, lsb)), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, quiet));
  return _mm512_cvtepi32_epi16(r);
}

// epilogue_to_bf16_bits one element at a time.
void epilogue_scalar(const float* src, const float* a, const float* b, bool relu, uint16_t* dst,
                     int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = src[i];
    if (a) v += a[i];
    if (b) v += b[i];
    if (relu) v = v > 0.0f ? v : 0.0f;
    dst[i] = float_to_bf16_bits(v);
  }
}

__attribute__((target("avx512f"))) void epilogue_avx512(const float* src, const float* a,
                                                        const float* b, bool relu, uint16_t* dst,
                                                        int64_t n) {
  const __m512 zero = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(src + i);
    if (a) v = _mm512_add_ps(v, _mm512_loadu_ps(a + i));
    if (b) v = _mm512_add_ps(v, _mm512_loadu_ps(b + i));
    // v > 0 ? v : 0, NaN → 0 as the scalar comparison gives.
    if (relu) v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, zero, _CMP_GT_OQ), v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        bf16_of_avx512(_mm512_castps_si512(v)));
  }
  epilogue_scalar(src + i, a ? a + i : nullptr, b ? b + i : nullptr, relu, dst + i, n - i);
}

// The `rows` × `cols` block of a row-major matrix with stride ld, as BF16 bits
// with the same stride, in `buf` (padding between rows not read or written).
const uint16_t* to_bf16(const float* src, int rows, int cols, int ld, std::vector<uint16_t>& buf) {
  const size_t n = static_cast<size_t>(rows - 1) * ld + cols;
  if (buf.size() < n) buf.resize(n);
  for (int r = 0; r < rows; ++r)
    round_to_bf16_bits(src + static_cast<int64_t>(r) * ld,
                       buf.data() + static_cast<int64_t>(r) * ld, cols);
  return buf.data();
}

// The same block rounded to BF16 values kept as floats (the emulated path).
const float* to_bf16_floats(const float* src, int rows, int cols, int ld, std::vector<float>& buf) {
  const size_t n = static_cast<size_t>(rows - 1) * ld + cols;
  if (buf.size() < n) buf.resize(n);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const int64_t i = static_cast<int64_t>(r) * ld + c;
      buf[i] = round_to_bf16(src[i]);
    }
  return buf.data();
}

bool bf16_isa() {
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
}

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "other";
  }
}

}  // namespace

void round_to_bf16_bits(const float* src, uint16_t* dst, int64_t n) {
  epilogue_to_bf16_bits(src, nullptr, nullptr, false, dst, n);
}

void epilogue_to_bf16_bits(const float* src, const float* a, const float* b, bool relu,
                           uint16_t* dst, int64_t n) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512) {
    epilogue_avx512(src, a, b, relu, dst, n);
  } else {
    epilogue_scalar(src, a, b, relu, dst, n);
  }
}

namespace {
std::atomic<bool> g_force_emulated{false};
}  // namespace

bool cpu_bf16_native() {
  static const bool native = bf16_isa();
  return native && !g_force_emulated.load();
}

void set_cpu_bf16_emulated(bool emulated) { g_force_emulated.store(emulated); }

std::string cpu_matmul_description() {
  const dnnl_version_t* v = dnnl_version();
  std::string s = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                  std::to_string(v->patch) + " on " + isa_name(dnnl::get_effective_cpu_isa());
  if (cpu_bf16_native()) {
    s += dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core_amx
             ? "; bf16 native (AMX)"
             : "; bf16 native (AVX512-BF16)";
  } else {
    s += bf16_isa() ? "; bf16 emulated (asked for: BF16-rounded operands, FP32 products)"
                    : "; bf16 emulated (no BF16 instructions: BF16-rounded operands, FP32 "
                      "products)";
  }
  return s;
}

namespace {

// The cache key of a product, every byte set (padding included: it is hashed
// and compared as bytes).
Key make_key(const MatmulShape& s, const MatmulEpilogue& ep, bool bf16, bool c_bf16) {
  Key k;
  std::memset(&k, 0, sizeof(k));
  k.M = s.M;
  k.N = s.N;
  k.K = s.K;
  k.lda = s.lda;
  k.ldb = s.ldb;
  k.ldc = s.ldc;
  k.trans_a = s.trans_a;
  k.trans_b = s.trans_b;
  k.bf16 = bf16;
  k.bias = ep.bias != nullptr;
  k.relu = ep.relu;
  k.c_bf16 = c_bf16;
  k.alpha = ep.alpha;
  k.beta = ep.beta;
  return k;
}

void check_product(const MatmulShape& s, const MatmulEpilogue& ep) {
  NCF_CHECK(s.M > 0 && s.N > 0 && s.K > 0, "cpu_matmul: empty product M=", s.M, " N=", s.N,
            " K=", s.K);
  NCF_CHECK(ep.beta == 0.0f || ep.beta == 1.0f, "cpu_matmul: beta=", ep.beta,
            " (only 0 and 1 are supported)");
  // oneDNN scales the bias with alpha; no caller needs both, so none may ask.
  NCF_CHECK(ep.alpha == 1.0f || ep.bias == nullptr, "cpu_matmul: alpha=", ep.alpha,
            " with a bias is not supported");
}

// Runs the primitive of `key` on the calling thread.
void execute(const Key& key, const void* A, const void* B, void* C, const float* bias) {
  std::shared_ptr<const Entry> e = primitive_for(key);
  dnnl::stream& strm = thread_stream();
  std::unordered_map<int, memory> args;
  args.emplace(DNNL_ARG_SRC, memory(e->a, engine(), const_cast<void*>(A)));
  args.emplace(DNNL_ARG_WEIGHTS, memory(e->b, engine(), const_cast<void*>(B)));
  args.emplace(DNNL_ARG_DST, memory(e->c, engine(), C));
  if (bias) args.emplace(DNNL_ARG_BIAS, memory(e->bias, engine(), const_cast<float*>(bias)));
  const size_t scratch_bytes = e->scratch.get_size();
  if (scratch_bytes > 0) {
    thread_local std::vector<uint64_t> scratch;  // 8-byte aligned, grown, never shrunk
    if (scratch.size() * sizeof(uint64_t) < scratch_bytes + 64)
      scratch.resize(scratch_bytes / sizeof(uint64_t) + 9);
    // oneDNN wants 64-byte alignment.
    const uintptr_t base = reinterpret_cast<uintptr_t>(scratch.data());
    void* aligned = reinterpret_cast<void*>((base + 63) & ~uintptr_t{63});
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(e->scratch, engine(), aligned));
  }
  e->prim.execute(strm, args);
  strm.wait();
}

// The `rows` × `cols` block of BF16 bits with stride ld, widened to floats with
// the same stride in `buf`.
const float* widen(const uint16_t* src, int rows, int cols, int ld, std::vector<float>& buf) {
  const size_t n = static_cast<size_t>(rows - 1) * ld + cols;
  if (buf.size() < n) buf.resize(n);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const int64_t i = static_cast<int64_t>(r) * ld + c;
      buf[i] = bf16_bits_to_float(src[i]);
    }
  return buf.data();
}

}  // namespace

void cpu_matmul(const MatmulShape& s, const float* A, const float* B, float* C,
                const MatmulEpilogue& ep, MatmulPrecision precision) {
  check_product(s, ep);
  const bool bf16 = precision == MatmulPrecision::kBf16;
  const bool native = bf16 && cpu_bf16_native();
  const Key key = make_key(s, ep, native, false);
  const int a_rows = s.trans_a ? s.K : s.M, a_cols = s.trans_a ? s.M : s.K;
  const int b_rows = s.trans_b ? s.N : s.K, b_cols = s.trans_b ? s.K : s.N;
  const void* a_ptr = A;
  const void* b_ptr = B;
  if (native) {
    thread_local std::vector<uint16_t> a16, b16;
    a_ptr = to_bf16(A, a_rows, a_cols, s.lda, a16);
    b_ptr = to_bf16(B, b_rows, b_cols, s.ldb, b16);
  } else if (bf16) {
    thread_local std::vector<float> af, bf;
    a_ptr = to_bf16_floats(A, a_rows, a_cols, s.lda, af);
    b_ptr = to_bf16_floats(B, b_rows, b_cols, s.ldb, bf);
  }
  execute(key, a_ptr, b_ptr, C, ep.bias);
}

void cpu_matmul_bf16(const MatmulShape& s, const uint16_t* A, const uint16_t* B, float* C,
                     uint16_t* C_bf16, const MatmulEpilogue& ep) {
  check_product(s, ep);
  NCF_CHECK((C == nullptr) != (C_bf16 == nullptr), "cpu_matmul_bf16: exactly one of C and C_bf16");
  NCF_CHECK(C_bf16 == nullptr || ep.beta == 0.0f, "cpu_matmul_bf16: beta=", ep.beta,
            " with a BF16 output (only 0)");
  if (cpu_bf16_native()) {
    const Key key = make_key(s, ep, true, C_bf16 != nullptr);
    execute(key, A, B, C ? static_cast<void*>(C) : static_cast<void*>(C_bf16), ep.bias);
    return;
  }
  const int a_rows = s.trans_a ? s.K : s.M, a_cols = s.trans_a ? s.M : s.K;
  const int b_rows = s.trans_b ? s.N : s.K, b_cols = s.trans_b ? s.K : s.N;
  thread_local std::vector<float> af, bf, cf;
  const float* a = widen(A, a_rows, a_cols, s.lda, af);
  const float* b = widen(B, b_rows, b_cols, s.ldb, bf);
  if (C) {
    execute(make_key(s, ep, false, false), a, b, C, ep.bias);
    return;
  }
  // FP32 product into a block of the output's shape and stride, then rounded.
  const size_t n = static_cast<size_t>(s.M - 1) * s.ldc + s.N;
  if (cf.size() < n) cf.resize(n);
  execute(make_key(s, ep, false, false), a, b, cf.data(), ep.bias);
  for (int r = 0; r < s.M; ++r)
    round_to_bf16_bits(cf.data() + static_cast<int64_t>(r) * s.ldc,
                       C_bf16 + static_cast<int64_t>(r) * s.ldc, s.N);
}

}  // namespace ncf
