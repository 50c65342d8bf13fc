// Dense NeuMF math on row-major float arrays: GEMM, Linear(+ReLU), the GMF
// product, column concat/split, the logit head and BCE-with-logits. Each op is a
// free function (ctx, arrays…, dims…, flags) that checks its shapes and
// dispatches once on ctx.device: the CPU code is in ops_<family>.cc, the CUDA twin
// (same name and arguments) in ops_<family>.cu. Arrays live on ctx.device.
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

// The ops by family, each a header with its CPU code (.cc) and CUDA twins (.cu) named
// alike; callers include this header.
#include "model/ops_elementwise.h"  // fill, BF16 conversions, hi / lo splits
#include "model/ops_gemm.h"         // gemm, Linear forward / backward (cuBLAS, cuBLASLt)
#include "model/ops_groups.h"       // layer 0's groups, its ReLU bit mask, gather_bias_act
#include "model/ops_modes.h"        // GradMode, MathMode, the test hooks
#include "model/ops_runs.h"         // layer 0 by item: the batch's runs of equal items
#include "model/ops_top.h"          // GMF, head, loss, the fused top, evaluation's scoring

// ---- --precision bf16 with BF16 storage -----------------------------------------
// NeuMF under MathMode::kBf16 (with the fused top and at least one hidden layer)
// keeps the tower's activations and their gradients in BF16: arrays typed
// uint16_t hold BF16 bits (common/bf16.h). The GEMMs read them as they are (no
// per-GEMM operand copies) and write BF16 outputs rounded once, nearest-even,
// after their epilogue; every sum (products, biases, bias gradients) is taken in
// FP32 or double. Weights are passed as a BF16 copy of the FP32 master weights
// (to_bf16_rows once per step); embedding rows, their gradients, U0 = the users'
// half of layer 0, weight and bias gradients stay FP32.
