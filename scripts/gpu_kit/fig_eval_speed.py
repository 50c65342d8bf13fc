"""gpu_kit figure: fig_eval_speed.py B100000.jsonl B1000000.jsonl PER_SAMPLE.jsonl
FUSED.jsonl: one evaluation's seconds at each batch size and path (first evaluation, then
the second with the lists kept); the fused line only where FUSED.jsonl exists (bf16)."""
import json, sys
def secs(path, line):
    try:
        return json.loads(open(path).read().splitlines()[line])["eval_seconds"]
    except Exception:
        return None
fmt = lambda x: f"{x:.3f} s" if x is not None else "no metrics"
def both(path):  # the first evaluation (lists read), then the second (lists kept)
    return f"{fmt(secs(path, 0))} / kept {fmt(secs(path, 1))}"
print(f"one evaluation by items: {both(sys.argv[1])} at --eval_batch_size 100000, "
      f"{both(sys.argv[2])} at 1000000; per sample at 1000000: {both(sys.argv[3])}")
def hr(path):
    try:
        return [json.loads(l)["hr"] for l in open(path).read().splitlines()]
    except Exception:
        return None
fused = hr(sys.argv[4])
if fused is not None:  # bf16 only: the one kernel against the ops one by one
    print(f"in one kernel (NCF_EVAL_FUSED=1) at 1000000: {both(sys.argv[4])}; "
          f"HR@10 {fused} against the ops' {hr(sys.argv[2])}")
