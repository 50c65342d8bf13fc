"""gpu_kit figure: fig_pytorch_variants.py VARIANTS.jsonl PYTORCH_VARIANTS.log
STEP_TF32_STREAMING.log STEP_BF16_STREAMING.log STEP_HR_OURS.jsonl: each PyTorch variant
(median-step samples/s, last HR@10, whether it counts), then ncf_dist's median step against
the fastest counting variant per precision, and ncf_dist's HR@10."""
import json, re, statistics, sys
def lines(path):
    try:
        return [json.loads(l) for l in open(path, errors="replace") if l.startswith("{")]
    except (OSError, ValueError):
        return []
recs = [r for r in lines(sys.argv[1]) if r.get("kind") == "variant"]
summary = next((r for r in lines(sys.argv[2]) if r.get("kind") == "summary"), None)
if not recs:
    print("no variant records")
    sys.exit(0)
parts = []
for r in recs:
    if r["status"] != "ok":
        parts.append(f"{r['variant']} failed")
        continue
    c = {True: "counts", False: "off", None: "?"}[r.get("counts")]
    parts.append(f"{r['variant']} {r['samples_per_s'] / 1e6:.1f}M/s HR {r['hr'][-1]:.4f} {c}")
def ours(path):
    ms, samples = [], 0
    try:
        for line in open(path, errors="replace"):
            m = re.match(r"\s*step (\d+): (\d+) samples, exchange ([\d.]+) ms, compute ([\d.]+) ms, allreduce ([\d.]+) ms", line)
            if m and 10 <= int(m.group(1)) <= 40:
                ms.append(float(m.group(3)) + float(m.group(4)) + float(m.group(5)))
                samples = int(m.group(2))
    except OSError:
        pass
    return samples / statistics.median(ms) * 1e3 if ms else None
# the summary's choice; without it (the run cut short), the fastest counting variant so far
best = (summary or {}).get("fastest_counting")
if best is None:
    best = {}
    for r in recs:
        b = best.get(r["precision"])
        if r.get("counts") and (b is None or r["samples_per_s"] > b[1]):
            best[r["precision"]] = (r["variant"], r["samples_per_s"])
    best = {k: v[0] for k, v in best.items()}
for prec, path in (("tf32", sys.argv[3]), ("bf16", sys.argv[4])):
    v = best.get(prec)
    mine = ours(path)
    theirs = next((r["samples_per_s"] for r in recs if r["variant"] == v), None) if v else None
    if v and mine and theirs:
        parts.append(f"ncf_dist/{v} {mine / theirs:.2f}x")
    else:
        parts.append(f"ncf_dist/best {prec}: n/a")
hr = lines(sys.argv[5])
if hr and "hr" in hr[-1]:
    parts.append(f"ncf_dist HR {hr[-1]['hr']:.4f}")
print("; ".join(parts))
