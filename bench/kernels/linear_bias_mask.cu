// linear_backward's first pass, a ReLU layer's backward above layer 0: dZ = dY masked in
// place where Y <= 0 (or NaN) and, with a bias, db = its column sums in double over
// deterministic_col_sums' fixed chunks and order (common/cuda_util.cuh). Its versions:
//   v1  the legacy pass: with db, the mask inside the column sums' loop (LinearBiasOp: a
//       load, a conditional store, the next load); without, relu_mask_kernel, one element
//       per thread. It lost on an H200 (linear_backward at the step's layers 1 and 2,
//       5.21 / 2.69 ms against 1.47 / 0.80, bench_kernels in
//       bench/results/gpu_2026-11-27_98d21d0/) and left src/model/ops_gemm.cu.
//   v2  the library's linear_backward (mask_col_sums_kernel: the mask and the sums in one
//       read-only pass, eight rows in flight, whole rows stored; relu_mask_stream_kernel
//       without db).
// v2 is only reachable through linear_backward, which also multiplies dW = dZ^T·X (dX is
// not asked for), so v1 runs the library's gemm for the same product after its pass, and
// the product alone is timed as `dW` (each version's time less that is its pass's).
// dZ and db are held to a CPU loop that masks and sums in the kernels' order: the same
// bits, as the kernels promise; dW to the first version's bits (the same product of the
// same dZ; the CPU is not asked for a B × out × in product).
//
//   linear_bias_mask [--rows 1048575] [--in 256] [--out 128] [--gpu 0] [--warmup 3]
//                    [--repeats 20] [--seed 1]
// (the defaults: the ml-20m-mlperf step's layer 1; layer 2 is --in 128 --out 64).
#include <cmath>
#include <limits>

#include "common/cuda_util.cuh"
#include "kernel_bench.cuh"
#include "model/ops.h"
#include "model/ops_internal.cuh"

namespace ncf::cuda {
namespace {

// dY[i] = 0 where Y[i] <= 0 (or NaN): the ReLU mask when no bias gradient is wanted.
__global__ void relu_mask_kernel(float* dY, const float* Y, int64_t n) {
  for (int64_t i = thread_first(); i < n; i += thread_stride())
    if (!(Y[i] > 0.0f)) dY[i] = 0.0f;
}

// Bias gradient of a Linear: column sums of dZ, masking dY in place when relu.
struct LinearBiasOp {
  float* dY;
  const float* Y;
  int out;
  bool relu;
  __device__ double operator()(int64_t b, int c) const {
    const int64_t i = b * out + c;
    float g = dY[i];
    if (relu && !(Y[i] > 0.0f)) {
      g = 0.0f;
      dY[i] = 0.0f;
    }
    return g;
  }
};

// linear_backward's step 1 as the legacy kernels ran it (partial: col_chunks(B)·out doubles).
void legacy_mask_and_bias(cudaStream_t stream, const float* Y, float* dY, float* db,
                          double* partial, int64_t B, int out, bool relu, bool add) {
  const char* op = "legacy linear_backward";
  if (db) {  // legacy: the mask fused into the sums' loop
    deterministic_col_sums(stream, B, out, LinearBiasOp{dY, Y, out, relu}, partial,
                           GradStore{db, add}, op);
  } else if (relu && B > 0) {
    relu_mask_kernel<<<grid_for(B * out), kThreads, 0, stream>>>(dY, Y, B * out);
    check_launch(op);
  }
}

}  // namespace
}  // namespace ncf::cuda

