"""gpu_kit figure helper: fig_step_train.py STEP.log: "MEDIAN_MS SAMPLES STEPS", the median
over steps 10-40 of exchange + compute + allreduce from ncf_dist's --step_log lines;
nothing when there are none."""
import re, statistics, sys
ms, samples = [], 0
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"\s*step (\d+): (\d+) samples, exchange ([\d.]+) ms, compute ([\d.]+) ms, allreduce ([\d.]+) ms", line)
    if m and 10 <= int(m.group(1)) <= 40:
        ms.append(float(m.group(3)) + float(m.group(4)) + float(m.group(5)))
        samples = int(m.group(2))
if ms:
    print(f"{statistics.median(ms):.3f} {samples} {len(ms)}")
