// Dense NeuMF math on row-major float arrays: GEMM, Linear(+ReLU), the GMF
// product, column concat/split, the logit head and BCE-with-logits. Each op is a
// free function (ctx, arrays…, dims…, flags) that checks its shapes and
// dispatches once on ctx.device: the CPU code is in ops.cc, the CUDA twin (same
// name and arguments) in ops.cu. Arrays live on ctx.device.
//
// Letters: B rows of the batch, D embedding width (mf_dim + layers[0]/2),
// in/out layer widths, F head input width (mf_dim + layers.back()).
// Strides ("ld…") count floats between consecutive rows.
//
// Determinism: every result is the same for any ctx.threads (also in MathMode
// kBf16: rounding to BF16 is element-wise). Sums over the batch
// (weight and bias gradients, the loss) are taken in a fixed order: BLAS GEMM
// for weight gradients (OpenBLAS single-threaded on fixed slices of the batch
// that the thread pool shares out, their partial products summed in slice
// order), and fixed row blocks (parallel.h, block_sums) for biases, the head
// and the loss.
#pragma once

#include <cstdint>
#include <string>

#include "common/device.h"

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
//         *_bf16 ops below ("BF16 storage"), which make no per-GEMM copies.
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
//         gmf_*, concat/split_cols, head_*, bce_*), kept selectable to be
//         measured beside the streaming ones in one binary.
// Both compute the same values: every element the same bits; the sums the same
// bits on the CPU, and on the GPU the same bits except the fused top's (dw, dc,
// the last bias gradient, the loss: another fixed order, within a double sum's
// rounding). ncf_dist takes it from the environment variable NCF_STEP_KERNELS.
enum class StepKernels { kStreaming, kLegacy };
void set_step_kernels(StepKernels kernels);
StepKernels step_kernels();
// "streaming" | "legacy" → StepKernels; anything else throws ncf::Error naming
// `what` (where the value came from) and the value.
StepKernels parse_step_kernels(const std::string& name, const std::string& what);
const char* step_kernels_name(StepKernels kernels);

// GPU linear_forward_bf16 as one cuBLASLt matmul whose epilogue writes the BF16
// activations (true, the default) or, with the environment variable
// NCF_LT_BF16_OUT=0, as the FP32 product and the epilogue kernel (the path it
// replaced, on the same BF16 bias), kept selectable to be measured beside it. Read at the
// first call; the setter (tests) overrides it.
bool lt_bf16_out_enabled();
void set_lt_bf16_out(bool on);

// Three GPU kernels that ran 2 blocks per SM on an H200, capped at 80 registers so that 3
// blocks share an SM (true, the default), or, with the environment variable
// NCF_3BLOCK_KERNELS=0, as they were (kept selectable to be measured beside them):
// neumf_top_backward on BF16 storage with mf and the last layer in (32, 64] (4 rows in
// flight per warp instead of 8), run_sums on FP32 rows four columns per thread (12 rows
// instead of 16) and group_sum_backward_bf16 by the ReLU bit mask eight columns per
// thread (the same code). The same loads and sums in the same order either way: the
// same bits. The environment is read at the first call; the setter (tests) overrides it.
bool three_block_kernels();
void set_three_block_kernels(bool on);

// run_sums and run_sums_bf16 on rows of a multiple of 128 columns with a warp's 32 threads
// on one run, its indices loaded 32 at a time, a chunk ahead, and shuffled to the threads
// (true, the default), or, with the environment variable NCF_RUN_SUMS_WARP=0, each thread
// loading its indices before its rows, as before (kept selectable to be timed beside it).
// The same rows added in the same order: the same bits. Read at the first call; the setter
// (tests) overrides it.
bool run_sums_by_warp();
void set_run_sums_by_warp(bool on);

// scatter_run_rows on rows of four-column quads with four samples per thread, their
// indices and rows loaded together before their stores (true, the default), or, with the
// environment variable NCF_SCATTER_BY_FOUR=0, one sample per thread as before (kept
// selectable to be timed beside it). The same bits. Read at the first call; the setter
// (tests) overrides it.
bool scatter_rows_by_four();
void set_scatter_rows_by_four(bool on);

