// The top of NeuMF (model/ops.h): GMF, the column concat / split, the logit head and
// BCE-with-logits as separate ops, the fused neumf_top_forward / neumf_top_backward
// (FP32 and BF16 storage), and evaluation's scoring in one op. The CPU code is in
// ops_top.cc, the CUDA twins in ops_top.cu (neumf_score_items_bf16's in score_items.cu).
#pragma once

#include <cstdint>

#include "common/device.h"
#include "model/ops_modes.h"

namespace ncf {

// GMF: gmf[b, k] = urows[b, k] · irows[b, k] for k < mf. urows and irows are the gathered user and
// item embedding rows; the GMF part is their first mf columns.
void gmf_forward(const ExecContext& ctx, const float* urows, int64_t ldu, const float* irows,
                 int64_t ldi, float* gmf, int64_t ldg, int64_t B, int mf);
// durows[b, k] = dgmf[b, k] · irows[b, k], dirows[b, k] = dgmf[b, k] · urows[b, k] for k < mf,
// overwritten; columns ≥ mf of durows/dirows are not touched.
void gmf_backward(const ExecContext& ctx, const float* urows, int64_t ldu, const float* irows,
                  int64_t ldi, const float* dgmf, int64_t ldg, float* durows, int64_t lddu,
                  float* dirows, int64_t lddi, int64_t B, int mf);

// Y[B×(wa+wc)] = [A[B×wa] ; C[B×wc]] (column concat, Y contiguous).
// The MLP input is concat_cols(urows + mf, D, h, irows + mf, D, h, X0, B) with h = layers[0]/2.
void concat_cols(const ExecContext& ctx, const float* A, int64_t lda, int wa, const float* C,
                 int64_t ldc, int wc, float* Y, int64_t B);
// Inverse of concat_cols for gradients: dA = dY[:, :wa], dC = dY[:, wa:], overwritten.
void split_cols(const ExecContext& ctx, const float* dY, int wa, int wc, float* dA, int64_t ldda,
                float* dC, int64_t lddc, int64_t B);

// The logit head: logits[b] = w · H[b, :] + c[0], H[B×F] = [GMF ; MLP output].
// c points at the scalar (inside the parameter buffer, on ctx.device).
void head_forward(const ExecContext& ctx, const float* H, const float* w, const float* c,
                  float* logits, int64_t B, int F);
// dH[b, k] = dlogits[b] · w[k] (overwritten); dw[k] = Σ_b dlogits[b] · H[b, k] and
// dc[0] = Σ_b dlogits[b], written as `mode` says.
void head_backward(const ExecContext& ctx, const float* H, const float* w, const float* dlogits,
                   float* dH, float* dw, float* dc, int64_t B, int F, GradMode mode);

// Binary cross-entropy on logits z with labels y ∈ {0, 1} (any real in [0, 1]
// works), per row: l = max(z, 0) − z·y + log(1 + exp(−|z|)) (no overflow).
// Row b counts with weight w_b = (b < n_valid ? (weights ? weights[b] : 1) : 0):
// rows at and past n_valid are padding; weights (may be null) is a per-row 0/1
// mask (or any non-negative weight).
//
// The mean is over the GLOBAL batch, whose rows are spread over the ranks:
//   *loss = Σ_b w_b · l_b / global_batch   (a double on ctx.device, overwritten)
// is this rank's share — summing *loss over ranks gives the global mean loss;
// with one rank and global_batch = number of valid rows it is the plain mean.
void bce_with_logits_forward(const ExecContext& ctx, const float* logits, const float* labels,
                             const float* weights, double* loss, int64_t B, int64_t n_valid,
                             int64_t global_batch);
// dlogits[b] = w_b · (sigmoid(z_b) − y_b) / global_batch (0 for padding rows),
// overwritten: the gradient of the global mean loss w.r.t. this rank's logits.
void bce_with_logits_backward(const ExecContext& ctx, const float* logits, const float* labels,
                              const float* weights, float* dlogits, int64_t B, int64_t n_valid,
                              int64_t global_batch);

// The top of NeuMF fused: GMF, the logit head and (in training) the loss, for n
// groups of S samples (sample b = p·S + s pairs the group's user row p with item
// row b), without the per-sample copies of the user's row, the GMF array, the
// concatenated head input or the logits' gradient in memory. With
// H[b] = [u_p[:mf] ⊙ i_b[:mf] ; A[b]] (F = mf + last columns; A [n·S × last]
// contiguous, the tower's output):
//   urows [n × ·] stride ldu, irows [n·S × ·] stride ldi: the gathered rows; their
//       first mf columns are the GMF factors.
//   logits[b] = Σ_k H[b, k]·w[k] + c[0], summed as head_forward sums H (the same bits
//       as gmf_forward + concat_cols + head_forward).
// The fused ops take mf and last of at most kNeumfTopMaxWidth (NeuMF takes the
// unfused sequence beyond).
// irow_ids (forward only, may be null): sample b's item row is irows[irow_ids[b], :],
// a table of item rows, instead of irows[b, :] (evaluation, whose candidates are item
// ids, reads the item table's GMF columns without gathering them per sample). The
// ids must be rows of that table; the caller checks them.
constexpr int kNeumfTopMaxWidth = 128;
void neumf_top_forward(const ExecContext& ctx, const float* urows, int64_t ldu, const float* irows,
                       int64_t ldi, const float* A, const float* w, const float* c, float* logits,
                       int64_t n, int S, int mf, int last, const int32_t* irow_ids = nullptr);
// Backward of neumf_top_forward, with the gradient of the logits either
//   given: dlogits [n·S] (loss null; logits and labels not read), or
//   from the loss (loss not null; dlogits null): dlogits =
//       bce_with_logits_backward(logits, labels, no weights,
//       every row valid, global_batch), never stored, and *loss =
//       bce_with_logits_forward's share (a double on ctx.device) over the same rows.
// With dH = dlogits[b]·w (head_backward's), dG = dH[:, :mf], dA = dH[:, mf:]:
//   dA [n·S × last] (contiguous): dA masked by A > 0 when relu (linear_backward's
//       mask of the tower's last Linear: dA is then its dZ), overwritten;
//   durows[p, k] = Σ_s dG[b, k]·i_b[k] (in double, s order: gmf_backward then
//       group_sum_backward), dirows[b, k] = dG[b, k]·u_p[k], for k < mf, overwritten
//       (columns ≥ mf untouched);
//   dw [F], dc [1] = head_backward's sums; db [last] (may be null) = the column sums
//       of the (masked) dA: the tower's last bias gradient. All overwritten.
// Every element written is the same bits as the unfused ops give. The sums (dw,
// dc, db, loss) are fixed-order: on the CPU the unfused ops' own order (the same
// bits); on the GPU groups of kNeumfTopGroups, so within a double sum's rounding
// of the unfused ops'.
void neumf_top_backward(const ExecContext& ctx, const float* urows, int64_t ldu, const float* irows,
                        int64_t ldi, const float* A, const float* w, const float* dlogits,
                        const float* logits, const float* labels, int64_t global_batch,
                        double* loss, float* dA, float* durows, int64_t lddu, float* dirows,
                        int64_t lddi, float* dw, float* dc, float* db, int64_t n, int S, int mf,
                        int last, bool relu);

// ---- evaluation's scoring in one kernel ---------------------------------------------
// NeuMF::score_items on BF16 storage after the users' half of layer 0, as one op:
// gather_bias_act_bf16 (layer 0 from P [R × w0] by ids, U0 [n × w0] the users' half, b0
// its FP32 bias), linear_forward_bf16 with ReLU for each of the L layers above (BF16
// weights and biases), and neumf_top_forward_bf16 reading the items' GMF columns by id
// (irows, row stride ldi) and the users' (urows, ldu): logits [n·S].
// The CPU twin is that sequence of ops. The GPU runs it tile by tile of candidates in
// shared memory, every activation kept on chip, the products on tensor cores (WMMA, BF16
// operands, FP32 accumulators): layer 0's rows, each epilogue (FP32 sum with the BF16
// bias, ReLU, BF16 rounding) and the top are the same expressions as those ops', but a
// product's FP32 sum runs in the tensor cores' order, not cuBLASLt's, so an activation
// may round to the neighbouring BF16 and its logit move by that. The same bits on every
// run. Used by NeuMF with the environment variable NCF_EVAL_FUSED=1 where it fits
// (score_items_fusable).
struct ScoreLayerBf16 {
  const uint16_t* w = nullptr;  // [out × in]
  const uint16_t* b = nullptr;  // [out] (may be null: no bias)
  int in = 0, out = 0;
};
constexpr int kScoreMaxLayers = 4;
// Whether these widths can run fused on ctx's device: 1 to kScoreMaxLayers layers above
// layer 0, chained (in of each the out of the one below, the first's in = w0), every
// width a multiple of 16, mf and the last width in [1, kNeumfTopMaxWidth]; on a GPU also
// a tile's weights and activations within the block's shared memory.
bool score_items_fusable(const ExecContext& ctx, int w0, const ScoreLayerBf16* layers, int L,
                         int mf);
void neumf_score_items_bf16(const ExecContext& ctx, const float* P, int64_t R, const int32_t* ids,
                            const float* U0, const float* b0, int w0, const ScoreLayerBf16* layers,
                            int L, const float* urows, int64_t ldu, const float* irows, int64_t ldi,
                            const float* w, const float* c, float* logits, int64_t n, int S,
                            int mf);

// neumf_top_forward / neumf_top_backward with the tower's output A and its
// gradient dA in BF16: A read as its values; dA = bf16(the masked dH), and db
// the column sums of the stored (rounded) dA. All else as there.
void neumf_top_forward_bf16(const ExecContext& ctx, const float* urows, int64_t ldu,
                            const float* irows, int64_t ldi, const uint16_t* A, const float* w,
                            const float* c, float* logits, int64_t n, int S, int mf, int last,
                            const int32_t* irow_ids = nullptr);
void neumf_top_backward_bf16(const ExecContext& ctx, const float* urows, int64_t ldu,
                             const float* irows, int64_t ldi, const uint16_t* A, const float* w,
                             const float* dlogits, const float* logits, const float* labels,
                             int64_t global_batch, double* loss, uint16_t* dA, float* durows,
                             int64_t lddu, float* dirows, int64_t lddi, float* dw, float* dc,
                             float* db, int64_t n, int S, int mf, int last, bool relu);

#ifdef NCF_WITH_CUDA
// The CUDA twins (ops_top.cu, score_items.cu); called through the dispatch in ops_top.cc only.
namespace cuda {
void gmf_forward(const ExecContext& ctx, const float* urows, int64_t ldu, const float* irows,
                 int64_t ldi, float* gmf, int64_t ldg, int64_t B, int mf);
void gmf_backward(const ExecContext& ctx, const float* urows, int64_t ldu, const float* irows,
                  int64_t ldi, const float* dgmf, int64_t ldg, float* durows, int64_t lddu,
                  float* dirows, int64_t lddi, int64_t B, int mf);
void concat_cols(const ExecContext& ctx, const float* A, int64_t lda, int wa, const float* C,
                 int64_t ldc, int wc, float* Y, int64_t B);
void split_cols(const ExecContext& ctx, const float* dY, int wa, int wc, float* dA, int64_t ldda,
                float* dC, int64_t lddc, int64_t B);
void head_forward(const ExecContext& ctx, const float* H, const float* w, const float* c,
                  float* logits, int64_t B, int F);
void head_backward(const ExecContext& ctx, const float* H, const float* w, const float* dlogits,
                   float* dH, float* dw, float* dc, int64_t B, int F, GradMode mode);
void bce_with_logits_forward(const ExecContext& ctx, const float* logits, const float* labels,
                             const float* weights, double* loss, int64_t B, int64_t n_valid,
                             int64_t global_batch);
void bce_with_logits_backward(const ExecContext& ctx, const float* logits, const float* labels,
                              const float* weights, float* dlogits, int64_t B, int64_t n_valid,
                              int64_t global_batch);
void neumf_top_forward(const ExecContext& ctx, const float* urows, int64_t ldu, const float* irows,
                       int64_t ldi, const float* A, const float* w, const float* c, float* logits,
                       int64_t n, int S, int mf, int last, const int32_t* irow_ids);
void neumf_top_backward(const ExecContext& ctx, const float* urows, int64_t ldu, const float* irows,
                        int64_t ldi, const float* A, const float* w, const float* dlogits,
                        const float* logits, const float* labels, int64_t global_batch,
                        double* loss, float* dA, float* durows, int64_t lddu, float* dirows,
                        int64_t lddi, float* dw, float* dc, float* db, int64_t n, int S, int mf,
                        int last, bool relu);
// The shared memory a block needs for these widths (0: they do not fit the device).
int score_items_smem_bytes(const ExecContext& ctx, int w0, const ScoreLayerBf16* layers, int L);
void neumf_score_items_bf16(const ExecContext& ctx, const float* P, const int32_t* ids,
                            const float* U0, const float* b0, int w0, const ScoreLayerBf16* layers,
                            int L, const float* urows, int64_t ldu, const float* irows, int64_t ldi,
                            const float* w, const float* c, float* logits, int64_t n, int S,
                            int mf);
void neumf_top_forward_bf16(const ExecContext& ctx, const float* urows, int64_t ldu,
                            const float* irows, int64_t ldi, const uint16_t* A, const float* w,
                            const float* c, float* logits, int64_t n, int S, int mf, int last,
                            const int32_t* irow_ids);
void neumf_top_backward_bf16(const ExecContext& ctx, const float* urows, int64_t ldu,
                             const float* irows, int64_t ldi, const uint16_t* A, const float* w,
                             const float* dlogits, const float* logits, const float* labels,
                             int64_t global_batch, double* loss, uint16_t* dA, float* durows,
                             int64_t lddu, float* dirows, int64_t lddi, float* dw, float* dc,
                             float* db, int64_t n, int S, int mf, int last, bool relu);
}  // namespace cuda
#endif

}  // namespace ncf
