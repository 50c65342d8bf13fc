#!/usr/bin/env python3
"""Summary of a bench/cluster_scaling.sh run: measured against modelled, per run.

Reads OUT/runs.tsv and each run's --metrics_json lines (the last epoch: rank 0's step
time, exchange time, intra- and inter-node messages and bytes) and log (the exchange
ncf_dist chose and the C++ model's predicted times from its startup line), and puts
beside them launch/comm_model.py's prediction for the same shape and link (the same
formulas as src/embedding/exchange_model.cc):
  - at the uniform-draw key estimate (what ncf_dist decides with), and
  - at the keys per rank and node unique share inferred from the measured bytes (the
    synthetic set's popular items repeat more than uniform draws), which separates the
    link model's error from the key estimate's.
Writes OUT/cluster_scaling.json, .md and .png (the plot needs matplotlib: Debian's
/usr/bin/python3 with python3-matplotlib).

  python3 bench/summarize_cluster.py OUT
"""
import csv
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "launch"))
import comm_model as cm  # noqa: E402

D = cm.D  # ml-20m-mlperf: 64 + 256/2
PER_KEY = 4 + 8 * D  # ids, vectors, gradients
CPP_PREDICTION = re.compile(r"predicted per step flat ([0-9.]+) ms, two-hop ([0-9.]+) ms, "
                            r"two-hop \+ node dedup ([0-9.]+) ms")
CPP_FLAT_ONLY = re.compile(r"predicted ([0-9.]+) ms/step")  # one node or one rank per node
MODE_MODEL = {"flat": "flat", "two_hop": "two_hop", "node": "two_hop_node"}


def links_from_topology(spec):
    """--topology key=value,... over the CPU defaults, as exchange_model.cc parses it."""
    l = cm.Links(cm.CPU_ETH.intra_bw, cm.CPU_ETH.intra_lat, cm.CPU_ETH.inter_bw,
                 cm.CPU_ETH.inter_lat, cm.CPU_ETH.nics_per_node, "--topology " + spec)
    for item in spec.split(","):
        if not item.strip():
            continue
        key, value = (x.strip() for x in item.split("=", 1))
        v = float(value)
        if key == "intra_gbps":
            l.intra_bw = v * 1e9 / 8
        elif key == "inter_gbps":
            l.inter_bw = v * 1e9 / 8
        elif key == "intra_us":
            l.intra_lat = v * 1e-6
        elif key == "inter_us":
            l.inter_lat = v * 1e-6
        elif key == "nics_per_node":
            l.nics_per_node = int(v)
        else:
            sys.exit("summarize_cluster: unknown --topology key %r in %r" % (key, spec))
    return l


def last_epoch(path):
    try:
        with open(path) as f:
            lines = [json.loads(x) for x in f if x.strip()]
    except (OSError, ValueError):
        return None
    return lines[-1] if lines else None


def read_log(path):
    chosen, cpp = "", None
    try:
        text = open(path, errors="replace").read()
    except OSError:
        return chosen, cpp
    for line in text.splitlines():
        if line.startswith("ncf_dist: exchange:"):
            chosen = line.split(":", 2)[2].strip()
            m = CPP_PREDICTION.search(line)
            if m:
                cpp = {"flat": float(m.group(1)) / 1e3, "two_hop": float(m.group(2)) / 1e3,
                       "node": float(m.group(3)) / 1e3}
            elif CPP_FLAT_ONLY.search(line):
                cpp = {"flat": float(CPP_FLAT_ONLY.search(line).group(1)) / 1e3}
    return chosen, cpp


def dataset_shape(out):
    """(users, items) of the run's dataset: its metadata.json, else the ml-20m shape."""
    try:
        for line in open(os.path.join(out, "settings.txt")):
            if line.startswith("data: "):
                md = json.load(open(os.path.join(line[6:].strip(), "metadata.json")))
                return int(md["num_users"]), int(md["num_items"])
    except (OSError, ValueError, KeyError):
        pass
    return 138493, 26744