// x[0..n) = value.
void fill(const ExecContext& ctx, float* x, int64_t n, float value);

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
//   dX  [B×in]  dL/dX, always overwritten; null skips it. With dx_mask (the ReLU bit
//       mask of the layer below's output X, relu_mask_words(in) words per row), dX is
//       that layer's masked gradient dL/dZ instead: zero where the bit is 0 (on the
//       GPU in the product's cuBLASLt epilogue where cuBLASLt offers one).
//   dweight  [out×in], db [out] (db null when the layer has no bias): written as `mode` says.
// dweight = dZ^T·X (GEMM), db = column sums of dZ (block_sums: fixed row blocks).
void linear_backward(const ExecContext& ctx, const float* X, const float* weight, const float* Y,
                     float* dY, float* dX, float* dweight, float* db, int64_t B, int in, int out,
                     bool relu, GradMode mode, const uint32_t* dx_mask = nullptr);

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

// ---- --precision bf16 with BF16 storage -----------------------------------------
// NeuMF under MathMode::kBf16 (with the fused top and at least one hidden layer)
// keeps the tower's activations and their gradients in BF16: arrays typed
// uint16_t hold BF16 bits (common/bf16.h). The GEMMs read them as they are (no
// per-GEMM operand copies) and write BF16 outputs rounded once, nearest-even,
// after their epilogue; every sum (products, biases, bias gradients) is taken in
// FP32 or double. Weights are passed as a BF16 copy of the FP32 master weights
// (to_bf16_rows once per step); embedding rows, their gradients, U0 = the users'
// half of layer 0, weight and bias gradients stay FP32.

// Y[b, :w] (row stride ldy) = X[b, :w] (row stride ldx) rounded to BF16, b < B.
void to_bf16_rows(const ExecContext& ctx, const float* X, int64_t ldx, int w, uint16_t* Y,
                  int64_t ldy, int64_t B);
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

// ---- layer 0 by item in training --------------------------------------------------
// A batch's samples grouped by item, so that layer 0's items' half is taken once per
// distinct item of the batch (NeuMF, "layer 0 by item"), and its gradient summed per
// item before the weight gradient's product.
//
// item_runs: ids [B] (each in [0, bound); the CPU twin checks them, naming the position
// and the id) → order [B], the samples sorted by id, equal ids in sample order (a stable
// sort); R >= the distinct ids (min(B, bound) always is) runs, the u-th distinct id in
// increasing order owning order[starts[u] .. starts[u + 1]); starts [R + 1], runs past
// the last distinct id empty (starts = B); inv [B], the run of each sample; first [R],
// the first sample of each run (order[starts[u]]), -1 for an empty run. The same arrays
// on both devices; the GPU sorts with CUB's radix sort and waits for nothing.
void item_runs(const ExecContext& ctx, const int32_t* ids, int64_t B, int64_t bound, int64_t R,
               int32_t* order, int32_t* starts, int32_t* inv, int32_t* first);
// Y[u, :w] = X[first[u], :w] (row stride ldx), or zeros where first[u] < 0, u < R: the
// runs' rows, one per distinct item (Y contiguous, [R × w]). With ids (the samples' item
// ids, [B]), X is the item table instead, read at row ids[first[u]]: the same values as
// from the samples' rows gathered from it.
void gather_run_rows(const ExecContext& ctx, const float* X, int64_t ldx, int w,
                     const int32_t* first, int64_t R, float* Y, const int32_t* ids = nullptr);
// dP[u, :] = Σ dZ[order[k], :] over k in [starts[u], starts[u + 1]), added in k order in
// double and stored as FP32 (zeros for an empty run), u < R; dZ [B × out]. The per-item
// sum of layer 0's gradient. run_sums_bf16 reads dZ in BF16.
void run_sums(const ExecContext& ctx, const float* dZ, const int32_t* order, const int32_t* starts,
              int64_t R, int out, float* dP);
void run_sums_bf16(const ExecContext& ctx, const uint16_t* dZ, const int32_t* order,
                   const int32_t* starts, int64_t R, int out, float* dP);
