#!/usr/bin/env python3
"""The byte/FLOP floor of one ml-20m-mlperf training step on one GPU, and how far a
measured step is above it.

The step's ideal kernels (today's math: the per-user half of layer 0 kept, fused bias +
ReLU epilogues writing 1-bit masks, one fused GMF + head + BCE kernel, one streaming group
sum, the embedding sort + reduce + dense Adam) each move a number of bytes and do a number
of FLOPs; each takes max(bytes / HBM bandwidth, FLOPs / tensor peak). Activations are 4
bytes (tf32) or 2 (bf16); embedding rows, their gradients, U0 and the master weights stay
FP32. Figures per kernel at B = 1,048,575 (n = 209,715 users of S = 5 samples, D = 192,
tower 256-256-128-64), scaled linearly in B for other batches; the measured negative
sampling (0.14 ms) is a constant.

  step_floor.py [--gpu NAME] [--batch B] [--precision tf32|bf16] [--measured_ms MS]

--gpu takes a name as nvidia-smi prints it (H100 or H200 in it; default H200). Prints the
floor in ms and samples/s, and with --measured_ms the measured step's share of it.
"""
import argparse
import sys

# name, MB with 4-byte activations, MB with 2-byte activations, GFLOP (B = 1,048,575)
KERNELS = [
    ("gather user and item rows", 1045, 777, 0.0),
    ("U0 = user MLP rows x W0u", 322, 268, 13.7),
    ("layer 0: item GEMM + U0 + bias, ReLU, mask", 1859, 1054, 68.7),
    ("layer 1 forward (bias + ReLU + mask epilogue)", 1627, 822, 68.7),
    ("layer 2 forward (bias + ReLU + mask epilogue)", 822, 419, 17.2),
    ("fused GMF + head + BCE forward and backward", 1185, 917, 0.8),
    ("layer 2 dgrad + dReLU + bias grad", 822, 419, 17.2),
    ("layer 2 wgrad", 805, 403, 17.2),
    ("layer 1 dgrad + dReLU + bias grad", 1644, 839, 68.7),
    ("layer 1 wgrad", 1611, 805, 68.7),
    ("dU0 = group sums of dZ0", 1288, 644, 0.0),
    ("dW0 item half", 1611, 805, 68.7),
    ("item MLP row gradients", 1611, 1074, 68.7),
    ("dW0 user half and user MLP row gradients", 644, 376, 27.5),
    ("embedding sort + reduce + dense Adam", 1778, 1778, 0.0),
]
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


def floor_ms(gpu, precision, batch):
    bw, tf32, bf16 = GPUS[gpu]
    peak = bf16 if precision == "bf16" else tf32
    scale = batch / B_REF
    total = SAMPLING_MS
    for _, mb4, mb2, gflop in KERNELS:
        mb = (mb2 if precision == "bf16" else mb4) * scale
        total += max(mb * 1e6 / (bw * 1e12), gflop * scale * 1e9 / (peak * 1e12)) * 1e3
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="H200")
    ap.add_argument("--batch", type=int, default=B_REF)
    ap.add_argument("--precision", choices=["tf32", "bf16"], default="tf32")
    ap.add_argument("--measured_ms", type=float)
    a = ap.parse_args()
    if a.batch < 1:
        ap.error(f"--batch {a.batch}: must be at least 1")
    if a.measured_ms is not None and a.measured_ms <= 0:
        ap.error(f"--measured_ms {a.measured_ms}: must be positive")
    gpu = gpu_of(a.gpu)
    ms = floor_ms(gpu, a.precision, a.batch)
    line = (f"floor {ms:.2f} ms/step = {a.batch / ms * 1e3 / 1e6:.0f} M samples/s "
            f"({gpu}, {a.precision}, batch {a.batch})")
    if a.measured_ms is not None:
        line += (f"; measured {a.measured_ms:.2f} ms runs at {ms / a.measured_ms * 100:.0f}% "
                 "of the floor's speed")
    print(line)


if __name__ == "__main__":
    main()
