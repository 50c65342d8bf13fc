#!/usr/bin/env python3
"""The byte/FLOP floor of one training step of NeuMF on one GPU, and how far a measured
step is above it.

The step is the list of kernels ncf_dist runs (src/train/step.cc, src/model/neumf.cc,
src/model/ops.cu), each at its ideal: it moves the bytes it must read and write once and
does its FLOPs, and takes max(bytes / HBM bandwidth, FLOPs / tensor peak). The bytes and
FLOPs come from the shapes:

  B samples a step in n = B / S groups of S = 1 + num_neg samples of one user; U users,
  I items; R = min(B, I) rows of layer 0 by item (neumf.h: P takes one row per item id
  below min(B, bound), the ids missing from the batch giving empty runs; at ml-20m every
  item shows up in a batch anyway: 838,860 uniform negatives over 26,744 items);
  D = mf + h embedding columns (GMF part mf, MLP part h = layers[0] / 2); the tower's
  widths o0, o1, o2 (layers[1:]); a = 4 activation bytes under tf32, 2 under bf16;
  embedding rows, their gradients, U0, P and the master weights FP32 (4 bytes); ReLU
  masks 1 bit per activation; ids int32.

Layer 0 (--layer0):
  by_item    what ncf_dist runs on a GPU (--layer0_by_item auto): layer 0's user half once
             per group (U0), its item half once per item id (P = X_items W0i^T on R rows
             read from the item table), each sample's pre-activation from P[item] + U0[group]
             + b0 (gather_bias_act); backward: dZ0 summed per item (run_sums_warp), split
             into two parts (split_bf16 / split_tf32) against the runs' rows twice for
             dW0's item half and for the items' MLP gradient, which goes to an [I x h]
             buffer by item id (put_run_rows; with --item_lookup whole, onto each run's
             first sample of a [B x h] array instead: scatter_run_rows_many). The samples'
             item rows hold only their GMF columns (the narrow item lookup), and the
             update takes the items' MLP gradient columns from the buffer (GivenColumns).
  by_sample  the path it replaced (--layer0_by_item off): whole item rows per sample, layer 0's
             item half as a [B x h] x [h x o0] GEMM, its two backward GEMMs per sample.
  both       (the default) prints the by-item floor and the per-sample one beside it.

Common to both: the user rows once per group; layers 1 and 2 as GEMMs with bias + ReLU +
mask epilogues (their backward: dgrad with the layer below's mask, wgrad + bias sums);
the fused top (neumf_top_forward / neumf_top_backward: GMF, head, BCE and their
gradients); dU0 = group sums of dZ0; dW0's user half and the user rows' MLP gradient;
the embedding update (sort of the ids, reduce of the gradient rows by id, dense Adam
over every row of both tables: update_all_rows); negative sampling as its measured time
on an H200 (0.14 ms; not a bandwidth floor). Not counted: the tower's dense Adam (0.1 M
parameters), launches, and the dtype conversions a real kernel may need.

  step_floor.py [--gpu NAME] [--batch B] [--precision tf32|bf16] [--measured_ms MS]
                [--users U] [--items I] [--num_neg N] [--layer0 both|by_item|by_sample]
                [--item_lookup narrow|whole] [--table] [--self_check]

Defaults: the ml-20m-mlperf preset (factors 64, layers 256-256-128-64, 4 negatives) on
ml-20m's sizes (U 138,493, I 26,744) at B = 1,048,575. --gpu takes a name as nvidia-smi
prints it (H100 or H200 in it; default H200). --table lists every kernel: bytes read and
written, GFLOP and its floor in µs. --self_check tests the model against a hand-worked
kernel and the two floors' order at ml-20m's shape.
"""
import argparse
import sys

SAMPLING_MS = 0.140  # measured on an H200, not a bandwidth floor
B_REF = 1048575

# HBM bandwidth (TB/s) and dense tensor peak (TFLOP/s: TF32, BF16) of the SXM parts.
GPUS = {
    "H200": (4.8, 494.0, 989.0),
    "H100": (3.35, 495.0, 989.0),
}


def gpu_of(name):
    for key in GPUS:
        if key in name.upper():
            return key
    sys.exit(f"step_floor: no figures for GPU '{name}' (known: {', '.join(GPUS)})")


