// group_bias_act, layer 0's forward join: Y [n·S × out] = ReLU((Y + Yg[b / S]) + bias), in
// place, two round-to-nearest adds per element. Its versions:
//   v1  group_bias_act_kernel: one element per thread, its row and group by two 64-bit
//       divisions. It lost on an H200 (1.81 ms against 0.58 ms at the step's shape,
//       bench_kernels in bench/results/gpu_2026-11-27_98d21d0/) and left
//       src/model/ops_groups.cu.
//   v2  the library's group_bias_act (group_bias_act_stream_kernel: one thread per group and
//       four columns, the group's row of Yg and the bias loaded once, its rows eight at a
//       time before any store, float4 lanes).
// Both are held to a CPU loop of the same two adds: the same bits, as the kernels promise.
// Y + Yg is exactly 0 here and there (the ReLU's kink).
//
//   group_bias_act [--n 209715] [--S 5] [--out 256] [--gpu 0] [--warmup 3] [--repeats 20]
//                  [--seed 1]
// (the defaults: the ml-20m-mlperf step's layer 0, 1,048,575 samples in groups of 5).
#include "common/cuda_util.cuh"
#include "kernel_bench.cuh"
#include "model/ops.h"

namespace ncf::cuda {
namespace {

__global__ void group_bias_act_kernel(float* Y, const float* Yg, const float* bias, int64_t n,
                                      int S, int out, bool relu) {
  for (int64_t i = thread_first(); i < n * S * out; i += thread_stride()) {
    const int64_t b = i / out;
    const int j = static_cast<int>(i % out);
    const float z = __fadd_rn(__fadd_rn(Y[i], Yg[(b / S) * out + j]), bias ? bias[j] : 0.0f);
    Y[i] = relu ? (z > 0.0f ? z : 0.0f) : z;
  }
}

void legacy_group_bias_act(cudaStream_t stream, float* Y, const float* Yg, const float* bias,
                           int64_t n, int S, int out, bool relu) {
  if (n == 0) return;
  group_bias_act_kernel<<<grid_for(n * S * out), kThreads, 0, stream>>>(Y, Yg, bias, n, S, out,
                                                                        relu);
  check_launch("group_bias_act_kernel");
}

}  // namespace
}  // namespace ncf::cuda

namespace ncf {
namespace {

using namespace kernel_bench;

int bench(const Flags& f) {
  Program prog(f, "group_bias_act, layer 0's join of the items' rows, the user's row and the bias");
  const int64_t n = f.get("n");
  const int S = static_cast<int>(f.get("S")), out = static_cast<int>(f.get("out"));
  const uint64_t seed = static_cast<uint64_t>(f.get("seed"));
  const size_t elems = size_t(n) * S * out;
  std::vector<float> Y = uniform(seed, 1, elems, -1.0f, 1.0f);
  const std::vector<float> Yg = uniform(seed, 2, size_t(n) * out, -1.0f, 1.0f);
  const std::vector<float> bias = uniform(seed, 3, size_t(out), -0.1f, 0.1f);
  for (size_t k = 3; k < elems; k += 101) {  // Y + Yg exactly 0 here and there
    const size_t b = k / out, j = k % out;
    Y[k] = -Yg[(b / S) * out + j];
  }

  // The CPU reference: the same two adds in the same order, then the ReLU.
  std::vector<float> want(elems);
  for (size_t i = 0; i < elems; ++i) {
    const size_t b = i / out, j = i % out;
    const float z = (Y[i] + Yg[(b / S) * out + j]) + bias[j];
    want[i] = z > 0.0f ? z : 0.0f;
  }

  Buffer<float> gY = upload(Y), gYg = upload(Yg), gbias = upload(bias);
  Case c;
  c.name = "group_bias_act n=" + std::to_string(n) + " S=" + std::to_string(S) +
           " out=" + std::to_string(out) + " bias relu";
  c.bytes = 4.0 * (2.0 * double(elems) + double(n) * out + out);  // Y in and out, Yg, bias
  c.versions = {
      {"v1", "legacy group_bias_act_kernel, an element per thread",
       [&] {
         cuda::legacy_group_bias_act(prog.stream(), gY.data(), gYg.data(), gbias.data(), n, S, out,
                                     true);
       }},
      {"v2", "the library's group_bias_act: group_bias_act_stream_kernel",
       [&] { group_bias_act(prog.ctx(), gY.data(), gYg.data(), gbias.data(), n, S, out, true); }},
  };
  c.reset = [&] { upload_into(gY, Y); };
  c.check = [&](const Version&) {
    return same_bits("Y against the CPU's", download(gY, elems), want);
  };
  prog.run(c);
  return prog.finish();
}

}  // namespace
}  // namespace ncf

int main(int argc, char** argv) {
  const ncf::kernel_bench::Flags f("group_bias_act", {{"n", 209715}, {"S", 5}, {"out", 256}}, argc,
                                   argv);
  return ncf::kernel_bench::guarded("group_bias_act", [&] { return ncf::bench(f); });
}
