// The BF16 copy of an FP32 matrix (rows × cols, row stride ld on both sides): what
// MathMode::kBf16's GEMMs read (their per-GEMM operand copies) and to_bf16_rows writes,
// rounded to nearest-even by common/bf16.h's float_to_bf16_bits. Its versions:
//   v1  to_bf16_kernel for every shape: one element per thread, its row by a 64-bit
//       division. As the legacy step kernels' copy it lost on an H200 (they ran it for
//       every shape; bench_kernels in bench/results/gpu_2026-11-27_98d21d0/), and the
//       switch that chose it left src/model/ops_elementwise.cu; the kernel itself stays
//       there (this is a copy) for the shapes the quads do not take (a width, stride or
//       pointer off four floats).
//   v2  the library's to_bf16_rows (launch_to_bf16: to_bf16_quads_kernel, four elements
//       per thread, a contiguous matrix as one range, strided rows by a 32-bit division).
// Both are held to float_to_bf16_bits on the CPU: the same bits, the padding between
// rows untouched.
//
//   to_bf16 [--rows 1048575] [--cols 128] [--ld 192] [--gpu 0] [--warmup 3] [--repeats 20]
//           [--seed 1]
// Two cases: the flat matrix (ld = cols) and rows of cols out of ld (the defaults: layer 0's
// items' half of the ml-20m-mlperf step's rows, 128 of 192 columns).
#include "common/bf16.h"
#include "common/cuda_util.cuh"
#include "kernel_bench.cuh"
#include "model/ops.h"

namespace ncf::cuda {
namespace {

// dst[r·ldd + c] = BF16 bits of src[r·lds + c] for r < rows, c < cols (the padding
// between rows is neither read nor written). The rounding is bf16.h's, so it
// matches the CPU twin bit for bit.
__global__ void to_bf16_kernel(const float* src, int64_t lds, int64_t rows, int cols, uint16_t* dst,
                               int64_t ldd) {
  const int64_t total = rows * cols;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t r = i / cols, c = i % cols;
    dst[r * ldd + c] = float_to_bf16_bits(src[r * lds + c]);
  }
}

void legacy_to_bf16(cudaStream_t stream, const float* src, int64_t lds, int64_t rows, int64_t cols,
                    uint16_t* dst, int64_t ldd) {
  if (rows == 0) return;
  to_bf16_kernel<<<grid_for(rows * cols), kThreads, 0, stream>>>(src, lds, rows,
                                                                 static_cast<int>(cols), dst, ldd);
  check_launch("to_bf16_kernel");
}

}  // namespace
}  // namespace ncf::cuda

namespace ncf {
namespace {

using namespace kernel_bench;

int bench(const Flags& f) {
  Program prog(f, "the BF16 copy of an FP32 matrix (kBf16's GEMM operands, to_bf16_rows)");
  const int64_t rows = f.get("rows");
  const int cols = static_cast<int>(f.get("cols"));
  const uint64_t seed = static_cast<uint64_t>(f.get("seed"));
  std::vector<int64_t> lds = {cols};
  if (f.get("ld") > cols) lds.push_back(f.get("ld"));
  for (const int64_t ld : lds) {
    const size_t elems = size_t(rows) * ld;
    std::vector<float> X = uniform(seed, uint64_t(ld), elems, -2.0f, 2.0f);
    for (size_t k = 0; k < elems; k += 7) {  // rounding ties and their neighbours
      const uint32_t low[] = {0x8000u, 0x7FFFu, 0x8001u};
      uint32_t bits;
      std::memcpy(&bits, &X[k], sizeof bits);
      bits = (bits & 0xFFFF0000u) | low[(k / 7) % 3];
      std::memcpy(&X[k], &bits, sizeof bits);
    }
    const std::vector<uint16_t> sentinel(elems, 7);
    std::vector<uint16_t> want = sentinel;
    for (int64_t r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c)
        want[size_t(r * ld + c)] = float_to_bf16_bits(X[size_t(r * ld + c)]);

    Buffer<float> gX = upload(X);
    Buffer<uint16_t> gY = upload(sentinel);
    Case c;
    c.name = std::string(ld == cols ? "to_bf16 flat" : "to_bf16 strided") +
             " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
             " ld=" + std::to_string(ld);
    c.bytes = 6.0 * double(rows) * cols;  // 4 bytes read and 2 written per element
    c.versions = {
        {"v1", "to_bf16_kernel for every shape, an element per thread",
         [&] { cuda::legacy_to_bf16(prog.stream(), gX.data(), ld, rows, cols, gY.data(), ld); }},
        {"v2", "the library's to_bf16_rows: to_bf16_quads_kernel",
         [&] { to_bf16_rows(prog.ctx(), gX.data(), ld, cols, gY.data(), ld, rows); }},
    };
    c.reset = [&] { upload_into(gY, sentinel); };
    c.check = [&](const Version&) {
      return same_bits("BF16 bits against the CPU's (padding untouched)", download(gY, elems),
                       want);
    };
    prog.run(c);
  }
  return prog.finish();
}

}  // namespace
}  // namespace ncf

int main(int argc, char** argv) {
  const ncf::kernel_bench::Flags f("to_bf16", {{"rows", 1048575}, {"cols", 128}, {"ld", 192}}, argc,
                                   argv);
  return ncf::kernel_bench::guarded("to_bf16", [&] { return ncf::bench(f); });
}
