#!/usr/bin/python3
"""Plots ncf_dist's per-epoch metrics (--metrics_json, one JSON object per line):
training loss on the left, HR@K and NDCG@K on the right, with optional horizontal
reference lines (the popularity baseline from bench_popularity --json, and any
--ref NAME=HR,NDCG published figures).

  /usr/bin/python3 bench/plot_curves.py --metrics m.jsonl --baseline pop.json --output c.png
Needs matplotlib (Debian's python3-matplotlib; run with /usr/bin/python3).
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--metrics", required=True, help="ncf_dist --metrics_json file")
    ap.add_argument("--baseline", help="bench_popularity --json file")
    ap.add_argument("--ref", action="append", default=[],
                    help="extra reference NAME=HR,NDCG drawn as dotted lines (repeatable)")
    ap.add_argument("--title", default="")
    ap.add_argument("--output", required=True, help="PNG to write")
    a = ap.parse_args()

    rows = read_jsonl(a.metrics)
    if not rows:
        raise SystemExit(f"plot_curves: {a.metrics} holds no epochs")
    epochs = [r["epoch"] for r in rows]
    k = rows[0].get("k", 10)

    fig, (ax_l, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax_l.plot(epochs, [r["loss"] for r in rows], "o-", color="tab:purple", ms=3)
    ax_l.set_xlabel("epoch")
    ax_l.set_ylabel("training loss (BCE, mean over steps)")
    ax_l.grid(alpha=0.3)

    ax_m.plot(epochs, [r["hr"] for r in rows], "o-", color="tab:blue", ms=3, label=f"HR@{k}")
    ax_m.plot(epochs, [r["ndcg"] for r in rows], "s-", color="tab:orange", ms=3,
              label=f"NDCG@{k}")
    if a.baseline:
        with open(a.baseline) as f:
            b = json.load(f)
        ax_m.axhline(b["hr"], color="tab:blue", ls="--", lw=1,
                     label=f"popularity HR@{k} {b['hr']:.3f}")
        ax_m.axhline(b["ndcg"], color="tab:orange", ls="--", lw=1,
                     label=f"popularity NDCG@{k} {b['ndcg']:.3f}")
    for ref in a.ref:
        name, vals = ref.split("=", 1)
        hr, ndcg = (float(v) for v in vals.split(","))
        ax_m.axhline(hr, color="tab:blue", ls=":", lw=1, label=f"{name} HR@{k} {hr:.3f}")
        ax_m.axhline(ndcg, color="tab:orange", ls=":", lw=1, label=f"{name} NDCG@{k} {ndcg:.3f}")
    best = max(rows, key=lambda r: r["hr"])
    ax_m.annotate(f"best HR@{k} {best['hr']:.4f} (epoch {best['epoch']})",
                  (best["epoch"], best["hr"]), textcoords="offset points", xytext=(-10, 8),
                  ha="right", fontsize=8)
    ax_m.set_xlabel("epoch")
    ax_m.set_ylabel("eval metric")
    ax_m.set_ylim(0, 1)
    ax_m.grid(alpha=0.3)
    ax_m.legend(fontsize=8, loc="upper right")
    for ax in (ax_l, ax_m):
        ax.set_xticks(epochs if len(epochs) <= 25 else epochs[:: max(1, len(epochs) // 20)])
    if a.title:
        fig.suptitle(a.title, fontsize=11)
    fig.tight_layout()
    fig.savefig(a.output, dpi=110)
    print(f"plot_curves: wrote {a.output} ({len(rows)} epochs)")


if __name__ == "__main__":
    main()
