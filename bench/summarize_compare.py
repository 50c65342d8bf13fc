#!/usr/bin/python3
"""Summarises bench/results/compare_pytorch.txt (the `compare` section of
bench/run_cpu_benchmarks.sh) into one row per run and one table per configuration:
best, median and spread of samples/s on each side, and the ratio ncf_dist / PyTorch.

ncf_dist's figure is its epoch line (samples / train seconds, start-up of the epoch and
step 0 included). Runs with --step_log also get a steady figure over steps 1.. (step 0
first touches the step buffers), comparable with PyTorch's, which excludes warm-up steps.

  /usr/bin/python3 bench/summarize_compare.py bench/results/compare_pytorch.txt [MORE.txt ...]
"""
import json
import re
import statistics
import sys


def parse(path):
    runs, cmd, load, steps = [], None, None, []
    for line in open(path):
        line = line.rstrip("\n")
        if line.startswith("# load:"):
            load = float(line.split()[2])
        elif line.startswith("$ "):
            cmd, steps = line[2:], []
        elif m := re.match(r"step (\d+): (\d+) samples, exchange ([\d.]+) ms, compute ([\d.]+) ms",
                           line):
            steps.append((int(m[2]), float(m[3]) + float(m[4])))
        elif cmd and "ncf_dist" in cmd and (
                m := re.match(r"\s+1\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s+(\d+)", line)):
            steady = None
            if len(steps) > 1:
                steady = sum(s for s, _ in steps[1:]) / (sum(ms for _, ms in steps[1:]) / 1e3)
            runs.append(dict(
                side="ncf_dist", data="ml-20m" if "ml-20m" in cmd else "ml-1m",
                threads=int(re.search(r"--threads (\d+)", cmd)[1]),
                opt="lazy_adam" if "lazy_adam" in cmd else "dense_adam",
                # OpenBLAS's own kernels: OPENBLAS_CORETYPE given (records before
                # 2026-12 say NCF_NO_BLAS_UPGRADE, the switch it replaced).
                blas="default" if re.search(r"OPENBLAS_CORETYPE=|NCF_NO_BLAS_UPGRADE", cmd)
                else "upgraded",
                omp="-", sps=float(m[2]), steady=steady, load=load))
        elif line.startswith('{"bench": "pytorch_neumf"'):
            j = json.loads(line)
            runs.append(dict(
                side="pytorch", data="ml-20m" if j["users"] > 100000 else "ml-1m",
                threads=j["threads"], opt=j.get("embedding_optimizer", "dense_adam"),
                blas="upgraded" if j["openblas_core"] != "Prescott" else "default",
                omp=j["omp_wait_policy"], sps=j["samples_per_s"], steady=None, load=load,
                ms=[1e3 * j[k] / j["steps"] for k in ("forward_s", "backward_s", "adam_s")]))
    return runs


def main():
    runs = [r for path in sys.argv[1:] for r in parse(path)]
    print("| side | data | T | embedding opt | BLAS | OMP wait | samples/s | steady samples/s "
          "| PyTorch fwd / bwd / Adam ms | load1 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in runs:
        ms = " / ".join(f"{x:.1f}" for x in r["ms"]) if "ms" in r else ""
        steady = f"{r['steady']:,.0f}" if r["steady"] else ""
        print(f"| {r['side']} | {r['data']} | {r['threads']} | {r['opt']} | {r['blas']} "
              f"| {r['omp']} | {r['sps']:,.0f} | {steady} | {ms} | {r['load']:.2f} |")
    print()
    print("Main configurations (upgraded BLAS kernels, OMP_WAIT_POLICY=PASSIVE for PyTorch):")
    print()
    print("| data | T | embedding opt | ncf_dist best / median (spread) | PyTorch best / median "
          "(spread) | ratio of bests | ratio of medians |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    keys = []
    for r in runs:
        k = (r["data"], r["threads"], r["opt"])
        if k not in keys:
            keys.append(k)
    for k in keys:
        def pick(side, steady=False):
            return [(r["steady"] if steady else r["sps"]) for r in runs
                    if (r["data"], r["threads"], r["opt"]) == k and r["side"] == side
                    and r["blas"] == "upgraded" and r["omp"] in ("-", "PASSIVE")
                    and (r["steady"] or not steady)]

        def cell(v):
            return (f"{max(v):,.0f} / {statistics.median(v):,.0f} "
                    f"({100 * (max(v) - min(v)) / max(v):.0f}%)")

        for steady in (False, True):
            n, p = pick("ncf_dist", steady), pick("pytorch")
            if len(n) < 2 or not p:
                continue
            label = f"{k[2]}{', steady' if steady else ''}"
            print(f"| {k[0]} | {k[1]} | {label} | {cell(n)} | {cell(p)} "
                  f"| {max(n) / max(p):.2f}x | {statistics.median(n) / statistics.median(p):.2f}x |")


if __name__ == "__main__":
    main()
