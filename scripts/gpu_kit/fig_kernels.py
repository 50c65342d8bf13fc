"""gpu_kit figure: fig_kernels.py KERNELS.json: bench_kernels' cases and their checks."""
import json, sys
j = json.load(open(sys.argv[1]))
cases = j["cases"]
bad = [c["name"] for c in cases if str(c.get("check", "ok")).startswith("FAIL")]
print(f"{len(cases)} kernels at batch {j.get('batch')}; " + (f"check not ok: {', '.join(bad)}" if bad else "all checks ok"))
