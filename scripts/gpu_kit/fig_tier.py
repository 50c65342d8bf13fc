"""gpu_kit figure: fig_tier.py METRICS.jsonl [REFERENCE.jsonl]: a host-tier run's samples/s, its
cache's loads, step-time loads and in-window evictions (ncf_dist --metrics_json "host_tier"), the
time its steps waited for rows, the bytes moved between host and device (rows loaded and written
back, each cache_row_bytes) and their rate over the training time, the lookahead k and the copy
rates measured at start-up (the link's speed for the tier's copy kernels), and, beside the
all-on-device run of the same flags, the step-time ratio and whether the losses agree to the
bit."""
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
if not rows:
    print("no metrics")
    sys.exit(0)
r = rows[-1]
parts = [f"{r['samples_per_second']:,.0f} samples/s"]
t = r.get("host_tier")
if t:
    steps = max(t["steps"], 1)
    parts.append(f"cache {t['cache_rows']:,} rows, {t['loads'] / steps:,.0f} loaded/step, "
                 f"waits {t['waits']}/{t['steps']}, in-window evictions {t['evicted_in_window']}")
    if "wait_seconds" in t and r.get("train_seconds"):
        w = t["wait_seconds"]
        gb = (t["loads"] + t["evictions"]) * t["cache_row_bytes"] / 1e9
        parts.append(f"waited {w:.3f} s ({1e3 * w / steps:.2f} ms/step), moved {gb:.3f} GB "
                     f"({gb / r['train_seconds']:.3f} GB/s of training)")
    if "host_seconds" in t:
        parts.append(f"host {1e3 * t['host_seconds'] / steps:.2f} ms/step announcing")
    if "lookahead_steps" in t:
        parts.append(f"k {t['lookahead_steps']}, copies {t['copy_in_gbps']:.1f} GB/s in, "
                     f"{t['copy_out_gbps']:.1f} GB/s out")
else:
    parts.append("all rows on the device")
if len(sys.argv) > 2:
    ref = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
    if ref:
        parts.append(f"{ref[-1]['samples_per_second'] / r['samples_per_second']:.3f}x the "
                     "all-on-device step time")
        same = [a["loss"] == b["loss"] for a, b in zip(ref, rows)]
        parts.append("losses identical" if same and all(same) else "LOSSES DIFFER")
print("; ".join(parts))