def counts_bytes(N, L, two_hop):
    """Bytes of the counts exchange per step across nodes, as the model counts them."""
    return cm.COUNT_BYTES * (L * (N - 1) if two_hop else (N - 1) * L)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: summarize_cluster.py OUT (a bench/cluster_scaling.sh output folder)")
    out = sys.argv[1]
    users, items = dataset_shape(out)
    with open(os.path.join(out, "runs.tsv")) as f:
        runs = list(csv.DictReader(f, delimiter="\t"))
    rows = []
    for r in runs:
        H, R = int(r["hosts"]), int(r["ranks_per_host"])
        b = int(r["per_rank_batch"])
        ep = last_epoch(os.path.join(out, r["metrics"]))
        chosen, cpp = read_log(os.path.join(out, r["log"]))
        row = {"tag": r["tag"], "rate": r["rate"], "hosts": H, "ranks_per_host": R,
               "mode": r["mode"], "exit": int(r["exit"]), "chosen": chosen,
               "topology": r["topology"], "per_rank_batch": b}
        links = links_from_topology(r["topology"])
        # The model's mode: the asked one, unless the route falls back to flat.
        fallback = H == 1 or R == 1
        mm = "flat" if fallback else MODE_MODEL[r["mode"]]
        k = cm.unique(b / cm.S, users) + cm.unique(b, items)
        s = cm.node_unique_share([(users, b / cm.S), (items, b)], R)
        row["model"] = {"keys_per_rank": k, "node_share": s,
                        "cost": cost(mm, H, R, k, s, links)}
        row["cpp_all"] = cpp  # the startup line's three predictions (flat only on one node)
        if cpp is None:
            row["cpp_seconds"] = None
        else:
            row["cpp_seconds"] = cpp.get("flat" if fallback else r["mode"])
        if ep and ep.get("steps"):
            st = ep["steps"]
            row["measured"] = {
                "step_seconds": ep["train_seconds"] / st,
                "exchange_seconds": ep["exchange_seconds"] / st,
                "compute_seconds": ep["compute_seconds"] / st,
                "allreduce_seconds": ep["allreduce_seconds"] / st,
                "samples_per_second": ep["samples_per_second"],
                "intra_msgs": ep.get("intra_node_msgs", float("nan")) / st,
                "intra_bytes": ep.get("intra_node_bytes", float("nan")) / st,
                "inter_msgs": ep.get("inter_node_msgs", float("nan")) / st,
                "inter_bytes": ep.get("inter_node_bytes", float("nan")) / st,
                "steps": st}
        rows.append(row)
    infer_keys(rows)
    for row in rows:
        if "inferred" in row:
            H, R = row["hosts"], row["ranks_per_host"]
            mm = "flat" if H == 1 or R == 1 else MODE_MODEL[row["mode"]]
            inf = row["inferred"]
            row["model_at_measured"] = cost(mm, H, R, inf["keys_per_rank"],
                                            inf.get("node_share", row["model"]["node_share"]),
                                            links_from_topology(row["topology"]))
    with open(os.path.join(out, "cluster_scaling.json"), "w") as f:
        json.dump({"tool": "bench/summarize_cluster.py", "dataset": {"users": users,
                   "items": items}, "D": D, "rows": rows,
                   "definitions": definitions()}, f, indent=1)
        f.write("\n")
    md = table(rows, out)
    with open(os.path.join(out, "cluster_scaling.md"), "w") as f:
        f.write(md)
    print(md)
    if plot(rows, os.path.join(out, "cluster_scaling.png")):
        print("summarize_cluster: wrote %s/cluster_scaling.{json,md,png}" % out, file=sys.stderr)
    else:
        print("summarize_cluster: wrote %s/cluster_scaling.{json,md}; no matplotlib in %s, "
              "no plot" % (out, sys.executable), file=sys.stderr)


def cost(model_mode, H, R, k, s, links):
    if model_mode == "flat":
        return cm.flat_cost(H, R, D, k, links)
    return cm.two_hop_cost(H, R, D, k, s, links, model_mode == "two_hop_node")


