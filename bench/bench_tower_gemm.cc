// The tower's matrix products on one CPU core, library against library: the
// candidates for the CPU ranks' GEMMs at the ml-20m-mlperf shapes (factors 64,
// layers 256-256-128-64, D = 192), one row block at a time as the CPU ops run
// them (each pool thread multiplies whole fixed blocks single-threaded).
//
//   openblas sgemm   cblas_sgemm, then bias + ReLU in a second pass over the block
//   onednn f32       dnnl::matmul, bias and ReLU as post-ops (no second pass)
//   onednn bf16      dnnl::matmul on BF16 operands, FP32 output, bias + ReLU fused
//                    (plus the cost of converting the operands)
//
// Per case: the result is checked against a double-precision loop over the same
// (BF16-rounded, for the BF16 cases) operands, then --repeats runs are timed and
// the best is reported as GFLOP/s (2·M·N·K per product). The peak a core can
// reach is measured here too, with independent FMA chains (FP32: vfmadd on
// 512-bit registers; BF16: vdpbf16ps), so the table states its own ceiling.
//
// Debian 12's OpenBLAS (0.3.21) declares cblas_sbgemm in cblas.h but is built without
// BFLOAT16 support: the library has no such symbol, so it is not a candidate.
//
//   bench_tower_gemm [--rows 1024] [--depth 8192] [--repeats 50] [--json FILE]
// GCC 12 warns inside its own AVX-512 headers (the undefined vectors of
// _mm512_srli_epi32, _mm512_cvtepi32_epi16, _mm512_reduce_add_ps); the warnings
// point into the header, so they are silenced where it is read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#include <cblas.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/bf16.h"
#include "common/blas_setup.h"

namespace {

using dnnl::memory;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Best time of `repeats` calls of fn, in seconds.
double best_of(int repeats, const std::function<void()>& fn) {
  fn();
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = Clock::now();
    fn();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

// `iters` rounds of 12 independent FMA chains: FP32 (16 lanes, 2 flops per
// lane) or BF16 dot products (32 pairs per instruction, 2 flops each).
__attribute__((target("avx512f,avx512bf16"))) float fma_chains(bool bf16, long iters) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  if (bf16) {
    const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3f80);
    for (long k = 0; k < iters; ++k)
#pragma GCC unroll 12
      for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], b, b);
  } else {
    const __m512 b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-9f);
    for (long k = 0; k < iters; ++k)
#pragma GCC unroll 12
      for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], b, c);
  }
  float sink = 0;
  for (int i = 0; i < 12; ++i) sink += _mm512_reduce_add_ps(acc[i]);
  return sink;
}

// GFLOP/s one core reaches with fma_chains: the best of many short runs, like
// the products, so that a time slice lost to another process counts against
// neither.
double core_peak(bool bf16) {
  const long iters = 200'000;
  volatile float sink = 0;
  const double s = best_of(200, [&] { sink = sink + fma_chains(bf16, iters); });
  return iters * 12.0 * (bf16 ? 64.0 : 32.0) / s / 1e9;
}

struct Case {
  std::string name;
  int M, N, K;
  bool trans_a;   // A is stored [K×M] (the weight gradients: dZ^T)
  bool epilogue;  // bias + ReLU after the product
};

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = ncf::float_to_bf16_bits(x[i]);
  return y;
}

// C = op(A)·W^T (+ bias, ReLU) in double, where W is [N×K] (the nn.Linear layout)
// and op(A) is [M×K]; `round` rounds the operands to BF16 first.
std::vector<float> reference(const Case& c, const std::vector<float>& A,
                             const std::vector<float>& W, const std::vector<float>& bias,
                             bool round) {
  auto r = [&](float x) { return round ? ncf::round_to_bf16(x) : x; };
  std::vector<float> C(static_cast<size_t>(c.M) * c.N);
  for (int i = 0; i < c.M; ++i)
    for (int j = 0; j < c.N; ++j) {
      double s = 0;
      for (int k = 0; k < c.K; ++k) {
        const float a =
            c.trans_a ? A[static_cast<size_t>(k) * c.M + i] : A[static_cast<size_t>(i) * c.K + k];
        s += static_cast<double>(r(a)) * r(W[static_cast<size_t>(j) * c.K + k]);
      }
      if (c.epilogue) s = std::max(0.0, s + bias[j]);
      C[static_cast<size_t>(i) * c.N + j] = static_cast<float>(s);
    }
  return C;
}

