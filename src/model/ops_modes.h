// The process-wide modes and switches of the dense ops (model/ops.h): how a backward
// op writes a parameter gradient, the tower GEMMs' arithmetic (MathMode), which kernels
// run the step's element-wise and masked passes (StepKernels), and the switch that
// selects a replaced GPU path for the tests that hold its replacement against it. The code is in
// ops_modes.cc (no CUDA twins).
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
//         and the loss stay FP32 (FP32 master weights). NeuMF (with the
//         streaming kernels) instead stores its tower in BF16 and calls the
//         *_bf16 ops (model/ops.h, "BF16 storage"), which make no per-GEMM copies.
enum class MathMode { kTf32, kFp32, kBf16 };
void set_math_mode(MathMode mode);
MathMode math_mode();
// "tf32" | "fp32" | "bf16" (the --precision values) → MathMode; anything else
// throws ncf::Error naming the value.
MathMode parse_math_mode(const std::string& name);
// The --precision spelling of `mode`: "tf32", "fp32" or "bf16".
const char* math_mode_name(MathMode mode);

// Which kernels run the element-wise and masked passes of the tower step,
// process-wide, read once per op (and by NeuMF once per forward):
//   kStreaming (the default): on the GPU, linear_backward's ReLU mask and bias
//         gradient, group_sum_backward and group_bias_act load every row of a
//         group (float4 where the rows allow) before they store anything, store
//         whole rows, and sum in read-only passes, and kBf16's operand copies
//         convert four elements per thread (float4 in, 8 bytes out, no 64-bit
//         division); on both devices NeuMF runs its
//         top (GMF, head, loss and the last layer's mask and bias gradient) as
//         the two fused ops neumf_top_forward / neumf_top_backward;
//   kLegacy: the kernels before them (one element per thread with runtime
//         divisions; masks stored in place inside the sums' loops, a conditional
//         store between dependent loads) and NeuMF's unfused top (repeat_rows,
//         gmf_*, concat/split_cols, head_*, bce_*). They lost on a GPU (the step's
//         time); no program selects them: they are what the parity tests hold the
//         streaming kernels and the fused top against, and bench_kernels times both.
// Both compute the same values: every element the same bits; the sums the same
// bits on the CPU, and on the GPU the same bits except the fused top's (dw, dc,
// the last bias gradient, the loss: another fixed order, within a double sum's
// rounding).
enum class StepKernels { kStreaming, kLegacy };
void set_step_kernels(StepKernels kernels);
StepKernels step_kernels();
const char* step_kernels_name(StepKernels kernels);

// GPU linear_forward_bf16 as one cuBLASLt matmul whose epilogue writes the BF16
// activations (true, the default) or, after set_lt_bf16_out(false), as the FP32 product
// and the epilogue kernel (the path it replaced, on the same BF16 bias; it lost on a
// GPU): the parity tests' second computation of the same values, timed by bench_kernels.
bool lt_bf16_out_enabled();
void set_lt_bf16_out(bool on);

}  // namespace ncf
