// The process-wide modes and switches of the dense ops (model/ops.h): how a backward
// op writes a parameter gradient, the tower GEMMs' arithmetic (MathMode), and two test
// hooks that force a path the library keeps for shapes its faster path does not take
// (NeuMF's unfused top, linear_forward_bf16's FP32 product and epilogue), for the tests
// that hold the faster path against it. The code is in ops_modes.cc (no CUDA twins).
#pragma once

#include <string>

namespace ncf {

// How a backward op writes a parameter gradient: replace what is there, or add
// to it (for parameters used more than once per step).
enum class GradMode { kOverwrite, kAccumulate };

// Arithmetic of the tower GEMMs (gemm, linear_forward, linear_backward: every
// GEMM inside them), process-wide, read once per op:
//   kTf32 (the default) lets cuBLAS round the inputs to TF32 on tensor cores
//         (~1e-3 relative error per product, several times faster than FP32).
//         GPU only: the CPU computes these GEMMs in plain FP32.
//   kFp32 keeps full FP32 products on both devices, for parity tests.
//   kBf16 rounds both input operands of each GEMM to BF16 (common/bf16.h,
//         nearest-even; ~4e-3 relative error per factor) and accumulates in
//         FP32, with FP32 outputs, on both devices: the CPU rounds copies and
//         runs the same FP32 BLAS GEMM, so it is the GPU's reference up to
//         summation order. The BF16 copies are made per GEMM from the FP32
//         arrays: parameters, gradients, optimizer state, embeddings, biases
//         and the loss stay FP32 (FP32 master weights). NeuMF (with its fused
//         top, below) instead stores its tower in BF16 and calls the *_bf16 ops
//         (model/ops.h, "BF16 storage"), which make no per-GEMM copies.
enum class MathMode { kTf32, kFp32, kBf16 };
void set_math_mode(MathMode mode);
MathMode math_mode();
// "tf32" | "fp32" | "bf16" (the --precision values) → MathMode; anything else
// throws ncf::Error naming the value.
MathMode parse_math_mode(const std::string& name);
// The --precision spelling of `mode`: "tf32", "fp32" or "bf16".
const char* math_mode_name(MathMode mode);

// Whether NeuMF runs its top (GMF, head, loss and the last layer's mask and bias
// gradient) as the two fused ops neumf_top_forward / neumf_top_backward (true, the
// default) where their widths allow (mf_dim and the last layer at most
// kNeumfTopMaxWidth), process-wide, read by NeuMF once per forward. false forces the
// unfused ops (repeat_rows, gmf_*, concat/split_cols, head_*, bce_*, linear_backward's
// mask and bias sums), the path a wider model takes anyway, and with them, under
// MathMode::kBf16, the per-GEMM BF16 copies instead of BF16 storage. A test hook: the
// second computation the tests (and bench_kernels) hold the fused top against; no
// program sets it. In FP32 both compute the same values: every element the same bits;
// the sums the same bits on the CPU, and on the GPU the fused top's (dw, dc, the last
// bias gradient, the loss) in another fixed order, within a double sum's rounding.
void set_fused_top(bool on);
bool fused_top_enabled();

// GPU linear_forward_bf16 as one cuBLASLt matmul whose epilogue writes the BF16
// activations (true, the default) or, after set_lt_bf16_out(false), forced onto its
// fallback: the FP32 product and the epilogue kernel on the same BF16 bias, the path it
// takes anyway where lt_linear_forward declines a shape (no cuBLASLt algorithm, a bias
// off 16-byte alignment). A test hook: the parity tests' and bench_kernels' second
// computation of the same values; no program sets it.
bool lt_bf16_out_enabled();
void set_lt_bf16_out(bool on);

}  // namespace ncf
