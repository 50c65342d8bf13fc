"""gpu_kit figure: fig_step_hr.py STEP_HR_OURS.jsonl: ncf_dist's last HR@10 and samples/s."""
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
except OSError:
    rows = []
r = rows[-1] if rows else None
print(f"ncf_dist HR@10 {r['hr']:.4f} after epoch {r['epoch']}, "
      f"{r['samples_per_second']:,.0f} samples/s" if r else "ncf_dist: no metrics")
