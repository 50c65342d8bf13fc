#!/usr/bin/python3
"""Weak and strong scaling sweep of ncf_dist: the same job at W = 1, 2, 4, ... ranks.

Weak scaling keeps the per-rank batch b fixed (global batch W*b); strong scaling keeps
the global batch fixed (per-rank batch shrinks as 1/W). For each run it reads the
--metrics_json lines ncf_dist writes and keeps the last epoch (the first one pays for
allocation and page faults), then reports samples/s, the scaling efficiency
sps_W / (W * sps_1) (speedup over W; same definition in both modes), and rank 0's
time split per step (exchange incl. the owners' optimizer step, dense allreduce, the
rest = compute) with the bytes rank 0 sent per step. Writes PREFIX.json and PREFIX.png.

Run it with /usr/bin/python3 (the Debian python with python3-matplotlib from
scripts/setup.sh); without matplotlib it writes the JSON and skips the plot.

  /usr/bin/python3 launch/scaling.py --data_dir data/syn --ranks 1,2 \\
      --per_rank_batch 65536 --max_steps 15 --out bench/results/cpu_scaling \\
      -- --preset ml-20m-mlperf --shard_plan row
"""
import argparse
import datetime
import json
import math
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def parse_args(argv):
    if "--" in argv:
        k = argv.index("--")
        argv, passthrough = argv[:k], argv[k + 1:]
    else:
        passthrough = []
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Arguments after '--' go to every ncf_dist run (e.g. --preset ml-20m-mlperf "
        "--shard_plan row). The script sets --data_dir, --batch_size, --num_neg, --max_steps, "
        "--train_epochs, --threads, --no_eval, --metrics_json and --progress itself.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data_dir", required=True, help="dataset written by ncf_prep")
    p.add_argument("--ranks", default="1,2,4,8", help="comma-separated world sizes W")
    p.add_argument("--modes", default="weak,strong", help="weak, strong or both")
    p.add_argument("--per_rank_batch", type=int, default=65536,
                   help="weak scaling: training samples per rank per step")
    p.add_argument("--global_batch", type=int, default=0,
                   help="strong scaling: training samples per step over all ranks "
                   "(default: --per_rank_batch, i.e. the W=1 run of the weak sweep)")
    p.add_argument("--num_neg", type=int, default=4, help="negatives per positive (batches are "
                   "rounded to whole positives per rank)")
    p.add_argument("--max_steps", type=int, default=20, help="global steps per epoch")
    p.add_argument("--epochs", type=int, default=2,
                   help="epochs per run; the last one is reported (>= 2 skips warm-up)")
    p.add_argument("--threads", type=int, default=1,
                   help="--threads per rank (1: W ranks use W cores, so CPU runs scale "
                   "the way GPU ranks do; 0: ncf_dist's default, all cores shared)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs per point; the fastest is kept (on a shared machine the least "
                   "disturbed one), all samples/s values are recorded")
    p.add_argument("--launcher", default=os.path.join(HERE, "ncf_launch"),
                   help="ncf_launch path, or 'mpirun' for a bare Open MPI mpirun")
    p.add_argument("--launcher_args", default="",
                   help="extra launcher arguments, one shell-quoted string (e.g. '--bind none')")
    p.add_argument("--ncf_dist", default="",
                   help="ncf_dist binary (default: $NCF_BUILD_DIR/src/ncf_dist, else build/src)")
    p.add_argument("--out", required=True, help="output prefix: writes PREFIX.json, PREFIX.png")
    p.add_argument("--log_dir", default="", help="keep every run's output here")
    p.add_argument("--commit", default="",
                   help="commit the ncf_dist binary was built from, when not the checkout's HEAD")
    p.add_argument("--dry_run", action="store_true", help="print the commands only")
    a = p.parse_args(argv)
    try:
        a.ranks = [int(w) for w in a.ranks.split(",") if w.strip()]
    except ValueError:
        p.error("--ranks must be comma-separated integers, got %r" % a.ranks)
    if not a.ranks or min(a.ranks) < 1:
        p.error("--ranks needs positive world sizes, got %r" % a.ranks)
    a.ranks = sorted(set(a.ranks))
    a.modes = [m for m in a.modes.split(",") if m]
    for m in a.modes:
        if m not in ("weak", "strong"):
            p.error("--modes takes weak and/or strong, got %r" % m)
    S = a.num_neg + 1
    if a.per_rank_batch < S:
        p.error("--per_rank_batch %d holds no positive (1 + num_neg = %d)" % (a.per_rank_batch, S))
    if not a.global_batch:
        a.global_batch = a.per_rank_batch
    L = S
    for w in a.ranks:
        L = L * w // math.gcd(L, w)
    if a.global_batch < L:
        p.error("--global_batch %d is less than (1 + num_neg) x lcm(ranks) = %d: some rank "
                "would get no positive" % (a.global_batch, L))
    if a.epochs < 1 or a.max_steps < 1 or a.repeats < 1:
        p.error("--epochs, --max_steps and --repeats must be >= 1")
    if not a.ncf_dist:
        build = os.environ.get("NCF_BUILD_DIR") or os.path.join(REPO, "build")
        a.ncf_dist = os.path.join(build, "src", "ncf_dist")
    if not a.dry_run and not os.access(a.ncf_dist, os.X_OK):
        p.error("ncf_dist not found at %s (set --ncf_dist or NCF_BUILD_DIR)" % a.ncf_dist)
    a.passthrough = passthrough
    return a


