#!/usr/bin/env python3
"""Summary of a bench/cluster_scaling.sh run made with --summary choice.

Two tables from runs.tsv, each run's last-epoch metrics (--metrics_json) and its
startup line (the exchange ncf_dist chose, the measured times where --exchange auto
timed the routes, and the C++ cost model's predictions):

  - routes: per rate, shape and payload, the epoch time of flat, two-hop and auto, the
    route auto took and what it measured, and auto's time over the faster fixed route;
  - payloads: per rate, shape and route, the exchange's ms per step and the inter-node
    bytes per step with FP32 and with BF16 payloads, side by side, with the model's
    predicted ms per step beside each.

Writes OUT/exchange_choice.md and OUT/exchange_choice.json.

  python3 bench/summarize_exchange_choice.py OUT
"""
import csv
import json
import math
import os
import re
import sys

CHOSEN = re.compile(r"^ncf_dist: exchange: (two_hop|flat)", re.M)
MEASURED = re.compile(r"measured faster, ([0-9.]+) ms two-hop vs ([0-9.]+) ms flat")
PREDICTED = re.compile(r"predicted per step flat ([0-9.]+) ms, two-hop ([0-9.]+) ms")


def last_epoch(path):
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    return rows[-1] if rows else None


def read_runs(out):
    runs = []
    with open(os.path.join(out, "runs.tsv")) as f:
        for r in csv.DictReader(f, delimiter="\t"):
            ep = last_epoch(os.path.join(out, r["metrics"]))
            log = open(os.path.join(out, r["log"])).read() if os.path.exists(
                os.path.join(out, r["log"])) else ""
            row = {"tag": r["tag"], "rate": r["rate"], "hosts": int(r["hosts"]),
                   "ranks_per_host": int(r["ranks_per_host"]), "mode": r["mode"],
                   "dtype": r.get("exchange_dtype", "fp32"), "exit": int(r["exit"])}
            m = CHOSEN.search(log)
            row["route"] = m.group(1) if m else None
            m = MEASURED.search(log)
            row["measured_ms"] = ({"two_hop": float(m.group(1)), "flat": float(m.group(2))}
                                  if m else None)
            m = PREDICTED.search(log)
            row["predicted_ms"] = ({"flat": float(m.group(1)), "two_hop": float(m.group(2))}
                                   if m else None)
            if ep and row["exit"] == 0:
                st = max(1, ep["steps"])
                row["epoch_s"] = ep["train_seconds"]
                row["exchange_ms_per_step"] = 1e3 * ep["exchange_seconds"] / st
                row["inter_bytes_per_step"] = ep["inter_node_bytes"] / st
            runs.append(row)
    return runs


def fmt(x, spec=".3f"):
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def routes_table(runs):
    lines = ["| rate | hosts x ranks | payload | flat s | two-hop s | auto s | auto took | "
             "auto measured (ms/step flat, two-hop) | model (ms/step flat, two-hop) | "
             "auto / faster |",
             "| --- | --- | --- | ---: | ---: | ---: | --- | --- | --- | ---: |"]
    cases = []
    keys = sorted({(r["rate"], r["hosts"], r["ranks_per_host"], r["dtype"]) for r in runs})
    for rate, H, R, dt in keys:
        by = {r["mode"]: r for r in runs
              if (r["rate"], r["hosts"], r["ranks_per_host"], r["dtype"]) == (rate, H, R, dt)}
        if "auto" not in by:
            continue
        a, f, t = by["auto"], by.get("flat", {}), by.get("two_hop", {})
        fastest = min([x for x in (f.get("epoch_s"), t.get("epoch_s")) if x is not None],
                      default=None)
        ratio = a.get("epoch_s") / fastest if fastest and a.get("epoch_s") else None
        meas = a["measured_ms"] or {}
        pred = a["predicted_ms"] or {}
        lines.append(
            f"| {rate} | {H} x {R} | {dt} | {fmt(f.get('epoch_s'))} | {fmt(t.get('epoch_s'))} | "
            f"{fmt(a.get('epoch_s'))} | {a['route'] or '–'} | "
            f"{fmt(meas.get('flat'))}, {fmt(meas.get('two_hop'))} | "
            f"{fmt(pred.get('flat'))}, {fmt(pred.get('two_hop'))} | {fmt(ratio)} |")
        cases.append({"rate": rate, "hosts": H, "ranks_per_host": R, "dtype": dt,
                      "flat_s": f.get("epoch_s"), "two_hop_s": t.get("epoch_s"),
                      "auto_s": a.get("epoch_s"), "auto_route": a["route"],
                      "auto_measured_ms": meas, "model_ms": pred, "auto_over_faster": ratio})
    return lines, cases