namespace ncf {
namespace {

using namespace kernel_bench;

// The column sums of Z [B × C] in deterministic_col_sums' order: per chunk of kColChunk rows,
// thread row r (of kColRows) adds rows r, r + kColRows, … in turn, the thread rows added in
// r order; above kColGroup chunks, each group of kColGroup chunk sums in chunk order, then
// the groups in order; else the chunks in order. In double from 0, rounded to float once.
std::vector<float> col_sums_in_kernel_order(const std::vector<float>& Z, int64_t B, int C) {
  using cuda::col_chunks;
  using cuda::kColChunk;
  using cuda::kColGroup;
  using cuda::kColRows;
  const int64_t chunks = col_chunks(B);
  std::vector<double> partial(size_t(chunks) * C);
  std::vector<double> rows(size_t(kColRows) * C);
  for (int64_t x = 0; x < chunks; ++x) {
    std::fill(rows.begin(), rows.end(), 0.0);
    const int64_t b1 = std::min(B, (x + 1) * kColChunk);
    for (int64_t b = x * kColChunk; b < b1; ++b) {
      double* r = rows.data() + size_t((b - x * kColChunk) % kColRows) * C;
      for (int c = 0; c < C; ++c) r[c] += Z[size_t(b) * C + c];
    }
    for (int c = 0; c < C; ++c) {
      double s = 0.0;
      for (int r = 0; r < kColRows; ++r) s += rows[size_t(r) * C + c];
      partial[size_t(x) * C + c] = s;
    }
  }
  const int64_t step = chunks > kColGroup ? kColGroup : 1;
  std::vector<float> total(static_cast<size_t>(C));
  for (int c = 0; c < C; ++c) {
    double s = 0.0;
    for (int64_t g = 0; g < chunks; g += step) {
      double group = partial[size_t(g) * C + c];
      for (int64_t x = g + 1; x < std::min(chunks, g + step) && step > 1; ++x)
        group += partial[size_t(x) * C + c];
      s += group;
    }
    total[size_t(c)] = static_cast<float>(s);
  }
  return total;
}

int bench(const Flags& f) {
  Program prog(f, "linear_backward's ReLU mask and bias column sums, then its dW product");
  const int64_t B = f.get("rows");
  const int in = static_cast<int>(f.get("in")), out = static_cast<int>(f.get("out"));
  const uint64_t seed = static_cast<uint64_t>(f.get("seed"));
  const size_t elems = size_t(B) * out;
  std::vector<float> Y = uniform(seed, 1, elems, -1.0f, 1.0f);
  for (float& y : Y) y = std::max(y, 0.0f);  // post-ReLU activations: about half zeros
  std::vector<float> dY = uniform(seed, 2, elems, -1.0f / 1024, 1.0f / 1024);
  for (size_t k = 0; k < elems; k += 97) Y[k] = std::numeric_limits<float>::quiet_NaN();
  for (size_t k = 5; k < elems; k += 89) dY[k] = -0.0f;
  std::vector<float> X = uniform(seed, 3, size_t(B) * in, 0.0f, 1.0f);
  const std::vector<float> W = uniform(seed, 4, size_t(out) * in, -0.1f, 0.1f);

  std::vector<float> want_dz(elems);
  for (size_t i = 0; i < elems; ++i) want_dz[i] = Y[i] > 0.0f ? dY[i] : 0.0f;
  const std::vector<float> want_db = col_sums_in_kernel_order(want_dz, B, out);

  Buffer<float> gX = upload(X), gW = upload(W), gY = upload(Y), gdY = upload(dY);
  Buffer<float> gdW(Device::kCuda, size_t(out) * in), gdb(Device::kCuda, size_t(out));
  Buffer<double> partial(Device::kCuda, size_t(cuda::col_chunks(B)) * out);
  const std::vector<float> sentinel(size_t(out), 7.0f);
  auto dw_product = [&] {
    gemm(prog.ctx(), true, false, out, in, static_cast<int>(B), 1.0f, gdY.data(), out, gX.data(),
         in, 0.0f, gdW.data(), in);
  };
  const std::string shape =
      " B=" + std::to_string(B) + " in=" + std::to_string(in) + " out=" + std::to_string(out);
  for (const bool with_db : {true, false}) {
    float* db = with_db ? gdb.data() : nullptr;
    std::vector<float> first_dw;  // the first checked version's dW
    Case c;
    c.name = std::string(with_db ? "linear_backward mask+db" : "linear_backward mask") + shape;
    // dY in and out and Y; with db the sums' output (the dW product's bytes not counted)
    c.bytes = 4.0 * (3.0 * double(elems) + (with_db ? out : 0));
    c.versions = {
        {"v1",
         with_db ? "legacy LinearBiasOp column sums, the mask in their loop; then the dW product"
                 : "legacy relu_mask_kernel, an element per thread; then the dW product",
         [&] {
           cuda::legacy_mask_and_bias(prog.stream(), gY.data(), gdY.data(), db, partial.data(), B,
                                      out, true, false);
           dw_product();
         }},
        {"v2",
         with_db ? "the library's linear_backward: mask_col_sums_kernel, the dW product"
                 : "the library's linear_backward: relu_mask_stream_kernel, the dW product",
         [&] {
           linear_backward(prog.ctx(), gX.data(), gW.data(), gY.data(), gdY.data(), nullptr,
                           gdW.data(), db, B, in, out, true, GradMode::kOverwrite);
         }},
    };
    c.baseline = {"dW", "the dW product alone (gemm, TF32), in both versions", dw_product};
    c.reset = [&] {
      upload_into(gdY, dY);
      upload_into(gdb, sentinel);
    };
    c.check = [&](const Version&) {
      std::string bad = same_bits("dZ against the CPU's", download(gdY, elems), want_dz);
      if (bad.empty() && with_db)
        bad = same_bits("db against the CPU's", download(gdb, size_t(out)), want_db);
      const std::vector<float> dw = download(gdW, size_t(out) * in);
      if (bad.empty() && !first_dw.empty()) bad = same_bits("dW against v1's", dw, first_dw);
      if (first_dw.empty()) first_dw = dw;
      return bad;
    };
    prog.run(c);
  }
  return prog.finish();
}

}  // namespace
}  // namespace ncf

int main(int argc, char** argv) {
  const ncf::kernel_bench::Flags f("linear_bias_mask",
                                   {{"rows", 1048575}, {"in", 256}, {"out", 128}}, argc, argv);
  return ncf::kernel_bench::guarded("linear_bias_mask", [&] { return ncf::bench(f); });
}
