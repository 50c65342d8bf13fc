"""gpu_kit figure: fig_pytorch.py PYTORCH_NEUMF.log TRAIN_TF32_THROUGHPUT.jsonl: PyTorch's
best samples/s against ncf_dist's tf32 throughput."""
import json, re, sys
best = None
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"^([a-z_0-9]+): \d+ steps in [\d.]+ s = ([\d,]+) samples/s", line)
    if m and (best is None or int(m.group(2).replace(",", "")) > best[1]):
        best = (m.group(1), int(m.group(2).replace(",", "")))
ours = None
try:
    ours = [json.loads(l) for l in open(sys.argv[2]) if l.strip()][-1]["samples_per_second"]
except (OSError, IndexError, KeyError, ValueError):
    pass
torch_fig = f"{best[1]:,} samples/s ({best[0]})" if best else "none"
ours_fig = f"{ours:,.0f} samples/s" if ours else "n/a"
ratio = f"; ncf_dist / PyTorch {ours / best[1]:.2f}x" if best and ours else ""
print(f"PyTorch best {torch_fig}; ncf_dist tf32 {ours_fig}{ratio}")