def infer_keys(rows):
    """Keys per rank from a flat run's measured bytes (the same per (H, R) at every rate:
    the steps draw the same samples), and the node unique share from a node run's."""
    keys = {}
    for row in rows:
        m = row.get("measured")
        if not m or row["mode"] != "flat":
            continue
        H, R = row["hosts"], row["ranks_per_host"]
        W = H * R
        if H > 1 and m["inter_bytes"] == m["inter_bytes"]:
            k = (m["inter_bytes"] - counts_bytes(H, R, False)) / ((H - 1) / H * PER_KEY)
        elif R > 1 and m["intra_bytes"] == m["intra_bytes"]:
            k = (m["intra_bytes"] - cm.COUNT_BYTES * (R - 1)) / ((R - 1) / W * PER_KEY)
        else:
            continue
        keys[(H, R)] = max(k, 0.0)
    for row in rows:
        m = row.get("measured")
        k = keys.get((row["hosts"], row["ranks_per_host"]))
        if not m or k is None:
            continue
        row["inferred"] = {"keys_per_rank": k}
        H, R = row["hosts"], row["ranks_per_host"]
        if row["mode"] == "node" and H > 1 and R > 1 and k > 0:
            s = (m["inter_bytes"] - counts_bytes(H, R, True)) / ((H - 1) / H * k * PER_KEY)
            row["inferred"]["node_share"] = min(max(s, 1e-9), 1.0)


def definitions():
    return {
        "measured": "rank 0, per step, the last epoch: step = train seconds / steps; "
                    "exchange = the embedding exchanges with the owners' gathers and "
                    "optimizer step (ncf_dist's exchange phase); messages and bytes = the "
                    "counts and all-to-all exchanges to ranks on rank 0's host (intra) and "
                    "on other hosts (inter)",
        "model": "launch/comm_model.py flat_cost / two_hop_cost (exchange_model.cc's "
                 "formulas): communication only, 4 exchanges, uniform-draw keys",
        "model_at_measured": "the same at the keys per rank inferred from a flat run's "
                             "inter-node bytes and, for node dedup, the node share inferred "
                             "from its own",
        "cpp_seconds": "the C++ model's prediction printed at startup for the asked mode",
    }


def f_ms(x):
    return "%.1f" % (x * 1e3) if x is not None and x == x else "–"


def f_mb(x):
    return "%.2f" % (x / 1e6) if x is not None and x == x else "–"


def f_n(x):
    return "%.0f" % x if x is not None and x == x else "–"