def payload_table(runs):
    lines = ["| rate | hosts x ranks | route | exchange ms/step fp32 | bf16 | fp32 / bf16 | "
             "inter-node bytes/step fp32 | bf16 | bf16 / fp32 | model ms/step fp32, bf16 |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    cases = []
    keys = sorted({(r["rate"], r["hosts"], r["ranks_per_host"], r["mode"]) for r in runs
                   if r["mode"] != "auto"})
    for rate, H, R, mode in keys:
        by = {r["dtype"]: r for r in runs
              if (r["rate"], r["hosts"], r["ranks_per_host"], r["mode"]) == (rate, H, R, mode)}
        if "fp32" not in by or "bf16" not in by:
            continue
        a, b = by["fp32"], by["bf16"]
        speed = (a["exchange_ms_per_step"] / b["exchange_ms_per_step"]
                 if a.get("exchange_ms_per_step") and b.get("exchange_ms_per_step") else None)
        share = (b["inter_bytes_per_step"] / a["inter_bytes_per_step"]
                 if a.get("inter_bytes_per_step") and b.get("inter_bytes_per_step") else None)
        route = "two_hop" if mode == "two_hop" else "flat"
        pa = (a["predicted_ms"] or {}).get(route)
        pb = (b["predicted_ms"] or {}).get(route)
        lines.append(
            f"| {rate} | {H} x {R} | {mode} | {fmt(a.get('exchange_ms_per_step'), '.1f')} | "
            f"{fmt(b.get('exchange_ms_per_step'), '.1f')} | {fmt(speed, '.2f')} | "
            f"{fmt(a.get('inter_bytes_per_step'), '.0f')} | "
            f"{fmt(b.get('inter_bytes_per_step'), '.0f')} | {fmt(share)} | "
            f"{fmt(pa, '.1f')}, {fmt(pb, '.1f')} |")
        cases.append({"rate": rate, "hosts": H, "ranks_per_host": R, "route": mode,
                      "fp32_exchange_ms": a.get("exchange_ms_per_step"),
                      "bf16_exchange_ms": b.get("exchange_ms_per_step"), "speedup": speed,
                      "fp32_inter_bytes": a.get("inter_bytes_per_step"),
                      "bf16_inter_bytes": b.get("inter_bytes_per_step"),
                      "bf16_over_fp32_bytes": share, "model_ms": {"fp32": pa, "bf16": pb}})
    return lines, cases


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: summarize_exchange_choice.py OUT (a bench/cluster_scaling.sh output)")
    out = sys.argv[1]
    if not os.path.exists(os.path.join(out, "runs.tsv")):
        sys.exit(f"summarize_exchange_choice.py: no runs.tsv in {out}")
    runs = read_runs(out)
    failed = [r["tag"] for r in runs if r["exit"] != 0]
    rl, rc = routes_table(runs)
    pl, pc = payload_table(runs)
    md = ["# Exchange routes and payloads on the simulated cluster", ""]
    settings = os.path.join(out, "settings.txt")
    if os.path.exists(settings):
        md += ["```", open(settings).read().rstrip(), "```", ""]
    if failed:
        md += ["Failed runs: " + ", ".join(failed), ""]
    if len(rl) > 2:
        md += ["## --exchange auto against the fixed routes (last epoch's training seconds)",
               ""] + rl + [""]
    if len(pl) > 2:
        md += ["## BF16 against FP32 payloads (last epoch, rank 0)", ""] + pl + [""]
    with open(os.path.join(out, "exchange_choice.md"), "w") as f:
        f.write("\n".join(md))
    with open(os.path.join(out, "exchange_choice.json"), "w") as f:
        json.dump({"routes": rc, "payloads": pc, "runs": runs, "failed": failed}, f, indent=1)
    print("\n".join(md))


if __name__ == "__main__":
    main()
