#!/usr/bin/env python3
"""Kernel time per step from Nsight Compute's per-kernel summary.

Reads the output of `ncu --print-summary per-kernel --section SpeedOfLight ...` around a
run of N steps and prints one line per kernel (as ncu groups them: name, grid and block):
ms per step (invocations x mean duration / N), invocations, mean duration, the mean DRAM
throughput in % of the GPU's peak (SpeedOfLight's "DRAM Throughput"; "-" without it) and
name, longest first, with the total. The durations are ncu's (each kernel run alone); with
`--clock-control none` the GPU keeps its own clocks.

    python3 bench/ncu_kernel_table.py --steps 2 step_ncu.log
"""
import argparse
import re
import sys

HEADER = re.compile(r"^  (\S.*?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), .*Invocations (\d+)\s*$")
DURATION = re.compile(r"^\s+Duration\s+(ns|us|usecond|ms|msecond|s|second)\s+[\d,.]+\s+[\d,.]+\s+([\d,.]+)\s*$")
DRAM = re.compile(r"^\s+DRAM Throughput\s+%\s+[\d,.]+\s+[\d,.]+\s+([\d,.]+)\s*$")
TO_US = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}


def parse(lines):
    """[(name, invocations, mean_us, dram_percent or None)] in the order ncu prints them."""
    out, current = [], None
    for line in lines:
        m = HEADER.match(line)
        if m:
            current = [m.group(1), int(m.group(8)), None, None]
            out.append(current)
            continue
        d = DURATION.match(line)
        if d and current is not None and current[2] is None:
            current[2] = float(d.group(2).replace(",", "")) * TO_US[d.group(1)]
            continue
        r = DRAM.match(line)
        if r and current is not None and current[3] is None:
            current[3] = float(r.group(1).replace(",", ""))
    return [tuple(k) for k in out if k[2] is not None]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log", help="ncu's output (the per-kernel summary)")
    ap.add_argument("--steps", type=int, required=True, help="steps the profiled run took")
    ap.add_argument("--top", type=int, default=0, help="print only the longest N kernels")
    a = ap.parse_args()
    if a.steps < 1:
        sys.exit("ncu_kernel_table: --steps must be >= 1")
    try:
        with open(a.log, errors="replace") as f:
            kernels = parse(f)
    except OSError as e:
        sys.exit(f"ncu_kernel_table: {a.log}: {e.strerror}")
    if not kernels:
        sys.exit(f"ncu_kernel_table: {a.log}: no per-kernel summary with a Duration line")
    rows = sorted(((n * us / a.steps / 1e3, n, us, dram, name) for name, n, us, dram in kernels),
                  key=lambda r: (r[0], r[4]), reverse=True)
    total = sum(r[0] for r in rows)
    print(f"# {len(rows)} kernels, {total:.3f} ms of kernel time per step ({a.steps} steps profiled)")
    for ms, n, us, dram, name in rows[:a.top or None]:
        hbm = "    -" if dram is None else f"{dram:5.1f}"
        print(f"{ms:9.3f} ms/step {n:5d} x {us:10.1f} us {hbm}% HBM  {name[:140]}")


if __name__ == "__main__":
    main()
