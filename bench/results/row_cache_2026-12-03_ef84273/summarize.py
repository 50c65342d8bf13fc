# The tables of README.md from the runs' output: python3 summarize.py big_runs.txt ...
# Per budget and configuration: each run's mean step (us), their median, its ratio to the
# one-thread median, the medians of announce and retire (ms), the median slowest step, and
# the cache's counters (loads, write-backs, evicted inside their window, waits), which must
# be the same in every run.
import re
import statistics as st
import sys

NAMES = {
    ("1", "4", "16"): "one thread",
    ("2", "4", "16"): "2 threads, below 4: one thread",
    ("1", "1", "16"): "split, 1 thread",
    ("2", "1", "16"): "split, 2 threads",
    ("1", "1", "0"): "split even packed, 1 thread",
    ("2", "1", "0"): "split even packed, 2 threads",
}
HEAD = re.compile(r"## (\S+) rep (\d+) threads (\d+) parallel_from (\d+) spread (\d+)")
LINE = re.compile(
    r"budget +(\d+)% \((\d+) slots\): ([\d.]+) us a step \(announce ([\d.]+), begin ([\d.]+), "
    r"retire ([\d.]+)\); loads (\d+), write-backs (\d+), evicted inside their window (\d+), "
    r"waits (\d+); slowest step ([\d.]+) us")


def parse(path):
    res, cur = {}, None
    for line in open(path):
        m = HEAD.match(line)
        if m:
            cur = m.group(3, 4, 5)
            continue
        m = LINE.match(line)
        if m:
            step, ann, ret, slow = (float(x) for x in m.group(3, 4, 6, 11))
            res.setdefault((int(m.group(1)), cur), []).append(
                (step, ann, ret, slow, m.group(7, 8, 9, 10)))
    return res


for path in sys.argv[1:]:
    r = parse(path)
    print("##", path)
    print("| budget | passes | us a step, each run | median | ratio | announce (ms) | retire (ms) "
          "| slowest step | loads, write-backs, in-window, waits |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for b in sorted({k[0] for k in r}, reverse=True):
        base = None
        for cfg, name in NAMES.items():
            v = r.get((b, cfg))
            if not v:
                continue
            med = st.median(x[0] for x in v)
            base = base or med
            counters = {x[4] for x in v}
            same = ", ".join(counters.pop()) if len(counters) == 1 else "DIFFER: %s" % counters
            print(f"| {b}% | {name} | {', '.join('%.0f' % x[0] for x in v)} | {med / 1e3:.1f} ms "
                  f"| {med / base:.2f} | {st.median(x[1] for x in v) / 1e3:.1f} "
                  f"| {st.median(x[2] for x in v) / 1e3:.1f} "
                  f"| {st.median(x[3] for x in v) / 1e3:.1f} ms | {same} |")