// The runs' rows back onto the samples: Y[b, :w] (row stride ldy) = Σ_p Yr[p·R + inv[b], :w]
// (the parts' rows added in p order, in FP32) where b is its run's first sample
// (first[inv[b]] == b), zeros for the run's other samples, b < B; Yr [parts·R × w]. A run's
// gradient put on one of its samples: each item's sum over its samples is the run's row.
void scatter_run_rows(const ExecContext& ctx, const float* Yr, int64_t R, int parts, int w,
                      const int32_t* inv, const int32_t* first, int64_t B, float* Y, int64_t ldy);
// The runs' rows by item instead: Y[ids[first[u]], :w] (row stride ldy) = Σ_p Yr[p·R + u, :w]
// (added in p order, in FP32: the row scatter_run_rows puts on the run's first sample) for
// every run with a sample (first[u] >= 0); Y's other rows are left as they were. ids: the
// samples' item ids [B], each below Y's rows (the CPU twin checks them).
void put_run_rows(const ExecContext& ctx, const float* Yr, int64_t R, int parts, int w,
                  const int32_t* ids, const int32_t* first, int64_t bound, float* Y, int64_t ldy);
// X [n] FP32 as two BF16 parts: hi[i] = bf16(X[i]), lo[i] = bf16(X[i] − hi[i]) (the difference
// is exact in FP32), so hi + lo keeps about 16 significant bits where one BF16 keeps 8: a BF16
// product over [hi ; lo] rows against the same rows twice takes X to that precision.
void split_bf16(const ExecContext& ctx, const float* X, int64_t n, uint16_t* hi, uint16_t* lo);
// The same for a TF32 product: hi[i] = X[i] rounded to TF32's 10 mantissa bits (nearest,
// ties to even; NaN, infinities and a value that would round past FLT_MAX kept or
// truncated), lo[i] = X[i] − hi[i], exact in FP32, so that hi + lo = X and a TF32 product
// over [hi ; lo] sees X to about 21 bits.
void split_tf32(const ExecContext& ctx, const float* X, int64_t n, float* hi, float* lo);
// linear_backward on BF16 (GradMode kOverwrite): dY masked in place by Y > 0 when
// relu; db (may be null) = column sums of the masked dY, in double over fixed
// blocks; dX (may be null) = bf16(dZ · weight); dweight = dZ^T · X in FP32.
// (On the GPU cuBLAS rounds dX to nearest rather than float_to_bf16_bits: the same
// rounding of an FP32 value.)
void linear_backward_bf16(const ExecContext& ctx, const uint16_t* X, const uint16_t* weight,
                          const uint16_t* Y, uint16_t* dY, uint16_t* dX, float* dweight, float* db,
                          int64_t B, int in, int out, bool relu);
