// Layer 0's group ops (model/ops.h): rows in groups of S samples that share a user's
// row (repeat_rows, group_bias_act, group_linear_forward, group_sum_backward), the ReLU
// bit mask layer 0 writes, their BF16-storage forms, and layer 0 against a table of
// per-item products (gather_bias_act). The CPU code is in ops_groups.cc, the CUDA twins
// in ops_groups.cu.
#pragma once

#include <cstdint>

#include "common/device.h"

namespace ncf {

// Groups: B = n·S rows in n groups of S consecutive rows that share one
// row of a per-group array (the S samples of one positive share its user).
// Y[b, :] = X[b / S, :] for b < n·S (Y contiguous [n·S × w], X with stride ldx).
void repeat_rows(const ExecContext& ctx, const float* X, int64_t ldx, int w, float* Y, int64_t n,
                 int S);
// Y[b, j] = act((Y[b, j] + Yg[b / S, j]) + bias[j]) for b < n·S, j < out; act is
// ReLU when relu; bias may be null.
void group_bias_act(const ExecContext& ctx, float* Y, const float* Yg, const float* bias, int64_t n,
                    int S, int out, bool relu);
// The two above in one: Y[b, :] = act((X[b, :] · weight^T + Yg[b / S, :]) + bias)
// for b < n·S, with X [n·S × in] of row stride ldx and weight [out×in] of row
// stride ldw (a column slice of a wider layer: the items' half of layer 0, whose
// users' half Yg [n × out] was computed once per user). The CPU adds Yg and the
// bias inside each block's product (no pass of its own over Y); the GPU runs the
// GEMM, then group_bias_act.
// With mask (relu only), the output's ReLU bit mask too (relu_mask_words).
void group_linear_forward(const ExecContext& ctx, const float* X, int64_t ldx, const float* weight,
                          int64_t ldw, const float* Yg, const float* bias, float* Y, int64_t n,
                          int S, int in, int out, bool relu, uint32_t* mask = nullptr);
// Backward of group_bias_act. dY [n·S × out] in: dL/dY; out: the masked dL/dZ
// (when relu, from the forward output Y, or from its bit mask when mask is given;
// Y may be null otherwise). dYg[p, :] (row stride lddyg) = Σ_s dZ[p·S + s, :],
// summed in double in s order, overwritten; db (may be null) = Σ_p dYg[p, :] (fixed
// row blocks), overwritten.
void group_sum_backward(const ExecContext& ctx, const float* Y, float* dY, int64_t n, int S,
                        int out, float* dYg, int64_t lddyg, float* db, bool relu,
                        const uint32_t* mask = nullptr);

// A ReLU bit mask of a [B × out] output: one bit per element, set where the stored
// output is > 0 (so a NaN or a zero is 0); row b starts at word b·relu_mask_words(out),
// element j at bit j % 32 of the row's word j / 32, rows padded to 128 bits (the
// layout of cuBLASLt's ReLU aux output). Layer 0's forward writes it, and its
// backward masks with it instead of reading the whole output again.
int64_t relu_mask_words(int out);

// group_linear_forward on BF16 X and weight: Y = bf16(act((X·weight^T + bias) + Yg[b / S])),
// Yg [n × out] and bias FP32.
void group_linear_forward_bf16(const ExecContext& ctx, const uint16_t* X, int64_t ldx,
                               const uint16_t* weight, int64_t ldw, const float* Yg,
                               const float* bias, uint16_t* Y, int64_t n, int S, int in, int out,
                               bool relu, uint32_t* mask = nullptr);
// Layer 0 against a table of per-item products (evaluation, where every candidate
// is an item: P [R × out] = the items' half of layer 0 for each of R items, once
// per evaluation, instead of once per sample). gather_bias_act is group_bias_act
// with the product's row b taken from P[ids[b], :]: Y[b, j] = act((P[ids[b], j] +
// Yg[b / S, j]) + bias[j]), the same two adds in the same order, so the bits of
// group_linear_forward where the product rows are equal. gather_bias_act_bf16 is
// group_linear_forward_bf16's epilogue on those rows: Y = bf16(act((P[ids[b], :] +
// bias) + Yg[b / S, :])). ids [n·S] in [0, R): the CPU twins check each (the message
// names the position and the id); the GPU twins read them as they are (the eval
// reader checked every id against the item count).
// With mask (relu only), the output's ReLU bit mask too (relu_mask_words), as
// group_linear_forward(_bf16) writes it.
void gather_bias_act(const ExecContext& ctx, const float* P, int64_t R, const int32_t* ids,
                     const float* Yg, const float* bias, float* Y, int64_t n, int S, int out,
                     bool relu, uint32_t* mask = nullptr);
void gather_bias_act_bf16(const ExecContext& ctx, const float* P, int64_t R, const int32_t* ids,
                          const float* Yg, const float* bias, uint16_t* Y, int64_t n, int S,
                          int out, bool relu, uint32_t* mask = nullptr);

// group_sum_backward on BF16 Y and dY: dY masked in place when relu (by Y, or by
// its bit mask when given); dYg [n × out] (stride lddyg) and db FP32, summed in double
// as group_sum_backward sums.
void group_sum_backward_bf16(const ExecContext& ctx, const uint16_t* Y, uint16_t* dY, int64_t n,
                             int S, int out, float* dYg, int64_t lddyg, float* db, bool relu,
                             const uint32_t* mask = nullptr);

#ifdef NCF_WITH_CUDA
// The CUDA twins (ops_groups.cu); called through the dispatch in ops_groups.cc only.
namespace cuda {
void repeat_rows(const ExecContext& ctx, const float* X, int64_t ldx, int w, float* Y, int64_t n,
                 int S);
void group_bias_act(const ExecContext& ctx, float* Y, const float* Yg, const float* bias, int64_t n,
                    int S, int out, bool relu);
void group_linear_forward(const ExecContext& ctx, const float* X, int64_t ldx, const float* weight,
                          int64_t ldw, const float* Yg, const float* bias, float* Y, int64_t n,
                          int S, int in, int out, bool relu, uint32_t* mask);
void group_sum_backward(const ExecContext& ctx, const float* Y, float* dY, int64_t n, int S,
                        int out, float* dYg, int64_t lddyg, float* db, bool relu,
                        const uint32_t* mask);
void group_linear_forward_bf16(const ExecContext& ctx, const uint16_t* X, int64_t ldx,
                               const uint16_t* weight, int64_t ldw, const float* Yg,
                               const float* bias, uint16_t* Y, int64_t n, int S, int in, int out,
                               bool relu, uint32_t* mask);
void group_sum_backward_bf16(const ExecContext& ctx, const uint16_t* Y, uint16_t* dY, int64_t n,
                             int S, int out, float* dYg, int64_t lddyg, float* db, bool relu,
                             const uint32_t* mask);
void gather_bias_act(const ExecContext& ctx, const float* P, int64_t R, const int32_t* ids,
                     const float* Yg, const float* bias, float* Y, int64_t n, int S, int out,
                     bool relu, uint32_t* mask);
void gather_bias_act_bf16(const ExecContext& ctx, const float* P, int64_t R, const int32_t* ids,
                          const float* Yg, const float* bias, uint16_t* Y, int64_t n, int S,
                          int out, bool relu, uint32_t* mask);
}  // namespace cuda
#endif

}  // namespace ncf
