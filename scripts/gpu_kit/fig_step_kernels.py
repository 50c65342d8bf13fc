"""gpu_kit figure: fig_step_kernels.py STEP_KERNELS.json: each case's median, failed
checks first."""
import json, sys
cases = json.load(open(sys.argv[1]))["cases"]
bad = [c["name"] for c in cases if str(c.get("check", "ok")).startswith("FAIL")]
parts = [f"{c['name']} {c['median_ms']:.2f} ms" for c in cases]
print(("FAIL: " + ", ".join(bad) + "; " if bad else "") + "; ".join(parts))