double max_rel_err(const std::vector<float>& x, const std::vector<float>& ref) {
  double scale = 1e-30, err = 0;
  for (float v : ref) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (size_t i = 0; i < x.size(); ++i) err = std::max(err, std::fabs(double(x[i]) - ref[i]));
  return err / scale;
}

void bias_relu(float* C, const float* bias, int M, int N) {
  for (int i = 0; i < M; ++i) {
    float* row = C + static_cast<size_t>(i) * N;
    for (int j = 0; j < N; ++j) row[j] = std::max(0.0f, row[j] + bias[j]);
  }
}

// A dnnl::matmul for this case: src op(A) [M×K], weights W^T [K×N] read from W
// [N×K] through strides, dst [M×N]; bias and ReLU as post-ops when asked.
dnnl::matmul::primitive_desc make_matmul(const dnnl::engine& eng, const Case& c,
                                         memory::data_type dt) {
  const memory::dims src_strides = c.trans_a ? memory::dims{1, c.M} : memory::dims{c.K, 1};
  memory::desc a_md({c.M, c.K}, dt, src_strides);
  memory::desc w_md({c.K, c.N}, dt, memory::dims{1, c.K});
  memory::desc c_md({c.M, c.N}, memory::data_type::f32, memory::dims{c.N, 1});
  dnnl::primitive_attr attr;
  if (c.epilogue) {
    dnnl::post_ops po;
    po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(po);
    memory::desc b_md({1, c.N}, memory::data_type::f32, memory::dims{c.N, 1});
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, w_md, b_md, c_md), attr, eng);
  }
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, w_md, c_md), attr, eng);
}

}  // namespace