// group_sum_backward on BF16 Y and dY: dY masked in place when relu (by Y, or by
// its bit mask when given); dYg [n × out] (stride lddyg) and db FP32, summed in double
// as group_sum_backward sums.
void group_sum_backward_bf16(const ExecContext& ctx, const uint16_t* Y, uint16_t* dY, int64_t n,
                             int S, int out, float* dYg, int64_t lddyg, float* db, bool relu,
                             const uint32_t* mask = nullptr);
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
// The CUDA twins (ops.cu); called through the dispatch in ops.cc only.
namespace cuda {
void fill(const ExecContext& ctx, float* x, int64_t n, float value);
void gemm(const ExecContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
          const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc);
void linear_forward(const ExecContext& ctx, const float* X, const float* weight, const float* bias,
                    float* Y, int64_t B, int in, int out, bool relu);
void linear_backward(const ExecContext& ctx, const float* X, const float* weight, const float* Y,
                     float* dY, float* dX, float* dweight, float* db, int64_t B, int in, int out,
                     bool relu, GradMode mode, const uint32_t* dx_mask);
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
void neumf_top_forward(const ExecContext& ctx, const float* urows, int64_t ldu, const float* irows,
                       int64_t ldi, const float* A, const float* w, const float* c, float* logits,
                       int64_t n, int S, int mf, int last, const int32_t* irow_ids);
void neumf_top_backward(const ExecContext& ctx, const float* urows, int64_t ldu, const float* irows,
                        int64_t ldi, const float* A, const float* w, const float* dlogits,
                        const float* logits, const float* labels, int64_t global_batch,
                        double* loss, float* dA, float* durows, int64_t lddu, float* dirows,
                        int64_t lddi, float* dw, float* dc, float* db, int64_t n, int S, int mf,
                        int last, bool relu);
void to_bf16_rows(const ExecContext& ctx, const float* X, int64_t ldx, int w, uint16_t* Y,
                  int64_t ldy, int64_t B);
void gemm_bf16(const ExecContext& ctx, bool trans_a, bool trans_b, int M, int N, int K,
               const uint16_t* A, int lda, const uint16_t* B, int ldb, float* C, int ldc);
void linear_forward_bf16(const ExecContext& ctx, const uint16_t* X, const uint16_t* weight,
                         const uint16_t* bias, uint16_t* Y, int64_t B, int in, int out, bool relu);
void group_linear_forward_bf16(const ExecContext& ctx, const uint16_t* X, int64_t ldx,
                               const uint16_t* weight, int64_t ldw, const float* Yg,
                               const float* bias, uint16_t* Y, int64_t n, int S, int in, int out,
                               bool relu, uint32_t* mask);
void linear_backward_bf16(const ExecContext& ctx, const uint16_t* X, const uint16_t* weight,
                          const uint16_t* Y, uint16_t* dY, uint16_t* dX, float* dweight, float* db,
                          int64_t B, int in, int out, bool relu);
void group_sum_backward_bf16(const ExecContext& ctx, const uint16_t* Y, uint16_t* dY, int64_t n,
                             int S, int out, float* dYg, int64_t lddyg, float* db, bool relu,
                             const uint32_t* mask);
void gather_bias_act(const ExecContext& ctx, const float* P, int64_t R, const int32_t* ids,
                     const float* Yg, const float* bias, float* Y, int64_t n, int S, int out,
                     bool relu, uint32_t* mask);
void gather_bias_act_bf16(const ExecContext& ctx, const float* P, int64_t R, const int32_t* ids,
                          const float* Yg, const float* bias, uint16_t* Y, int64_t n, int S,
                          int out, bool relu, uint32_t* mask);
void item_runs(const ExecContext& ctx, const int32_t* ids, int64_t B, int64_t bound, int64_t R,
               int32_t* order, int32_t* starts, int32_t* inv, int32_t* first);
// The shared memory a block needs for these widths (0: they do not fit the device).
int score_items_smem_bytes(const ExecContext& ctx, int w0, const ScoreLayerBf16* layers, int L);
void neumf_score_items_bf16(const ExecContext& ctx, const float* P, const int32_t* ids,
                            const float* U0, const float* b0, int w0, const ScoreLayerBf16* layers,
                            int L, const float* urows, int64_t ldu, const float* irows, int64_t ldi,
                            const float* w, const float* c, float* logits, int64_t n, int S,
                            int mf);
void gather_run_rows(const ExecContext& ctx, const float* X, int64_t ldx, int w,
                     const int32_t* first, int64_t R, float* Y, const int32_t* ids);
void run_sums(const ExecContext& ctx, const float* dZ, const int32_t* order, const int32_t* starts,
              int64_t R, int out, float* dP);
void run_sums_bf16(const ExecContext& ctx, const uint16_t* dZ, const int32_t* order,
                   const int32_t* starts, int64_t R, int out, float* dP);
void scatter_run_rows(const ExecContext& ctx, const float* Yr, int64_t R, int parts, int w,
                      const int32_t* inv, const int32_t* first, int64_t B, float* Y, int64_t ldy);
void put_run_rows(const ExecContext& ctx, const float* Yr, int64_t R, int parts, int w,
                  const int32_t* ids, const int32_t* first, int64_t bound, float* Y, int64_t ldy);
void split_bf16(const ExecContext& ctx, const float* X, int64_t n, uint16_t* hi, uint16_t* lo);
void split_tf32(const ExecContext& ctx, const float* X, int64_t n, float* hi, float* lo);
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
