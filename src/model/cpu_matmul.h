// One matrix product on the calling thread, with its epilogue fused, for the
// CPU ops (model/ops_*.cc). oneDNN's matmul does the arithmetic: its brgemm
// kernels reach ~95% of a core's FP32 peak at the tower's shapes where
// OpenBLAS's transposed-weight products reach 30-45%
// (bench/bench_tower_gemm.cc), it applies bias, ReLU and "add to C" as
// post-ops while the output tile is still in registers, and it multiplies BF16
// operands with the CPU's BF16 instructions (AVX512-BF16, AMX) where they exist.
//
// The product always runs on the calling thread alone (the CPU ops share fixed
// blocks out over their own pool, common/parallel.h), so for given shapes its
// result does not depend on how many threads the rank has.
#pragma once

#include <cstdint>
#include <string>

namespace ncf {

// C[M×N] = act(alpha·op(A)·op(B) + beta·C + bias), row-major with row strides
// lda, ldb, ldc; op(A) is M×K (A stored [K×M] when trans_a), op(B) is K×N (B
// stored [N×K] when trans_b). beta is 0 or 1; bias [N] may be null, and only
// with alpha = 1; act is ReLU when relu.
struct MatmulShape {
  int M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;
  int lda = 0, ldb = 0, ldc = 0;
};
struct MatmulEpilogue {
  float alpha = 1.0f;
  float beta = 0.0f;
  const float* bias = nullptr;
  bool relu = false;
};

// Operand precision. kBf16 rounds A and B to BF16 (nearest-even, exactly as
// common/bf16.h) and accumulates in FP32: with BF16 instructions when
// cpu_bf16_native(), else by multiplying the rounded values in FP32.
enum class MatmulPrecision { kFp32, kBf16 };

// M, N ≥ 1 and K ≥ 1 (the caller handles empty products); throws ncf::Error if
// oneDNN refuses the shape.
void cpu_matmul(const MatmulShape& shape, const float* A, const float* B, float* C,
                const MatmulEpilogue& epilogue, MatmulPrecision precision);

// The same product on operands already stored as BF16 bits (no operand copies:
// --precision bf16's stored activations), with C FP32 (C_bf16 null) or BF16
// (C null: act(alpha·op(A)·op(B) + bias) rounded once, nearest-even, as
// float_to_bf16_bits rounds; beta must then be 0). Native BF16 instructions
// when cpu_bf16_native(), else the operands widened (exactly) to FP32 and the
// FP32 product, rounded after its epilogue: so on the emulated path the result
// is the FP32 product's of the same values, bit for bit.
void cpu_matmul_bf16(const MatmulShape& shape, const uint16_t* A, const uint16_t* B, float* C,
                     uint16_t* C_bf16, const MatmulEpilogue& epilogue);

// Whether --precision bf16 products run on BF16 instructions on this CPU:
// oneDNN's ISA includes AVX512-BF16 (or AMX), unless set_cpu_bf16_emulated(true).
bool cpu_bf16_native();
// Forces the emulated path (true) or goes back to what was detected (false),
// process-wide; for tests that compare the two paths on one machine.
void set_cpu_bf16_emulated(bool emulated);

// For the startup line: "oneDNN 2.6.3 on avx512_core_bf16; bf16 native
// (AVX512-BF16)" or "...; bf16 emulated (no BF16 instructions: BF16-rounded
// operands, FP32 products)".
std::string cpu_matmul_description();

// dst[i] = BF16 bits of src[i] (nearest-even, as float_to_bf16_bits), i < n.
void round_to_bf16_bits(const float* src, uint16_t* dst, int64_t n);
// dst[j] = BF16 bits of act((src[j] + a[j]) + b[j]), j < n: a product's epilogue
// (a, b may be null: nothing added; act is ReLU when relu), each add one FP32
// rounding, then float_to_bf16_bits.
void epilogue_to_bf16_bits(const float* src, const float* a, const float* b, bool relu,
                           uint16_t* dst, int64_t n);

}  // namespace ncf
