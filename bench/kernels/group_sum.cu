// group_sum_backward's mask and group sums, layer 0's backward on the users' half: dY
// [n·S × out] masked in place where Y <= 0 (or NaN), then dYg[p] = Σ_s dY[p·S + s] in
// double, in s order. Its versions:
//   v1  group_sum_kernel: one thread per (group, column), the mask stored in place inside
//       the sums' loop (a load, a conditional store into the lines the warp reads, the
//       next load: one load in flight per thread). It lost on an H200 (16.66 ms against
//       0.88 ms at the step's shape, bench_kernels in bench/results/gpu_2026-11-27_98d21d0/)
//       and left src/model/ops_groups.cu.
//   v2  the library's group_sum_backward (group_sum_stream_kernel: each group's rows
//       loaded eight at a time before any store, float4 lanes, whole rows stored).
// Both are held to a CPU loop that masks and sums in the same order: the same bits, as the
// kernels promise. Y carries NaN (masked to 0) and dY −0 (kept where Y > 0). The bias
// gradient (db, the column sums of dYg) is left out: the same code after either version.
//
//   group_sum [--n 209715] [--S 5] [--out 256] [--gpu 0] [--warmup 3] [--repeats 20] [--seed 1]
// (the defaults: the ml-20m-mlperf step's layer 0, 1,048,575 samples in groups of 5).
#include <cmath>
#include <limits>

#include "common/cuda_util.cuh"
#include "kernel_bench.cuh"
#include "model/ops.h"

namespace ncf::cuda {
namespace {

// One thread per (group, column): the mask, then the group's sum in s order.
__global__ void group_sum_kernel(const float* Y, float* dY, int64_t n, int S, int out, float* dYg,
                                 int64_t lddyg, bool relu) {
  for (int64_t x = thread_first(); x < n * out; x += thread_stride()) {
    const int64_t p = x / out;
    const int j = static_cast<int>(x % out);
    double acc = 0.0;
    for (int s = 0; s < S; ++s) {
      const int64_t i = (p * S + s) * out + j;
      if (relu && !(Y[i] > 0.0f)) dY[i] = 0.0f;
      acc += dY[i];
    }
    dYg[p * lddyg + j] = static_cast<float>(acc);
  }
}

void legacy_group_sum(cudaStream_t stream, const float* Y, float* dY, int64_t n, int S, int out,
                      float* dYg, int64_t lddyg, bool relu) {
  if (n > 0) {
    group_sum_kernel<<<grid_for(n * out), kThreads, 0, stream>>>(Y, dY, n, S, out, dYg, lddyg,
                                                                 relu);
    check_launch("group_sum_kernel");
  }
}

}  // namespace
}  // namespace ncf::cuda

namespace ncf {
namespace {

using namespace kernel_bench;

int bench(const Flags& f) {
  Program prog(f, "group_sum_backward's ReLU mask and group sums (db left out)");
  const int64_t n = f.get("n");
  const int S = static_cast<int>(f.get("S")), out = static_cast<int>(f.get("out"));
  const uint64_t seed = static_cast<uint64_t>(f.get("seed"));
  const size_t elems = size_t(n) * S * out;
  std::vector<float> Y = uniform(seed, 1, elems, -1.0f, 1.0f);
  for (float& y : Y) y = std::max(y, 0.0f);  // post-ReLU activations: about half zeros
  std::vector<float> dY = uniform(seed, 2, elems, -1.0f / 64, 1.0f / 64);
  for (size_t k = 0; k < elems; k += 97) Y[k] = std::numeric_limits<float>::quiet_NaN();
  for (size_t k = 5; k < elems; k += 89) dY[k] = -0.0f;

  // The CPU reference: the mask, and each group's sum in double in s order.
  std::vector<float> want_dy(elems), want_dyg(size_t(n) * out);
  std::vector<double> acc(static_cast<size_t>(out));
  for (int64_t p = 0; p < n; ++p) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int s = 0; s < S; ++s)
      for (int j = 0; j < out; ++j) {
        const size_t i = (size_t(p) * S + s) * out + j;
        want_dy[i] = Y[i] > 0.0f ? dY[i] : 0.0f;
        acc[size_t(j)] += want_dy[i];
      }
    for (int j = 0; j < out; ++j)
      want_dyg[size_t(p) * out + j] = static_cast<float>(acc[size_t(j)]);
  }

  Buffer<float> gY = upload(Y), gdY = upload(dY);
  const std::vector<float> sentinel(size_t(n) * out, 7.0f);
  Buffer<float> gdYg = upload(sentinel);
  Case c;
  c.name = "group_sum n=" + std::to_string(n) + " S=" + std::to_string(S) +
           " out=" + std::to_string(out) + " relu";
  c.bytes = 4.0 * (3.0 * double(elems) + double(n) * out);  // Y, dY in and out, dYg
  c.versions = {
      {"v1", "legacy group_sum_kernel, an element per thread, masks in the sums' loop",
       [&] {
         cuda::legacy_group_sum(prog.stream(), gY.data(), gdY.data(), n, S, out, gdYg.data(), out,
                                true);
       }},
      {"v2", "the library's group_sum_backward: group_sum_stream_kernel",
       [&] {
         group_sum_backward(prog.ctx(), gY.data(), gdY.data(), n, S, out, gdYg.data(), out, nullptr,
                            true);
       }},
  };
  c.reset = [&] {
    upload_into(gdY, dY);
    upload_into(gdYg, sentinel);
  };
  c.check = [&](const Version&) {
    std::string bad = same_bits("masked dY against the CPU's", download(gdY, elems), want_dy);
    if (bad.empty())
      bad = same_bits("group sums against the CPU's", download(gdYg, want_dyg.size()), want_dyg);
    return bad;
  };
  prog.run(c);
  return prog.finish();
}

}  // namespace
}  // namespace ncf

int main(int argc, char** argv) {
  const ncf::kernel_bench::Flags f("group_sum", {{"n", 209715}, {"S", 5}, {"out", 256}}, argc,
                                   argv);
  return ncf::kernel_bench::guarded("group_sum", [&] { return ncf::bench(f); });
}