int main(int argc, char** argv) {
  ncf::upgrade_blas_kernels(argv);
  CLI::App app{"tower GEMMs on one core: OpenBLAS against oneDNN, FP32 and BF16"};
  int rows = 1024, depth = 8192, repeats = 50;
  std::string json_path;
  app.add_option("--rows", rows, "rows of a forward block")->check(CLI::PositiveNumber);
  app.add_option("--depth", depth, "batch rows summed by a weight-gradient block")
      ->check(CLI::PositiveNumber);
  app.add_option("--repeats", repeats, "timed runs per case")->check(CLI::PositiveNumber);
  app.add_option("--json", json_path, "also write the rows as JSON here");
  CLI11_PARSE(app, argc, argv);
  openblas_set_num_threads(1);

  const std::vector<Case> cases = {
      {"fwd L0 items 128->256", rows, 256, 128, false, true},
      {"fwd L1 256->128", rows, 128, 256, false, true},
      {"fwd L2 128->64", rows, 64, 128, false, true},
      {"bwd dX L1 128->256", rows, 256, 128, false, false},
      {"bwd dX L0 256->128", rows, 128, 256, false, false},
      {"bwd dW L1 (128x256, K=depth)", 128, 256, depth, true, false},
      {"bwd dW L0 items (256x128, K=depth)", 256, 128, depth, true, false},
  };
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const double peak32 = core_peak(false), peak16 = core_peak(true);
  std::printf("BLAS kernels %s; oneDNN %d.%d.%d, ISA %d\n", ncf::blas_core_name(),
              dnnl_version()->major, dnnl_version()->minor, dnnl_version()->patch,
              static_cast<int>(dnnl::get_effective_cpu_isa()));
  std::printf("one core's peak: FP32 FMA %.1f GFLOP/s, BF16 dot %.1f GFLOP/s\n", peak32, peak16);
  std::printf("%-36s %-16s %9s %7s %9s  %s\n", "case", "library", "GFLOP/s", "%peak", "rel.err",
              "implementation");
  nlohmann::json out = nlohmann::json::array();
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  bool ok = true;
  for (const Case& c : cases) {
    std::vector<float> A(static_cast<size_t>(c.M) * c.K), W(static_cast<size_t>(c.N) * c.K),
        bias(c.N), C(static_cast<size_t>(c.M) * c.N);
    for (float& x : A) x = nd(rng);
    for (float& x : W) x = nd(rng) * 0.1f;
    for (float& x : bias) x = nd(rng);
    const std::vector<float> ref32 = reference(c, A, W, bias, false);
    const std::vector<float> ref16 = reference(c, A, W, bias, true);
    const double flop = 2.0 * c.M * c.N * c.K;
    auto report = [&](const char* lib, double s, double err, bool bf16, const std::string& impl) {
      const double g = flop / s / 1e9;
      const double tol = bf16 ? 1e-3 : 1e-4;
      std::printf("%-36s %-16s %9.1f %6.0f%% %9.1e  %s%s\n", c.name.c_str(), lib, g,
                  100.0 * g / (bf16 ? peak16 : peak32), err, impl.c_str(),
                  err > tol ? "  FAIL" : "");
      ok = ok && err <= tol;
      out.push_back({{"case", c.name},
                     {"library", lib},
                     {"gflops", g},
                     {"rel_err", err},
                     {"M", c.M},
                     {"N", c.N},
                     {"K", c.K},
                     {"impl", impl}});
    };
    const CBLAS_TRANSPOSE ta = c.trans_a ? CblasTrans : CblasNoTrans;
    const int lda = c.trans_a ? c.M : c.K;
    // OpenBLAS FP32, epilogue in a second pass.
    double s = best_of(repeats, [&] {
      cblas_sgemm(CblasRowMajor, ta, CblasTrans, c.M, c.N, c.K, 1.0f, A.data(), lda, W.data(), c.K,
                  0.0f, C.data(), c.N);
      if (c.epilogue) bias_relu(C.data(), bias.data(), c.M, c.N);
    });
    report("openblas sgemm", s, max_rel_err(C, ref32), false, "sgemm + pass");
    // oneDNN FP32, epilogue fused.
    const dnnl::matmul::primitive_desc pd32 = make_matmul(eng, c, memory::data_type::f32);
    dnnl::matmul mm32(pd32);
    memory a_mem(pd32.src_desc(), eng, A.data());
    memory w_mem(pd32.weights_desc(), eng, W.data());
    memory c_mem(pd32.dst_desc(), eng, C.data());
    memory b_mem(memory::desc({1, c.N}, memory::data_type::f32, memory::dims{c.N, 1}), eng,
                 bias.data());
    s = best_of(repeats, [&] {
      std::unordered_map<int, memory> args = {
          {DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, w_mem}, {DNNL_ARG_DST, c_mem}};
      if (c.epilogue) args[DNNL_ARG_BIAS] = b_mem;
      mm32.execute(strm, args);
      strm.wait();
    });
    report("onednn f32", s, max_rel_err(C, ref32), false, pd32.impl_info_str());
    if (c.trans_a) {
      // The same weight gradient as an inner product's backward-weights pass:
      // diff_weights [N×K]... here dW[M×N] = A^T[M×K_b]·X, with A stored [K×M] (dZ, one
      // row per sample) and W^T read as X [K×N] (one row per sample).
      memory::desc x_md({c.K, c.N}, memory::data_type::f32, memory::dims{c.N, 1});
      memory::desc dz_md({c.K, c.M}, memory::data_type::f32, memory::dims{c.M, 1});
      memory::desc dw_md({c.M, c.N}, memory::data_type::f32, memory::dims{c.N, 1});
      dnnl::inner_product_forward::primitive_desc fwd_hint(
          dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_training, x_md, dw_md, dz_md),
          eng);
      dnnl::inner_product_backward_weights::primitive_desc ipd(
          dnnl::inner_product_backward_weights::desc(x_md, dw_md, dz_md), eng, fwd_hint);
      dnnl::inner_product_backward_weights ip(ipd);
      // X is the transpose of W as stored: make it explicitly.
      std::vector<float> X(static_cast<size_t>(c.K) * c.N);
      for (int k = 0; k < c.K; ++k)
        for (int j = 0; j < c.N; ++j)
          X[static_cast<size_t>(k) * c.N + j] = W[static_cast<size_t>(j) * c.K + k];
      memory x_mem(x_md, eng, X.data()), dz_mem(dz_md, eng, A.data()), dw_mem(dw_md, eng, C.data());
      s = best_of(repeats, [&] {
        ip.execute(
            strm,
            {{DNNL_ARG_SRC, x_mem}, {DNNL_ARG_DIFF_DST, dz_mem}, {DNNL_ARG_DIFF_WEIGHTS, dw_mem}});
        strm.wait();
      });
      report("onednn ip bwd_w", s, max_rel_err(C, ref32), false, ipd.impl_info_str());
      // Explicit transpose of A into [M×K], then a plain product.
      std::vector<float> At(static_cast<size_t>(c.M) * c.K);
      memory::desc at_md({c.M, c.K}, memory::data_type::f32, memory::dims{c.K, 1});
      memory::desc wt_md({c.K, c.N}, memory::data_type::f32, memory::dims{1, c.K});
      dnnl::matmul::primitive_desc tpd(dnnl::matmul::desc(at_md, wt_md, pd32.dst_desc()), eng);
      dnnl::matmul tmm(tpd);
      memory at_mem(at_md, eng, At.data());
      s = best_of(repeats, [&] {
        for (int k0 = 0; k0 < c.K; k0 += 64)
          for (int i = 0; i < c.M; ++i)
            for (int k = k0; k < std::min(c.K, k0 + 64); ++k)
              At[static_cast<size_t>(i) * c.K + k] = A[static_cast<size_t>(k) * c.M + i];
        tmm.execute(strm,
                    {{DNNL_ARG_SRC, at_mem}, {DNNL_ARG_WEIGHTS, w_mem}, {DNNL_ARG_DST, c_mem}});
        strm.wait();
      });
      report("transpose+matmul", s, max_rel_err(C, ref32), false, tpd.impl_info_str());
    }
    // BF16 operands.
    std::vector<uint16_t> A16 = to_bf16(A), W16 = to_bf16(W);
    const double conv = best_of(repeats, [&] {
      for (size_t i = 0; i < A.size(); ++i) A16[i] = ncf::float_to_bf16_bits(A[i]);
    });
    const dnnl::matmul::primitive_desc pd16 = make_matmul(eng, c, memory::data_type::bf16);
    dnnl::matmul mm16(pd16);
    memory a16_mem(pd16.src_desc(), eng, A16.data());
    memory w16_mem(pd16.weights_desc(), eng, W16.data());
    s = best_of(repeats, [&] {
      std::unordered_map<int, memory> args = {
          {DNNL_ARG_SRC, a16_mem}, {DNNL_ARG_WEIGHTS, w16_mem}, {DNNL_ARG_DST, c_mem}};
      if (c.epilogue) args[DNNL_ARG_BIAS] = b_mem;
      mm16.execute(strm, args);
      strm.wait();
    });
    report("onednn bf16", s, max_rel_err(C, ref16), true, pd16.impl_info_str());
    report("  + convert A", s + conv, max_rel_err(C, ref16), true, "");
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(1) << "\n";
  return ok ? 0 : 1;
}
