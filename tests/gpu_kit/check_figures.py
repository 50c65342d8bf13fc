#!/usr/bin/env python3
"""The GPU kit's Python parts (scripts/gpu_kit/*.py) on the small hand-written inputs of
tests/gpu_kit/, each output checked line for line against what was worked out by hand.

check_figures.py [CASE...]: runs the named cases (all without one); prints
"gpu_kit figures: N cases passed" or the first difference, exit 1.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
KIT = os.path.join(HERE, "..", "..", "scripts", "gpu_kit")
MISSING = os.path.join(HERE, "no_such_file.jsonl")


def d(name):
    return os.path.join(HERE, name)


# name: (script, arguments, expected stdout, expected exit status, expected stderr or None)
CASES = {
    # the host tier: no "host_tier" record is all on the device; 600,000 loads / 300 steps =
    # 2,000 a step; (600,000 + 12) x 388 bytes = 0.233 GB in 3 s = 0.078 GB/s; 100M / 80M =
    # 1.250x the step time; 1.5 s announcing / 300 steps = 5.00 ms a step; k 2 and the
    # probe's rates to one place; the same loss; 5% (a record without the host time, k and
    # the rates: they are left out): waited 0.3 s / 300 = 1.00 ms a step,
    # (3,000,000 + 2,999,000) x 388 = 2.328 GB in 6 s = 0.388 GB/s, another loss
    "tier_all": ("fig_tier.py", [d("tier_all.jsonl")],
                 "100,000,000 samples/s; all rows on the device\n", 0, None),
    "tier_25": ("fig_tier.py", [d("tier_25.jsonl"), d("tier_all.jsonl")],
                "80,000,000 samples/s; cache 1,500,000 rows, 2,000 loaded/step, waits 0/300, "
                "in-window evictions 0; waited 0.000 s (0.00 ms/step), moved 0.233 GB "
                "(0.078 GB/s of training); host 5.00 ms/step announcing; k 2, copies 52.3 GB/s "
                "in, 49.9 GB/s out; "
                "1.250x the all-on-device step time; "
                "losses identical\n",
                0, None),
    "tier_5": ("fig_tier.py", [d("tier_5.jsonl"), d("tier_all.jsonl")],
               "40,000,000 samples/s; cache 300,000 rows, 10,000 loaded/step, waits 7/300, "
               "in-window evictions 5; waited 0.300 s (1.00 ms/step), moved 2.328 GB "
               "(0.388 GB/s of training); 2.500x the all-on-device step time; "
               "LOSSES DIFFER\n",
               0, None),
    # the last epoch: 123,025,473.87 samples/s rounded, epoch 2, world 1, loss to 5 places
    "jsonl_throughput": ("fig_jsonl.py", [d("throughput.jsonl"), "throughput"],
                         "123,025,474 samples/s (epoch 2, W 1, loss 0.38470)\n", 0, None),
    # HR 0.64 >= 0.635 at epoch 2, after (1.5 + 0.5) x 2 = 4.0 s; epoch 3 not read
    "jsonl_ttq": ("fig_jsonl.py", [d("ttq_reached.jsonl"), "ttq"],
                  "HR@10 0.6400 >= 0.635 at epoch 2, 4.0 s train+eval\n", 0, None),
    "jsonl_ttq_missed": ("fig_jsonl.py", [d("ttq_missed.jsonl"), "ttq"],
                         "0.635 not reached in 2 epochs; best HR@10 0.6000, 4.0 s\n", 0, None),
    # a case without "check" counts as ok
    "kernels": ("fig_kernels.py", [d("kernels.json")],
                "3 kernels at batch 1048575; check not ok: group_sum\n", 0, None),
    "step_kernels": ("fig_step_kernels.py", [d("step_kernels.json")],
                     "group_bias_act legacy 1.81 ms; group_bias_act streaming 0.50 ms\n", 0, None),
    "step_kernels_fail": ("fig_step_kernels.py", [d("kernels.json")],
                          "FAIL: group_sum; gather_rows 0.25 ms; group_sum 1.00 ms; "
                          "adam_rows 0.12 ms\n", 0, None),
    # steps 10-40 only: 7.00, 7.12, 6.00 ms -> median 7.000 ms over 3 steps of 1,048,575
    "step_train": ("fig_step_train.py", [d("step_tf32_streaming.log")],
                   "7.000 1048575 3\n", 0, None),
    "step_train_none": ("fig_step_train.py", [d("step_bf16_streaming.log")], "", 0, None),
    # tf32 has no fused file: one line; bf16 adds the fused line with both HR lists
    "eval_speed_tf32": ("fig_eval_speed.py", [d("eval_b100000.jsonl"), d("eval_b1000000.jsonl"),
                                               d("eval_per_sample.jsonl"), MISSING],
                        "one evaluation by items: 0.371 s / kept 0.250 s at --eval_batch_size "
                        "100000, 0.200 s / kept 0.100 s at 1000000; per sample at 1000000: "
                        "1.500 s / kept 1.250 s\n", 0, None),
    "eval_speed_bf16": ("fig_eval_speed.py", [d("eval_b100000.jsonl"), d("eval_b1000000.jsonl"),
                                               MISSING, d("eval_fused.jsonl")],
                        "one evaluation by items: 0.371 s / kept 0.250 s at --eval_batch_size "
                        "100000, 0.200 s / kept 0.100 s at 1000000; per sample at 1000000: "
                        "no metrics / kept no metrics\n"
                        "in one kernel (NCF_EVAL_FUSED=1) at 1000000: 0.150 s / kept 0.050 s; "
                        "HR@10 [0.5, 0.625] against the ops' [0.5, 0.6]\n", 0, None),
    "step_hr": ("fig_step_hr.py", [d("step_hr_ours.jsonl")],
                "ncf_dist HR@10 0.6543 after epoch 3, 123,025,474 samples/s\n", 0, None),
    "step_hr_none": ("fig_step_hr.py", [MISSING], "ncf_dist: no metrics\n", 0, None),
    # best: compile_amp_bf16 155,311,123; 123,025,473.87 / 155,311,123 = 0.792
    "pytorch": ("fig_pytorch.py", [d("pytorch_neumf.log"), d("throughput.jsonl")],
                "PyTorch best 155,311,123 samples/s (compile_amp_bf16); ncf_dist tf32 "
                "123,025,474 samples/s; ncf_dist / PyTorch 0.79x\n", 0, None),
    "pytorch_no_ours": ("fig_pytorch.py", [d("pytorch_neumf.log"), MISSING],
                        "PyTorch best 155,311,123 samples/s (compile_amp_bf16); ncf_dist tf32 "
                        "n/a\n", 0, None),
    # ncf_dist tf32: 1,048,575 samples / 7.000 ms = 149.8M/s against compile_fwd_tf32's 80M/s
    # = 1.87x; no bf16 variant counts (eager_amp_bf16 is off, expert_bf16 failed)
    "pytorch_variants": ("fig_pytorch_variants.py",
                         [d("variants.jsonl"), d("pytorch_variants.log"),
                          d("step_tf32_streaming.log"), d("step_bf16_streaming.log"),
                          d("step_hr_ours.jsonl")],
                         "eager_tf32 50.0M/s HR 0.6500 counts; compile_fwd_tf32 80.0M/s HR 0.6510 "
                         "counts; expert_bf16 failed; eager_amp_bf16 60.0M/s HR 0.6480 off; "
                         "ncf_dist/compile_fwd_tf32 1.87x; ncf_dist/best bf16: n/a; "
                         "ncf_dist HR 0.6543\n", 0, None),
    # without the summary line (a run cut short): the fastest counting variant so far, the same
    "pytorch_variants_no_summary": ("fig_pytorch_variants.py",
                                    [d("variants.jsonl"), d("pytorch_neumf.log"),
                                     d("step_tf32_streaming.log"), MISSING, MISSING],
                                    "eager_tf32 50.0M/s HR 0.6500 counts; compile_fwd_tf32 80.0M/s "
                                    "HR 0.6510 counts; expert_bf16 failed; eager_amp_bf16 60.0M/s "
                                    "HR 0.6480 off; ncf_dist/compile_fwd_tf32 1.87x; "
                                    "ncf_dist/best bf16: n/a\n", 0, None),
    "pytorch_variants_none": ("fig_pytorch_variants.py",
                              [MISSING, MISSING, MISSING, MISSING, MISSING],
                              "no variant records\n", 0, None),
    # libc6-x: provided by the installed libc6; libstdc++6: build-essential's; gfortran:
    # skipped; libblas.so.3: libopenblas0's; libzstd1: only its config files are installed
    "closure": ("closure.py", ["libfoo-dev", "build-essential", "gfortran-12 gfortran",
                               d("dpkg_status"), d("apt_dumpavail")],
                "libfoo-dev 1.0-1\nlibfoo1 1.0-1\nlibopenblas0 0.3.21+ds-4\n"
                "libzstd1 1.5.4+dfsg2-5\nzlib1g 1:1.2.13.dfsg-1\n", 0, None),
    "closure_unavailable": ("closure.py", ["libbroken", "build-essential", "",
                                           d("dpkg_status"), d("apt_dumpavail")],
                            "", 1, "closure: libbroken depends on libnowhere | libnever, "
                            "none available\n"),
    # the PyTorch NeuMF of `run bench` needs a GPU: here, only that it compiles
    "pytorch_neumf_gpu_compiles": ("-c", [os.path.join(KIT, "pytorch_neumf_gpu.py")],
                                   "", 0, ""),
}


def run(name):
    script, args, want_out, want_rc, want_err = CASES[name]
    if script == "-c":  # compile only, writing no .pyc
        code = "import sys; compile(open(sys.argv[1]).read(), sys.argv[1], 'exec')"
        cmd = [sys.executable, "-c", code] + args
    else:
        cmd = [sys.executable, os.path.join(KIT, script)] + args
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    problems = []
    if p.returncode != want_rc:
        problems.append(f"exit {p.returncode}, expected {want_rc}")
    if p.stdout != want_out:
        problems.append(f"stdout {p.stdout!r}\n  expected {want_out!r}")
    if want_err is not None and p.stderr != want_err:
        problems.append(f"stderr {p.stderr!r}\n  expected {want_err!r}")
    for x in problems:
        print(f"gpu_kit figures: {name}: {x}")
    return not problems


def main():
    names = sys.argv[1:] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        sys.exit(f"gpu_kit figures: unknown case(s) {', '.join(unknown)}; "
                 f"known: {', '.join(CASES)}")
    failed = [n for n in names if not run(n)]
    if failed:
        print(f"gpu_kit figures: {len(failed)} of {len(names)} cases failed: {', '.join(failed)}")
        sys.exit(1)
    print(f"gpu_kit figures: {len(names)} cases passed")


if __name__ == "__main__":
    main()
