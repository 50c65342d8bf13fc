"""gpu_kit figure: fig_jsonl.py METRICS.jsonl throughput|ttq: samples/s of the last epoch
(throughput) or time to HR@10 0.635 (ttq) from ncf_dist's --metrics_json."""
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
r = rows[-1]
if sys.argv[2] == "throughput":
    print(f"{r['samples_per_second']:,.0f} samples/s (epoch {r['epoch']}, W {r.get('world', 1)}, "
          f"loss {r['loss']:.5f})")
else:
    spent = 0.0
    for r in rows:
        spent += r["train_seconds"] + r["eval_seconds"]
        if r["hr"] >= 0.635:
            print(f"HR@10 {r['hr']:.4f} >= 0.635 at epoch {r['epoch']}, {spent:.1f} s train+eval")
            break
    else:
        print(f"0.635 not reached in {len(rows)} epochs; best HR@10 "
              f"{max(x['hr'] for x in rows):.4f}, {spent:.1f} s")