def table(rows, out):
    lines = ["# Simulated cluster: flat vs two-hop vs two-hop + node dedup", "",
             "Measured on %s (bench/cluster_scaling.sh; settings in settings.txt); the model "
             "columns are **predictions** of launch/comm_model.py for the same shape and link "
             "(communication only: the measured exchange phase also holds the owners' "
             "gathers and optimizer step)." % out, "",
             "| rate | hosts x ranks | mode | exchange chosen | step ms | exchange ms | "
             "model ms (uniform keys / measured keys / C++ at startup) | inter msgs/step "
             "meas / model | inter MB/step meas / model | intra MB/step meas / model | "
             "keys/rank meas / model | node share meas / model |",
             "|" + "---|" * 12]
    for r in rows:
        m = r.get("measured", {})
        mod = r["model"]["cost"]
        at = r.get("model_at_measured", {})
        inf = r.get("inferred", {})
        if r["exit"]:
            chosen = "failed (exit %d)" % r["exit"]
        elif r["chosen"]:
            chosen = r["chosen"].split(" (")[0]
        else:
            chosen = "none" if r["hosts"] * r["ranks_per_host"] == 1 else "?"
        share_meas = inf.get("node_share")
        lines.append("| %s | %d x %d | %s | %s | %s | %s | %s / %s / %s | %s / %s | %s / %s | "
                     "%s / %s | %s / %s | %s / %s |" % (
                         r["rate"], r["hosts"], r["ranks_per_host"], r["mode"], chosen,
                         f_ms(m.get("step_seconds")), f_ms(m.get("exchange_seconds")),
                         f_ms(mod["seconds"]), f_ms(at.get("seconds")), f_ms(r["cpp_seconds"]),
                         f_n(m.get("inter_msgs")), f_n(mod["inter_msgs"]),
                         f_mb(m.get("inter_bytes")), f_mb(mod["inter_bytes"]),
                         f_mb(m.get("intra_bytes")), f_mb(mod["intra_bytes"]),
                         f_n(inf.get("keys_per_rank")), f_n(r["model"]["keys_per_rank"]),
                         "%.0f%%" % (100 * share_meas) if share_meas else "–",
                         "%.0f%%" % (100 * r["model"]["node_share"])
                         if r["mode"] == "node" else "–"))
    lines.append("")
    return "\n".join(lines) + "\n"


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    done = [r for r in rows if r.get("measured")]
    if not done:
        return False
    colors = {"flat": "tab:blue", "two_hop": "tab:orange", "node": "tab:green"}
    rates = sorted({r["rate"] for r in done})
    markers = dict(zip(rates, "osD^v<>"))
    fig, ax = plt.subplots(1, 3, figsize=(16, 5))
    span = []
    for r in done:
        x = r.get("model_at_measured", r["model"]["cost"])["seconds"] * 1e3
        y = r["measured"]["exchange_seconds"] * 1e3
        if x > 0 and y > 0:  # one rank: nothing to model
            ax[0].scatter(x, y, color=colors[r["mode"]], marker=markers[r["rate"]])
            span += [x, y]
        ax[1].scatter(r["model"]["cost"]["inter_bytes"] / 1e6,
                      r["measured"]["inter_bytes"] / 1e6, color=colors[r["mode"]],
                      marker=markers[r["rate"]])
    if span:
        ax[0].plot([min(span) / 1.5, max(span) * 1.5], [min(span) / 1.5, max(span) * 1.5], ":",
                   color="gray", lw=1, label="measured = model")
    top = max([r["model"]["cost"]["inter_bytes"] / 1e6 for r in done] +
              [r["measured"]["inter_bytes"] / 1e6 for r in done] + [1e-3])
    ax[1].plot([0, 1.05 * top], [0, 1.05 * top], ":", color="gray", lw=1)
    for a, what in ((ax[0], "exchange ms per step"), (ax[1], "inter-node MB per step")):
        a.set_xlabel("model (prediction): " + what)
        a.set_ylabel("measured: " + what)
    ax[0].set_xscale("log")
    ax[0].set_yscale("log")
    ax[0].set_title("exchange time: measured vs model at the measured keys (log-log)",
                    fontsize=9)
    ax[1].set_title("bytes across hosts: measured vs model (uniform keys)", fontsize=9)
    for m, c in colors.items():
        ax[0].scatter([], [], color=c, label=m)
    for rate, mk in markers.items():
        ax[0].scatter([], [], color="gray", marker=mk, label=rate)
    ax[0].legend(fontsize=8)
    # Step time per configuration, one bar per mode.
    configs = []
    for r in done:
        c = (r["rate"], r["hosts"], r["ranks_per_host"])
        if c not in configs:
            configs.append(c)
    width = 0.27
    for i, mode in enumerate(("flat", "two_hop", "node")):
        ys = []
        for c in configs:
            hit = [r for r in done if (r["rate"], r["hosts"], r["ranks_per_host"]) == c and
                   r["mode"] == mode]
            ys.append(hit[0]["measured"]["step_seconds"] * 1e3 if hit else 0)
        ax[2].bar([j + (i - 1) * width for j in range(len(configs))], ys, width,
                  color=colors[mode], label=mode)
    ax[2].set_xticks(range(len(configs)))
    ax[2].set_xticklabels(["%s\n%dx%d" % c for c in configs], fontsize=7)
    ax[2].set_ylabel("measured step ms (rank 0)")
    ax[2].set_title("step time per rate and hosts x ranks", fontsize=9)
    ax[2].legend(fontsize=8)
    fig.suptitle("ncf_dist on a simulated cluster (tc-shaped links): measured, with the cost "
                 "model's predictions", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


if __name__ == "__main__":
    main()
