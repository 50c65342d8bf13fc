"""ctest: bench/pytorch_variants.py on the CPU.

  python3 tests/pytorch_variants_test.py self_check SOURCE_DIR
  python3 tests/pytorch_variants_test.py epochs NCF_PREP SOURCE_DIR WORK_DIR

self_check runs the script's --self_check (the split model against NeuMF.forward, forward
and every parameter's gradient, on both layer-0 paths; the sample stream's groups).
epochs, end to end on a tiny ncf_prep --synthetic set: trains eager_tf32, compile_fwd_tf32
and expert_tf32 for 2 epochs on the same samples and holds the figures to what they must be:
- eager_tf32 and expert_tf32 ran; the expert's split model is NeuMF's function, so its loss
  and HR@10 per epoch are eager's up to rounding (loss within 1e-3 relative, HR within
  0.01) and it counts;
- compile_fwd_tf32 is recorded as failed, naming torch.compile, and the expert ran its
  split model eagerly (its notes say "compile unavailable"): Debian's torch 1.13 has no
  torch.compile; a torch that has one runs with --no_compile (the same path, without
  depending on a C++ toolchain for inductor);
- the model learned: HR@10 after epoch 2 above the random ranking's 10 / (1 + E);
- the summary line names the fastest counting tf32 variant, one of those that ran.
Prints "pytorch_variants_test: skipped: ..." (ctest's SKIP_REGULAR_EXPRESSION) when this
Python has no torch; scripts/setup.sh installs Debian's python3-torch.
"""
import json
import os
import shutil
import subprocess
import sys


def main():
    try:
        import torch
    except ImportError as e:
        print(f"pytorch_variants_test: skipped: no torch in {sys.executable} ({e}); "
              "bash scripts/setup.sh installs python3-torch")
        return 0
    if sys.argv[1] == "self_check":
        script = os.path.join(sys.argv[2], "bench", "pytorch_variants.py")
        return subprocess.run([sys.executable, script, "--self_check"]).returncode
    prep, src, work = sys.argv[2:5]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data = os.path.join(work, "data")
    subprocess.run([prep, "--synthetic", "custom", "--users", "300", "--items", "160",
                    "--interactions", "12000", "--eval_negatives", "49", "--progress", "off",
                    "--output", data],
                   check=True, stdout=subprocess.DEVNULL)
    metrics = os.path.join(work, "variants.jsonl")
    cmd = [sys.executable, os.path.join(src, "bench", "pytorch_variants.py"), "--data_dir", data,
           "--preset", "ncf-paper", "--batch_size", "1280", "--epochs", "2", "--device", "cpu",
           "--variants", "eager_tf32,compile_fwd_tf32,expert_tf32", "--metrics_json", metrics]
    if hasattr(torch, "compile"):
        cmd.append("--no_compile")
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(run.stdout)
    assert run.returncode == 0, f"exit {run.returncode}"
    lines = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
    summary = [x for x in lines if x.get("kind") == "summary"]
    assert len(summary) == 1, "no summary line"
    summary = summary[0]
    rec = {x["variant"]: x for x in (json.loads(l) for l in open(metrics))}
    assert sorted(rec) == ["compile_fwd_tf32", "eager_tf32", "expert_tf32"], sorted(rec)
    eager, expert, comp = rec["eager_tf32"], rec["expert_tf32"], rec["compile_fwd_tf32"]
    assert eager["status"] == "ok" and expert["status"] == "ok", (eager, expert)
    for e in range(2):
        le, lx = eager["loss"][e], expert["loss"][e]
        assert abs(le - lx) <= 1e-3 * abs(le), f"epoch {e + 1}: loss {lx} against eager's {le}"
        assert abs(eager["hr"][e] - expert["hr"][e]) <= 0.01, \
            f"epoch {e + 1}: HR {expert['hr'][e]} against eager's {eager['hr'][e]}"
    assert eager["counts"] is True and expert["counts"] is True
    E = 49
    assert eager["hr"][-1] > 10 / (1 + E) + 0.05, f"HR@10 {eager['hr'][-1]}: did not learn"
    for r in (eager, expert):
        assert r["median_step_ms"] > 0 and r["samples_per_s"] > 0 and r["timed_steps"] > 0, r
    assert comp["status"] == "failed" and "torch.compile" in comp["reason"], comp
    assert any("compile unavailable" in n for n in expert["notes"]), expert["notes"]
    assert "compile_fwd_tf32" in summary["failed"], summary
    best = summary["fastest_counting"]["tf32"]
    assert best in ("eager_tf32", "expert_tf32", "compile_fwd_tf32") and rec[best]["counts"], best
    assert summary["samples_per_s"][best] == max(
        v for k, v in summary["samples_per_s"].items() if rec[k]["counts"]), summary
    print(f"pytorch_variants_test: passed (HR@10 eager {eager['hr']}, expert {expert['hr']}; "
          f"fastest counting tf32: {best})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
