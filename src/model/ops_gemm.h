// The dense ops' GEMMs (model/ops.h): gemm, Linear forward and backward, and their
// BF16-storage forms (gemm_bf16, linear_forward_bf16, linear_backward_bf16). The CPU code
// is in ops_gemm.cc (cpu_matmul on fixed blocks), the CUDA twins in ops_gemm.cu (cuBLAS,
// and cuBLASLt for the forward Linear's fused epilogue).
#pragma once

#include <cstdint>

#include "common/device.h"
#include "model/ops_modes.h"

namespace ncf {

// C[M×N] = alpha·op(A)·op(B) + beta·C, all row-major; op(A) is M×K, op(B) K×N.
// beta == 0 overwrites C (NaNs in C do not leak). K == 0 gives C = beta·C.
void gemm(const ExecContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
          const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc);

// Y[B×out] = act(X[B×in] · weight^T + bias), weight is [out×in] (the PyTorch nn.Linear
// layout: row j holds the weights into output j), bias[out] may be null, act is
// ReLU when relu, identity otherwise.
void linear_forward(const ExecContext& ctx, const float* X, const float* weight, const float* bias,
                    float* Y, int64_t B, int in, int out, bool relu);

// Backward of linear_forward.
//   Y   [B×out] the forward output (post-activation); read only when relu, for the
//       mask Y > 0 (the gradient at Z = 0 is taken as 0), may be null otherwise.
//   dY  [B×out] in: dL/dY; out: dL/dZ (the masked gradient) when relu, else unchanged.
//   dX  [B×in]  dL/dX, always overwritten; null skips it.
//   dweight  [out×in], db [out] (db null when the layer has no bias): written as `mode` says.
// dweight = dZ^T·X (GEMM), db = column sums of dZ (block_sums: fixed row blocks).
void linear_backward(const ExecContext& ctx, const float* X, const float* weight, const float* Y,
                     float* dY, float* dX, float* dweight, float* db, int64_t B, int in, int out,
                     bool relu, GradMode mode);

// C[M×N] = op(A)·op(B) in FP32 (overwritten), A and B BF16; as gemm otherwise.
void gemm_bf16(const ExecContext& ctx, bool trans_a, bool trans_b, int M, int N, int K,
               const uint16_t* A, int lda, const uint16_t* B, int ldb, float* C, int ldc);
// linear_forward on BF16: Y = bf16(act(X · weight^T + bias)), the product and the sum
// in FP32, the bias BF16 like the weights (may be null). On the GPU this is one
// cuBLASLt matmul whose epilogue writes the BF16 activations, and that epilogue takes
// a bias of the output's type; PyTorch's autocast likewise casts a linear layer's bias
// with its weight.
void linear_forward_bf16(const ExecContext& ctx, const uint16_t* X, const uint16_t* weight,
                         const uint16_t* bias, uint16_t* Y, int64_t B, int in, int out, bool relu);

// linear_backward on BF16 (GradMode kOverwrite): dY masked in place by Y > 0 when
// relu; db (may be null) = column sums of the masked dY, in double over fixed
// blocks; dX (may be null) = bf16(dZ · weight); dweight = dZ^T · X in FP32.
// (On the GPU cuBLAS rounds dX to nearest rather than float_to_bf16_bits: the same
// rounding of an FP32 value.)
void linear_backward_bf16(const ExecContext& ctx, const uint16_t* X, const uint16_t* weight,
                          const uint16_t* Y, uint16_t* dY, uint16_t* dX, float* dweight, float* db,
                          int64_t B, int in, int out, bool relu);

#ifdef NCF_WITH_CUDA
// The CUDA twins (ops_gemm.cu); called through the dispatch in ops_gemm.cc only.
namespace cuda {
void gemm(const ExecContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
          const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc);
void linear_forward(const ExecContext& ctx, const float* X, const float* weight, const float* bias,
                    float* Y, int64_t B, int in, int out, bool relu);
void linear_backward(const ExecContext& ctx, const float* X, const float* weight, const float* Y,
                     float* dY, float* dX, float* dweight, float* db, int64_t B, int in, int out,
                     bool relu, GradMode mode);
void gemm_bf16(const ExecContext& ctx, bool trans_a, bool trans_b, int M, int N, int K,
               const uint16_t* A, int lda, const uint16_t* B, int ldb, float* C, int ldc);
void linear_forward_bf16(const ExecContext& ctx, const uint16_t* X, const uint16_t* weight,
                         const uint16_t* bias, uint16_t* Y, int64_t B, int in, int out, bool relu);
void linear_backward_bf16(const ExecContext& ctx, const uint16_t* X, const uint16_t* weight,
                          const uint16_t* Y, uint16_t* dY, uint16_t* dX, float* dweight, float* db,
                          int64_t B, int in, int out, bool relu);
}  // namespace cuda
#endif

}  // namespace ncf