def launcher_prefix(a, W):
    if os.path.basename(a.launcher) == "ncf_launch":
        return [a.launcher, "-np", str(W)] + shlex.split(a.launcher_args) + ["--"]
    # A bare Open MPI mpirun: the flags ncf_launch would add on a small machine.
    env = ["env", "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"] \
        if os.geteuid() == 0 else []
    return env + [a.launcher, "-np", str(W), "--oversubscribe", "--bind-to", "none"] + \
        shlex.split(a.launcher_args)


def batch_for(a, mode, W):
    """Global batch in samples: whole positives per rank, so every rank's slice is equal."""
    S = a.num_neg + 1
    if mode == "weak":
        return W * (a.per_rank_batch // S) * S
    # One global batch for every W of the sweep: a multiple of S * lcm(ranks).
    L = S
    for w in a.ranks:
        L = L * w // math.gcd(L, w)
    return (a.global_batch // L) * L


def loadavg():
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except OSError:
        return None


def run_once(a, mode, W, rep):
    batch = batch_for(a, mode, W)
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        cmd = launcher_prefix(a, W) + [
            a.ncf_dist, "--data_dir", a.data_dir, "--batch_size", str(batch),
            "--num_neg", str(a.num_neg), "--max_steps", str(a.max_steps),
            "--train_epochs", str(a.epochs), "--threads", str(a.threads), "--no_eval",
            "--progress", "off", "--metrics_json", metrics] + a.passthrough
        line = " ".join(shlex.quote(c) for c in cmd)
        print("scaling: %s W=%d: %s" % (mode, W, line), file=sys.stderr, flush=True)
        if a.dry_run:
            return None
        load_before = loadavg()
        # CPU seconds of mpirun and every rank (descendants are reaped, so they count):
        # on a machine shared with other jobs this moves much less than wall time.
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        if a.log_dir:
            os.makedirs(a.log_dir, exist_ok=True)
            with open(os.path.join(a.log_dir, "%s-W%d-r%d.log" % (mode, W, rep)), "w") as f:
                f.write(line + "\n" + r.stdout)
        if r.returncode != 0:
            sys.exit("scaling: %s W=%d failed with exit code %d:\n%s\n%s" %
                     (mode, W, r.returncode, line, r.stdout[-4000:]))
        with open(metrics) as f:
            epochs = [json.loads(l) for l in f if l.strip()]
    if len(epochs) != a.epochs:
        sys.exit("scaling: %s W=%d wrote %d metrics lines, expected %d" %
                 (mode, W, len(epochs), a.epochs))
    last = epochs[-1]
    steps = max(1, last["steps"])
    return {
        "world": W,
        "global_batch": batch,
        "per_rank_batch": batch // W,
        "samples_per_second": last["samples_per_second"],
        "step_seconds": last["train_seconds"] / steps,
        "exchange_seconds_per_step": last["exchange_seconds"] / steps,
        "compute_seconds_per_step": last["compute_seconds"] / steps,
        "allreduce_seconds_per_step": last["allreduce_seconds"] / steps,
        "bytes_sent_per_step": last["bytes_sent_per_step"],
        "steps": last["steps"],
        # every epoch and the start-up included: CPU time per sample over the whole run
        "cpu_seconds": cpu,
        "cpu_us_per_sample": 1e6 * cpu / max(1, sum(e["samples"] for e in epochs)),
        "command": line,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "epochs": epochs,
    }


def best_run(runs):
    best = dict(max(runs, key=lambda r: r["samples_per_second"]))
    best["samples_per_second_all"] = [r["samples_per_second"] for r in runs]
    return best


def add_efficiency(points):
    base = points[0]
    W0, s0 = base["world"], base["samples_per_second"]
    c0 = base["cpu_us_per_sample"]
    for p in points:
        p["speedup"] = p["samples_per_second"] / s0 if s0 else 0.0
        p["efficiency"] = p["speedup"] * W0 / p["world"]
        # the same work spread over W ranks: CPU time per sample should stay flat
        p["cpu_efficiency"] = c0 / p["cpu_us_per_sample"] if p["cpu_us_per_sample"] else 0.0


def git_commit():
    try:
        h = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                           capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return h + ("+local-changes" if dirty else "")
    except OSError:
        return "unknown"


def cpu_model():
    try:
        for l in open("/proc/cpuinfo"):
            if l.startswith("model name"):
                return l.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def plot(result, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("scaling: no matplotlib in %s; skipping %s (use /usr/bin/python3)" %
              (sys.executable, path), file=sys.stderr)
        return False
    modes = [m for m in ("weak", "strong") if m in result["runs"]]
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.6))
    colors = {"weak": "tab:blue", "strong": "tab:orange"}
    all_w = sorted({p["world"] for m in modes for p in result["runs"][m]})
    for m in modes:
        pts = result["runs"][m]
        W = [p["world"] for p in pts]
        sps = [p["samples_per_second"] for p in pts]
        lbl = "%s (%s)" % (m, "%d samples/rank" % pts[0]["per_rank_batch"] if m == "weak"
                           else "%d samples/step" % pts[0]["global_batch"])
        ax[0].plot(W, sps, "o-", color=colors[m], label=lbl)
        ideal = [sps[0] * w / W[0] for w in W]
        ax[0].plot(W, ideal, ":", color=colors[m], alpha=0.6, label="%s ideal" % m)
        ax[1].plot(W, [100 * p["efficiency"] for p in pts], "o-", color=colors[m],
                   label="%s: samples/s" % m)
        ax[1].plot(W, [100 * p["cpu_efficiency"] for p in pts], "s--", color=colors[m],
                   alpha=0.7, label="%s: CPU s per sample" % m)
        for w, s in zip(W, sps):
            ax[0].annotate("%.0fk" % (s / 1e3), (w, s), textcoords="offset points",
                           xytext=(4, -12 if m == "weak" else 6), fontsize=8, color=colors[m])
    ax[0].set_title("training throughput")
    ax[0].set_xlabel("ranks W")
    ax[0].set_ylabel("samples/s")
    ax[0].set_ylim(bottom=0)
    ax[0].legend(fontsize=8)
    ax[1].axhline(100, color="gray", lw=0.8, ls=":")
    ax[1].set_title("efficiency: sps(W) / (W sps(1)); CPU: cpu/sample(1) / cpu/sample(W)",
                    fontsize=9)
    ax[1].set_xlabel("ranks W")
    ax[1].set_ylabel("%")
    ax[1].set_ylim(0, 115)
    ax[1].legend(fontsize=8)
    for a_ in ax[:2]:
        a_.set_xscale("log", base=2)
        a_.set_xticks(all_w)
        a_.set_xticklabels([str(w) for w in all_w])
    # Step time split, rank 0: one stacked bar per (mode, W).
    labels, exch, comp, allr = [], [], [], []
    for m in modes:
        for p in result["runs"][m]:
            labels.append("%s\nW=%d" % (m, p["world"]))
            exch.append(p["exchange_seconds_per_step"] * 1e3)
            comp.append(p["compute_seconds_per_step"] * 1e3)
            allr.append(p["allreduce_seconds_per_step"] * 1e3)
    x = range(len(labels))
    ax[2].bar(x, comp, color="tab:green", label="compute")
    ax[2].bar(x, exch, bottom=comp, color="tab:red", label="embedding exchange + update")
    ax[2].bar(x, allr, bottom=[c + e for c, e in zip(comp, exch)], color="tab:purple",
              label="dense allreduce")
    ax[2].set_xticks(list(x))
    ax[2].set_xticklabels(labels, fontsize=8)
    ax[2].set_ylabel("ms per step (rank 0)")
    ax[2].set_title("step time split")
    top = max([c + e + a_ for c, e, a_ in zip(comp, exch, allr)] or [1])
    ax[2].set_ylim(0, 1.35 * top)  # room for the legend above the bars
    ax[2].legend(fontsize=8, loc="upper left")
    m = result["machine"]
    fig.suptitle("ncf_dist scaling on %s (%d cores), commit %s, %s" %
                 (m["cpu"], m["cores"], result["commit"], result["date"]), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main():
    a = parse_args(sys.argv[1:])
    result = {
        "tool": "launch/scaling.py",
        "date": datetime.date.today().isoformat(),
        "commit": a.commit or git_commit(),
        "machine": {"host": platform.node(), "cpu": cpu_model(), "cores": os.cpu_count()},
        "data_dir": os.path.abspath(a.data_dir),
        "settings": {"ranks": a.ranks, "modes": a.modes, "per_rank_batch": a.per_rank_batch,
                     "global_batch": a.global_batch, "num_neg": a.num_neg,
                     "max_steps": a.max_steps, "epochs": a.epochs, "threads": a.threads,
                     "repeats": a.repeats, "ncf_dist_args": a.passthrough},
        "definitions": {
            "samples_per_second": "last epoch: samples (positives x (1+num_neg)) / train seconds",
            "efficiency": "samples_per_second(W) * W0 / (W * samples_per_second(W0)), W0 the "
                          "smallest W of the sweep (normally 1)",
            "cpu_efficiency": "cpu_us_per_sample(W0) / cpu_us_per_sample(W): CPU seconds of "
                              "all ranks per sample over the whole run (start-up included); "
                              "less sensitive than wall time to other jobs on the machine",
            "step split": "rank 0, per step: exchange = embedding all-to-alls + owners' "
                          "optimizer; allreduce = dense gradients; compute = the rest",
        },
        "runs": {},
    }
    try:
        with open(os.path.join(a.data_dir, "metadata.json")) as f:
            md = json.load(f)
        result["dataset"] = {k: md.get(k) for k in ("num_users", "num_items", "num_train",
                                                     "eval_negatives", "dataset_id")}
    except (OSError, ValueError):
        pass
    for mode in a.modes:
        pts = []
        for W in a.ranks:
            runs = [run_once(a, mode, W, rep) for rep in range(a.repeats)]
            if a.dry_run:
                continue
            p = best_run(runs)
            print("scaling: %s W=%d: %.0f samples/s, %.1f ms/step (exchange %.1f, compute %.1f, "
                  "allreduce %.1f), %.2f MiB sent/step by rank 0" %
                  (mode, W, p["samples_per_second"], p["step_seconds"] * 1e3,
                   p["exchange_seconds_per_step"] * 1e3, p["compute_seconds_per_step"] * 1e3,
                   p["allreduce_seconds_per_step"] * 1e3, p["bytes_sent_per_step"] / 2**20),
                  file=sys.stderr, flush=True)
            pts.append(p)
        if pts:
            add_efficiency(pts)
            result["runs"][mode] = pts
    if a.dry_run:
        return 0
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print("scaling: wrote %s.json" % a.out, file=sys.stderr)
    if plot(result, a.out + ".png"):
        print("scaling: wrote %s.png" % a.out, file=sys.stderr)
    print("%-7s %3s %10s %12s %10s %9s %9s %9s %10s %9s %8s" % (
        "mode", "W", "batch", "samples/s", "eff", "exch_ms", "comp_ms", "allr_ms", "MiB/step",
        "cpu_us/s", "cpu_eff"))
    for mode in a.modes:
        for p in result["runs"].get(mode, []):
            print("%-7s %3d %10d %12.0f %9.1f%% %9.1f %9.1f %9.1f %10.2f %9.1f %7.1f%%" %
                  (mode, p["world"], p["global_batch"], p["samples_per_second"],
                   100 * p["efficiency"], p["exchange_seconds_per_step"] * 1e3,
                   p["compute_seconds_per_step"] * 1e3, p["allreduce_seconds_per_step"] * 1e3,
                   p["bytes_sent_per_step"] / 2**20, p["cpu_us_per_sample"],
                   100 * p["cpu_efficiency"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
