#!/usr/bin/env python3
"""The table of a bench/compare_commits.sh log: medians of each case's runs,
after / before, and the logged step lines.

usage: summarize_commits.py LOG BEFORE AFTER > LOG.md
"""
import re, statistics, sys
path, before, after = sys.argv[1:4]
runs = {}
for line in open(path):
    m = re.match(r"RESULT case=(\S+) side=(\S+) commit=\S+ rep=\d+ samples_per_s=(\d+)", line)
    if m:
        runs.setdefault((m[1], m[2]), []).append(int(m[3]))
print(f"| case | {before} (before) samples/s | {after} (after) samples/s | after / before |")
print("| --- | --- | --- | --- |")
for case in dict.fromkeys(c for c, _ in runs):
    b, a = runs.get((case, "before"), []), runs.get((case, "after"), [])
    if not b or not a:
        continue
    mb, ma = statistics.median(b), statistics.median(a)
    print(f"| {case} | {mb:,.0f} ({', '.join(f'{x:,}' for x in b)}) "
          f"| {ma:,.0f} ({', '.join(f'{x:,}' for x in a)}) | {ma / mb:.2f}x |")
print()
print("Medians of the runs in brackets; step lines (rank 0, steps 2 and 3):")
print()
for line in open(path):
    if line.startswith("STEPLOG"):
        print("    " + line.rstrip())