def kernels(B, U, I, precision, layer0="by_item", item_lookup="narrow", num_neg=4, mf=64,
            layers=(256, 256, 128, 64)):
    """[(name, bytes read, bytes written, FLOPs)] of one step, in order."""
    S = 1 + num_neg
    n = B // S  # groups: one user row each
    h = layers[0] // 2
    D = mf + h
    o0, o1, o2 = layers[1], layers[2], layers[3]
    a = 2 if precision == "bf16" else 4
    R = min(B, I)
    nu = min(n, U)  # distinct users a step can hold
    by_item = layer0 == "by_item"
    narrow = by_item and item_lookup == "narrow"
    wi = mf if narrow else D  # item columns looked up (and reduced) per sample
    K = []

    def k(name, read, written, flops=0):
        K.append((name, int(read), int(written), int(flops)))

    # ---- forward
    # the group's user row: read its id and the table row, write the row
    k("user rows, one per group (gather_rows)", n * 4 + n * D * 4, n * D * 4)
    # each sample's item row: GMF columns only (narrow lookup) or the whole row
    k(f"item rows per sample, {wi} columns (gather_rows)", B * 4 + B * wi * 4, B * wi * 4)
    if by_item:
        # item_runs: radix sort of B (id, sample) int32 pairs in two 8-bit passes (ids
        # < 65,536), each reading and writing both arrays; run heads, scan and run index
        # read the sorted ids three times; write inv [B], starts [R + 1], first [R]
        k("item runs (sort, run index)", 2 * B * 8 + 3 * B * 4, 2 * B * 8 + B * 4 + R * 8 + 4)
        # gather_run_rows: each run's MLP columns from the item table by id (first[], ids[]),
        # written twice ([X ; X], the backward's two-part product) at FP32
        k("runs' MLP rows from the item table (gather_run_rows)", R * 8 + R * h * 4,
          2 * R * h * 4)
    # U0 = user MLP columns x W0u^T: read the n rows and W0u, write U0 [n x o0] FP32
    k("U0 = user MLP rows x W0u^T, one per group", n * h * a + o0 * h * a, n * o0 * 4,
      2 * n * h * o0)
    if by_item:
        # P = runs' rows x W0i^T: read R rows and W0i, write P [R x o0] FP32
        k("P = item runs' MLP rows x W0i^T, one per item", R * h * a + o0 * h * a,
          R * o0 * 4, 2 * R * h * o0)
        # gather_bias_act: Z0[b] = P[id b] + U0[group b] + b0, ReLU, mask: read the ids,
        # P and U0 once each (P and a group's U0 row stay in L2 across their readers),
        # the bias; write the activations and the mask bits
        k("layer 0 output by item: P[id] + U0 + b0, ReLU, mask (gather_bias_act)",
          B * 4 + R * o0 * 4 + n * o0 * 4 + o0 * 4, B * o0 * a + B * o0 // 8)
    else:
        # the items' half per sample: read the samples' MLP columns, U0 and W0i; write
        # the activations and mask bits
        k("layer 0: item GEMM per sample + U0 + b0, ReLU, mask",
          B * h * a + n * o0 * 4 + o0 * h * a, B * o0 * a + B * o0 // 8, 2 * B * h * o0)
    # layers 1 and 2: read X and W, write Y and its mask bits
    k("layer 1 forward (GEMM, bias + ReLU + mask epilogue)", B * o0 * a + o1 * o0 * a,
      B * o1 * a + B * o1 // 8, 2 * B * o0 * o1)
    k("layer 2 forward (GEMM, bias + ReLU + mask epilogue)", B * o1 * a + o2 * o1 * a,
      B * o2 * a + B * o2 // 8, 2 * B * o1 * o2)
    # neumf_top_forward: GMF = user row (per group) x item row, head over [GMF ; layer 2],
    # BCE: read the GMF columns and layer 2's output, write dlogit per sample
    k("fused top forward: GMF, head, BCE (neumf_top_forward)",
      n * mf * 4 + B * mf * 4 + B * o2 * a, B * 4, B * (3 * mf + 2 * o2 + 8))
    # ---- backward
    # neumf_top_backward: read dlogit, the GMF columns, layer 2's output and mask; write
    # dZ2, the items' GMF gradient per sample and the users' per group
    k("fused top backward (neumf_top_backward)",
      B * 4 + n * mf * 4 + B * mf * 4 + B * o2 * a + B * o2 // 8,
      B * o2 * a + B * mf * 4 + n * mf * 4, B * (4 * mf + 4 * o2))
    # dgrad: read dY and W and the layer below's mask, write dX; wgrad: read dY and X
    k("layer 2 dgrad + layer 1's dReLU", B * o2 * a + o2 * o1 * a + B * o1 // 8, B * o1 * a,
      2 * B * o2 * o1)
    k("layer 2 wgrad + bias sums", B * o2 * a + B * o1 * a, o2 * o1 * 4 + o2 * 4,
      2 * B * o2 * o1)
    k("layer 1 dgrad + layer 0's dReLU", B * o1 * a + o1 * o0 * a + B * o0 // 8, B * o0 * a,
      2 * B * o1 * o0)
    k("layer 1 wgrad + bias sums", B * o1 * a + B * o0 * a, o1 * o0 * 4 + o1 * 4,
      2 * B * o1 * o0)
    # group sums: read dZ0, write dU0 [n x o0] and b0's gradient
    k("dU0 = group sums of dZ0 (+ b0's gradient)", B * o0 * a, n * o0 * 4 + o0 * 4)
    if by_item:
        # run_sums_warp: dZ0's rows in sorted order (order[], starts[]), summed per run
        k("dP = dZ0 summed per item (run_sums_warp)", B * o0 * a + B * 4 + R * 4,
          R * o0 * 4)
        # split: dP into two parts of the product's input type
        k("dP into two parts (split_bf16 / split_tf32)", R * o0 * 4, 2 * R * o0 * a)
        # dW0i = [dP_hi ; dP_lo]^T [X ; X]: K = 2R
        k("dW0 item half = [dP_hi ; dP_lo]^T [X ; X]", 2 * R * o0 * a + 2 * R * h * a,
          o0 * h * 4, 2 * (2 * R) * o0 * h)
        # [dP_hi ; dP_lo] W0i: the runs' MLP gradient in two parts [2R x h]
        k("item runs' MLP gradient = [dP_hi ; dP_lo] W0i", 2 * R * o0 * a + o0 * h * a,
          2 * R * h * 4, 2 * (2 * R) * o0 * h)
        if narrow:
            # put_run_rows: the two parts added, by item id into [I x h]: read both parts,
            # first[] and the ids; write R rows
            k("item MLP gradient by id (put_run_rows)", 2 * R * h * 4 + R * 8, R * h * 4)
        else:
            # scatter_run_rows_many: onto each run's first sample of [B x h] (zeros on the
            # others: every row stored): read both parts, inv[] and first[]
            k("item MLP gradient onto samples (scatter_run_rows_many)",
              2 * R * h * 4 + B * 4 + R * 4, B * h * 4)
    else:
        # per sample: dW0i = dZ0^T X_items, and the items' MLP gradient dZ0 W0i
        k("dW0 item half per sample", B * o0 * a + B * h * a, o0 * h * 4, 2 * B * o0 * h)
        k("item MLP gradient per sample", B * o0 * a + o0 * h * a, B * h * 4,
          2 * B * o0 * h)
    # dW0u = dU0^T X_users and the user rows' MLP gradient dU0 W0u
    k("dW0 user half and user MLP gradient", 2 * n * o0 * 4 + n * h * a + o0 * h * a,
      o0 * h * 4 + n * h * 4, 4 * n * o0 * h)
    # ---- embedding update
    # sort the samples' item ids and the groups' user ids (two passes of (id, index))
    k("update: sort of the ids", 2 * (B + n) * 8, 2 * (B + n) * 8)
    # reduce by id: read every gradient row (items: wi columns per sample; users: D per
    # group) and the sorted indices; write one row per distinct id
    k("update: gradient rows reduced by id", B * wi * 4 + n * D * 4 + (B + n) * 4,
      R * wi * 4 + nu * D * 4)
    # update_all_rows: dense Adam over every row of both tables: read w, m, v and the
    # reduced gradient where the row has one (plus the items' given MLP columns), write
    # w, m, v
    k("update: dense Adam over all rows (update_all_rows)",
      (U + I) * D * 12 + R * wi * 4 + nu * D * 4 + (R * h * 4 if narrow else 0),
      (U + I) * D * 12)
    return K


def floor_ms(gpu, precision, K):
    bw, tf32, bf16 = GPUS[gpu]
    peak = bf16 if precision == "bf16" else tf32
    return SAMPLING_MS + sum(kernel_ms(bw, peak, r + w, f) for _, r, w, f in K)


def kernel_ms(bw, peak, nbytes, flops):
    return max(nbytes / (bw * 1e12), flops / (peak * 1e12)) * 1e3


def print_table(gpu, precision, K, title):
    bw, tf32, bf16 = GPUS[gpu]
    peak = bf16 if precision == "bf16" else tf32
    print(f"# {title}")
    print(f"{'kernel':<72} {'bytes read':>13} {'written':>13} {'GFLOP':>8} {'floor us':>9}")
    for name, r, w, f in K:
        print(f"{name:<72} {r:13d} {w:13d} {f / 1e9:8.2f} "
              f"{kernel_ms(bw, peak, r + w, f) * 1e3:9.1f}")
    print(f"{'negative sampling (measured, not a floor)':<72} {'':>13} {'':>13} {'':>8} "
          f"{SAMPLING_MS * 1e3:9.1f}")
    tr, tw, tf = (sum(x[i] for x in K) for i in (1, 2, 3))
    print(f"{'total':<72} {tr:13d} {tw:13d} {tf / 1e9:8.2f} "
          f"{floor_ms(gpu, precision, K) * 1e3:9.1f}")


def self_check():
    # Hand-worked: gather_bias_act at B = 1000 (n = 200 groups of 5), I = 50 (R = 50),
    # o0 = 256, bf16: reads ids 1000 x 4 = 4,000, P 50 x 256 x 4 = 51,200, U0 200 x 256 x
    # 4 = 204,800, b0 256 x 4 = 1,024: 261,024 bytes; writes 1000 x 256 x 2 = 512,000
    # activation bytes and 1000 x 256 / 8 = 32,000 mask bytes: 544,000.
    K = kernels(1000, 100, 50, "bf16")
    row = [x for x in K if x[0].startswith("layer 0 output by item")]
    assert len(row) == 1 and row[0][1:] == (261024, 544000, 0), row
    # At ml-20m's shape the by-item step moves fewer bytes and FLOPs than the per-sample
    # one, so its floor is lower, under either precision.
    for p in ("tf32", "bf16"):
        f_item = floor_ms("H200", p, kernels(B_REF, 138493, 26744, p, "by_item"))
        f_sample = floor_ms("H200", p, kernels(B_REF, 138493, 26744, p, "by_sample"))
        assert f_item < f_sample, (p, f_item, f_sample)
        # where items outnumber samples, R = B rows: the by-item path costs more
        f_item_big = floor_ms("H200", p, kernels(4096, 100, 10 ** 6, p, "by_item"))
        f_sample_big = floor_ms("H200", p, kernels(4096, 100, 10 ** 6, p, "by_sample"))
        assert f_item_big > f_sample_big, (p, f_item_big, f_sample_big)
        print(f"step_floor: {p}: by item {f_item:.3f} ms < per sample {f_sample:.3f} ms at "
              "ml-20m's shape")
    print("step_floor: self check passed (gather_bias_act's bytes as worked by hand; the "
          "by-item floor under the per-sample one at ml-20m, above it where I > B)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="H200")
    ap.add_argument("--batch", type=int, default=B_REF)
    ap.add_argument("--precision", choices=["tf32", "bf16"], default="tf32")
    ap.add_argument("--measured_ms", type=float)
    ap.add_argument("--users", type=int, default=138493, help="U, rows of the user table")
    ap.add_argument("--items", type=int, default=26744, help="I, rows of the item table")
    ap.add_argument("--num_neg", type=int, default=4)
    ap.add_argument("--layer0", choices=["both", "by_item", "by_sample"], default="both")
    ap.add_argument("--item_lookup", choices=["narrow", "whole"], default="narrow",
                    help="by item: the samples' item rows with their GMF columns only "
                    "(ncf_dist's default) or whole (NCF_NARROW_ITEM_LOOKUP=0)")
    ap.add_argument("--table", action="store_true", help="list every kernel's bytes and FLOPs")
    ap.add_argument("--self_check", action="store_true")
    a = ap.parse_args()
    if a.self_check:
        return self_check()
    if a.batch < 1 + a.num_neg:
        ap.error(f"--batch {a.batch}: must be at least 1 + num_neg")
    if a.users < 1 or a.items < 1:
        ap.error("--users and --items must be positive")
    if a.measured_ms is not None and a.measured_ms <= 0:
        ap.error(f"--measured_ms {a.measured_ms}: must be positive")
    gpu = gpu_of(a.gpu)
    modes = ["by_item", "by_sample"] if a.layer0 == "both" else [a.layer0]
    ms = {}
    for m in modes:
        K = kernels(a.batch, a.users, a.items, a.precision, m, a.item_lookup, a.num_neg)
        ms[m] = floor_ms(gpu, a.precision, K)
        if a.table:
            print_table(gpu, a.precision, K, f"{m}: {gpu}, {a.precision}, batch {a.batch}, "
                        f"U {a.users}, I {a.items}")
    first = modes[0]
    label = "layer 0 by item" if first == "by_item" else "layer 0 per sample"
    line = (f"floor {ms[first]:.2f} ms/step = {a.batch / ms[first] * 1e3 / 1e6:.0f} M samples/s "
            f"({gpu}, {a.precision}, batch {a.batch}, {label}")
    if len(modes) == 2:
        line += f"; per sample {ms['by_sample']:.2f} ms"
    line += ")"
    if a.measured_ms is not None:
        line += (f"; measured {a.measured_ms:.2f} ms runs at "
                 f"{ms[first] / a.measured_ms * 100:.0f}% of the floor's speed")
        if len(modes) == 2:
            line += f" ({ms['by_sample'] / a.measured_ms * 100:.0f}% of the per-sample floor's)"
    print(line)


if __name__ == "__main__":
    sys.exit(main())
