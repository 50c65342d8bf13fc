#!/usr/bin/env python3
"""Communication-cost model of one ncf_dist training step (docs/comm_cost_model.md).

Prints the tables of that page: predicted step time, samples/s and scaling efficiency
for NeuMF on ml-20m and on a 10^8-user table, on 1..16 nodes of 8 GPUs, with and without
id de-duplication, for the three exchanges ncf_dist has: flat all-to-all, two-hop (inside
the node, then one message per remote node) and two-hop with node-level de-duplication.
The exchange formulas are those of src/embedding/exchange_model.{h,cc} (the C++ model
that --exchange auto uses); tests/test_exchange_model.cc checks that both give the same
numbers through --exchange_case. Every constant is named below with where it comes from;
change one and rerun to see what follows.

  python3 launch/comm_model.py                 # the page's tables (markdown)
  /usr/bin/python3 launch/comm_model.py --cluster_out bench/results/cluster_model_DATE
                                               # also writes the cluster table, JSON and
                                               # plot (matplotlib: Debian's python3)
  python3 launch/comm_model.py --cpu_json bench/results/cpu_scaling_DATE.json
                                               # also: predicted vs measured bytes/step
  python3 launch/comm_model.py --exchange_case N,L,D,k,s,intra_bw,intra_lat,inter_bw,inter_lat,nics
                                               # the three exchange costs of one shape
"""
import argparse
import json
import math
import os
import sys

# ---- links (what one rank sees), as in exchange_model.cc ------------------------------


class Links:
    """intra_bw: bytes/s a rank sends to its node's peers; inter_bw: bytes/s of one NIC;
    *_lat: seconds per message; nics_per_node: the node's ranks share them."""

    def __init__(self, intra_bw, intra_lat, inter_bw, inter_lat, nics_per_node, source):
        self.intra_bw, self.intra_lat = intra_bw, intra_lat
        self.inter_bw, self.inter_lat = inter_bw, inter_lat
        self.nics_per_node, self.source = nics_per_node, source

    def inputs(self):
        return {"intra_GBps": self.intra_bw / 1e9, "intra_us_per_msg": self.intra_lat * 1e6,
                "inter_GBps_per_nic": self.inter_bw / 1e9,
                "inter_us_per_msg": self.inter_lat * 1e6, "nics_per_node": self.nics_per_node,
                "source": self.source}


# Per-message times are assumptions (no anchor): a few microseconds per peer is what
# grouped NCCL sends pay inside a node and across InfiniBand.
H100_NDR = Links(370e9, 2e-6, 48e9, 4e-6, 8,
                 "8xH100 nodes: NVLink all-to-all 370 GB/s (ANCHORS.md), one NDR 400 Gb/s "
                 "NIC per GPU, 48 GB/s (ANCHORS.md); 2 / 4 us per message (assumption)")
A100_HDR = Links(370e9 * 600 / 900, 2e-6, 24e9, 4e-6, 8,
                 "8xA100 nodes: NVLink all-to-all 247 GB/s (the H100 figure x 600/900, the "
                 "NVLink ratio: assumption), one HDR 200 Gb/s NIC per GPU, 24 GB/s "
                 "(ANCHORS.md); 2 / 4 us per message (assumption)")
CPU_ETH = Links(16e9 / 8, 2e-6, 10e9 / 8, 20e-6, 1,
                "CPU ranks: shared memory 2 GB/s, one 10 Gb/s Ethernet port per node; "
                "2 / 20 us per message (assumptions)")


class Hardware:
    def __init__(self, name, links, hbm, gather, gemm_flops, mem_gb):
        self.name, self.links = name, links
        self.hbm_stream = 0.90 * hbm   # sequential read+write streams: ~90% of peak
        self.hbm_gather = gather       # row gather / scatter-add
        self.gemm_flops = gemm_flops   # what the tower GEMMs reach
        self.mem_gb = mem_gb


GEMM_EFF = 0.50        # fraction of TF32 peak the tower GEMMs reach (K = 64..256: small)
# H100 SXM: HBM 3.35 TB/s (ANCHORS.md); gather 2.65 TB/s (FBGEMM 2.77 / 2.54, ANCHORS.md);
# TF32 494.7 TFLOP/s dense (datasheet; 989 is with sparsity).
H100 = Hardware("8xH100-80GB, NDR 400 Gb/s per GPU", H100_NDR, 3.35e12, 2.65e12,
                GEMM_EFF * 494.7e12, 80)
# A100-40GB SXM (the published reference's GPU): HBM 1,555 GB/s, TF32 156 TFLOP/s (datasheet);
# gather at the H100's fraction of peak.
A100 = Hardware("8xA100-40GB, HDR 200 Gb/s per GPU", A100_HDR, 1.555e12,
                1.555e12 * 2.65e12 / 3.35e12, GEMM_EFF * 156e12, 40)
GPUS_PER_NODE = 8
ALPHA_AR_NODE, ALPHA_AR_NET = 15e-6, 40e-6  # one small allreduce (assumption)
LAUNCH = 0.2e-3        # fixed per step: ~40 kernels x ~5 us launch/sync gaps
REF_SLOW = 2.4         # published reference speed / this model's, A100 check below

# ---- model ---------------------------------------------------------------------------
S = 5                  # samples per positive: 1 + num_neg (4)
MF, LAYERS = 64, [256, 256, 128, 64]
D = MF + LAYERS[0] // 2  # 192: one row per entity holds the GMF and MLP parts
F32 = 4


def tower_params():
    p = sum(a * b + b for a, b in zip(LAYERS[:-1], LAYERS[1:]))  # Linear weight + bias
    return p + (MF + LAYERS[-1]) + 1                              # head w·[gmf ; mlp] + c


P_TOWER = tower_params()  # 107,073
# Activation traffic per sample, fp32, bias+ReLU fused into the GEMMs, GMF+head and the
# loss fused (see the page for the count): forward 1,284 floats, backward 3,009.
ACT_BYTES = (1284 + 3009) * F32  # 17,172 B


def unique(n_draws, n_rows):
    """Expected distinct rows in n_draws uniform draws from n_rows, N·(1 − (1 − 1/N)^n)
    as plan.cc's expected_unique: an upper bound on the distinct count for any skewed
    (popularity) distribution, by concavity."""
    if n_rows <= 0 or n_draws <= 0:
        return 0.0
    if n_rows == 1:
        return 1.0
    return n_rows * -math.expm1(n_draws * math.log1p(-1.0 / n_rows))


# ---- the exchange: flat, two-hop, two-hop + node dedup (exchange_model.cc) ------------
COUNT_BYTES = 8  # the counts exchange: one int64 per block


def rank_nic_bw(links, L):
    """One rank's share of its node's NICs (an all-to-all cannot spread one rank's
    traffic over several)."""
    return links.inter_bw * min(1.0, links.nics_per_node / L)


def level_seconds(m, nbytes, lat, bw):
    return m * lat + nbytes / bw if m > 0 else 0.0


def per_key_bytes(d):
    return (0.0, 4.0, 4.0 * d, 4.0 * d)  # counts, ids, vectors, gradients


def _cost():
    return {"seconds": 0.0, "intra_msgs": 0, "inter_msgs": 0, "intra_bytes": 0.0,
            "inter_bytes": 0.0}


def flat_cost(N, L, d, k, links):
    """Per rank per step, 4 exchanges: L−1 local and (N−1)·L remote blocks of k/W keys
    each, both levels draining side by side."""
    W = N * L
    mi, me = L - 1, (N - 1) * L
    be = rank_nic_bw(links, L)
    c = _cost()
    for pk in per_key_bytes(d):
        bi = mi * k / W * pk if pk > 0 else COUNT_BYTES * mi
        bx = me * k / W * pk if pk > 0 else COUNT_BYTES * me
        c["seconds"] += max(level_seconds(mi, bi, links.intra_lat, links.intra_bw),
                            level_seconds(me, bx, links.inter_lat, be))
        c["intra_msgs"] += mi
        c["inter_msgs"] += me
        c["intra_bytes"] += bi
        c["inter_bytes"] += bx
    return c


def two_hop_cost(N, L, d, k, share, links, node_dedup):
    """Hop 1: L−1 local messages of k/L keys (the blocks of the N ranks of one local
    index); hop 2: N−1 messages of k/N keys (times the node's unique share with node
    dedup); the hops run one after the other."""
    s = share if node_dedup else 1.0
    m1, m2 = L - 1, N - 1
    be = rank_nic_bw(links, L)
    c = _cost()
    for pk in per_key_bytes(d):
        b1 = m1 * k / L * pk if pk > 0 else COUNT_BYTES * N * m1
        b2 = m2 * k / N * s * pk if pk > 0 else COUNT_BYTES * L * m2
        c["seconds"] += level_seconds(m1, b1, links.intra_lat, links.intra_bw) + \
            level_seconds(m2, b2, links.inter_lat, be)
        c["intra_msgs"] += m1
        c["inter_msgs"] += m2
        c["intra_bytes"] += b1
        c["inter_bytes"] += b2
    return c


def node_unique_share(tables, L):
    """The node's distinct keys over its ranks' (each rank de-duplicated first):
    sum unique(L·n, R) / (L · sum unique(n, R)) over tables [(R rows, n draws per rank)]."""
    if L == 1:
        return 1.0
    node = sum(unique(L * n, R) for R, n in tables)
    ranks = sum(L * unique(n, R) for R, n in tables)
    return min(1.0, node / ranks) if ranks > 0 else 1.0


MODES = ("flat", "two_hop", "two_hop_node")
MODE_NAMES = {"flat": "flat", "two_hop": "two-hop", "two_hop_node": "two-hop + node dedup"}


# ---- one step ------------------------------------------------------------------------
class Case:
    def __init__(self, name, users, items, per_rank=None, global_batch=None):
        self.name, self.U, self.I = name, users, items
        self.per_rank, self.global_batch = per_rank, global_batch

    def b(self, W):
        return self.per_rank if self.per_rank else self.global_batch / W


def ids_per_table(case, b, dedup):
    """(user ids, item ids) a rank sends after optional dedup of its own b samples. The
    5 samples of a positive share its user, so users dedup at least S-fold."""
    if not dedup:
        return b, b
    return unique(b / S, case.U), unique(b, case.I)


def step(case, W, hw=H100, mode="flat", dedup=False, opt="dense", overlap=False, slow=1.0):
    """Seconds per step on one rank and the pieces, as a dict. mode: flat, two_hop or
    two_hop_node (node dedup, which implies rank dedup). slow multiplies the local work
    (tower, embedding passes, optimizer): 1 = this model's roofline."""
    b = case.b(W)
    L = min(W, GPUS_PER_NODE)
    N = max(1, math.ceil(W / L))
    if mode == "two_hop_node":
        dedup = True
    r = {"W": W, "nodes": N, "b": b, "mode": mode, "dedup": dedup}
    # Tower: FLOP-bound or activation-traffic-bound, whichever is slower.
    t_flop = 6 * P_TOWER * b / hw.gemm_flops
    t_act = ACT_BYTES * b / hw.hbm_stream
    r["tower"] = max(t_flop, t_act)
    nu, ni = ids_per_table(case, b, dedup)
    row = F32 * D
    if W == 1:
        emb_bytes = 4 * (b + b) * row  # gather r+w and sort-reduce r+w, both tables
    else:
        # requester: un-permute fwd + permute/sum bwd = 2(b + n) rows; owner: gather r+w
        # and sort-reduce r+w of the n rows it receives (= n by symmetry) = 4n rows.
        emb_bytes = sum(2 * (b + n) * row + 4 * n * row for n in (nu, ni))
    r["emb"] = emb_bytes / hw.hbm_gather
    # Embedding optimizer on this rank's shard.
    rows_local = (case.U + case.I) / W
    grad_rows = (unique(b * W / S, case.U) + unique(b * W, case.I)) / W
    if opt == "dense":   # p, m, v read + written for every local row: 24 B per element
        r["opt"] = 6 * F32 * D * rows_local / hw.hbm_stream + grad_rows * row / hw.hbm_gather
    else:                # lazy: only the rows that got a gradient, random access
        r["opt"] = (6 * F32 * D + row) * grad_rows / hw.hbm_gather
    # Exchange: both tables together, 4 exchanges (counts, ids, vectors, gradients).
    k = nu + ni
    r["ids_sent"] = k
    r["share"] = node_unique_share([(case.U, b / S), (case.I, b)], L)
    if W == 1:
        c = _cost()
    elif mode == "flat":
        c = flat_cost(N, L, D, k, hw.links)
    else:
        c = two_hop_cost(N, L, D, k, r["share"], hw.links, mode == "two_hop_node")
    r["x"] = c["seconds"]
    r["x_bytes"] = c["intra_bytes"] + c["inter_bytes"]
    r["x_intra_bytes"], r["x_net_bytes"] = c["intra_bytes"], c["inter_bytes"]
    r["x_intra_msgs"], r["x_net_msgs"] = c["intra_msgs"], c["inter_msgs"]
    # Dense allreduce of the replicated tower + head (ring/tree, one buffer).
    if W == 1:
        r["ar"] = 0.0
    else:
        ar_bytes = 2 * (W - 1) / W * P_TOWER * F32
        r["ar"] = ar_bytes / (hw.links.intra_bw if N == 1 else rank_nic_bw(hw.links, L)) + \
            (ALPHA_AR_NODE if N == 1 else ALPHA_AR_NET)
    for key in ("tower", "emb", "opt"):
        r[key] *= slow
    r["local"] = r["tower"] + r["emb"] + r["opt"]
    if overlap:   # ideal: exchanges hidden behind the local work (or vice versa)
        r["step"] = max(r["x"], r["local"]) + r["ar"] + LAUNCH
    else:
        r["step"] = r["local"] + r["x"] + r["ar"] + LAUNCH
    r["sps"] = b * W / r["step"]
    return r


def ms(x):
    return "%.2f" % (x * 1e3)


def mb(x):
    return "%.1f" % (x / 1e6)


def efficiency(rows, base_w):
    base = next(r for r in rows if r["W"] == base_w)
    for r in rows:
        r["eff"] = r["sps"] * base_w / (r["W"] * base["sps"])


WS = [1, 8, 16, 32, 64, 128]


def table_flat(case, opt, ws, base_w, hw=H100):
    out = []
    out.append("| W | nodes | b/rank | tower | emb passes | %s opt | local | ids sent/rank | "
               "to peers MB | of it over IB MB | exchange | allreduce | **step ms** | "
               "**M samples/s** | **eff** | step, overlap | eff, overlap |" % opt)
    out.append("|" + "---|" * 17)
    for dedup in (False, True):
        rows = [step(case, W, hw, dedup=dedup, opt=opt) for W in ws]
        rows_ov = [step(case, W, hw, dedup=dedup, opt=opt, overlap=True) for W in ws]
        efficiency(rows, base_w)
        efficiency(rows_ov, base_w)
        out.append("| %s |  |  |  |  |  |  |  |  |  |  |  |  |  |  |  |  |" %
                   ("*no dedup*" if not dedup else "*dedup*"))
        for r, o in zip(rows, rows_ov):
            out.append("| %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | **%s** | "
                       "**%.0f** | **%.0f%%** | %s | %.0f%% |" % (
                           r["W"], r["nodes"], "{:,}".format(int(r["b"])), ms(r["tower"]),
                           ms(r["emb"]), ms(r["opt"]), ms(r["local"]),
                           "{:,}".format(int(r["ids_sent"])), mb(r["x_bytes"]),
                           mb(r["x_net_bytes"]), ms(r["x"]), ms(r["ar"]), ms(r["step"]),
                           r["sps"] / 1e6, 100 * r["eff"], ms(o["step"]), 100 * o["eff"]))
    return "\n".join(out)


def table_modes(case, opt, ws, base_w, hw=H100):
    """Flat, two-hop and two-hop + node dedup, all with rank-level dedup, W > one node."""
    out = ["| W | nodes | msgs across/rank flat / two-hop | IB MB/GPU flat = two-hop | "
           "IB MB/GPU + node dedup | node unique | NVLink MB flat / two-hop | "
           "exchange ms flat / two-hop / + node | step ms flat / two-hop / + node | "
           "M samples/s, best | eff, best |", "|" + "---|" * 11]
    base = step(case, base_w, hw, dedup=True, opt=opt)
    for W in ws:
        if W <= GPUS_PER_NODE:
            continue
        f, h, n = (step(case, W, hw, mode=m, dedup=True, opt=opt) for m in MODES)
        best = min((f, h, n), key=lambda r: r["step"])
        eff = best["sps"] * base_w / (W * base["sps"])
        out.append("| %d | %d | %d / %d | %s | %s | %.0f%% | %s / %s | %s / %s / %s | "
                   "%s / %s / %s | %.0f (%s) | %.0f%% |" % (
                       W, f["nodes"], f["x_net_msgs"], h["x_net_msgs"], mb(f["x_net_bytes"]),
                       mb(n["x_net_bytes"]), 100 * n["share"], mb(f["x_intra_bytes"]),
                       mb(h["x_intra_bytes"]), ms(f["x"]), ms(h["x"]), ms(n["x"]),
                       ms(f["step"]), ms(h["step"]), ms(n["step"]), best["sps"] / 1e6,
                       MODE_NAMES[best["mode"]], 100 * eff))
    return "\n".join(out)


def a100_check():
    """The same arithmetic for the published reference (ANCHORS.md: NVIDIA's PyTorch NCF,
    TF32, batch 2^20: 22.6M samples/s on 1x A100-40GB, 110M on 8x): replicated tables,
    dense embedding gradients allreduced, one fused Adam over all parameters."""
    ar_bw = 230e9                      # NCCL allreduce bus bandwidth, NVLink3 (assumption)
    B = 1048576
    emb_params = (138493 + 26744) * D
    out = {}
    for W in (1, 8):
        b = B / W
        tower = max(6 * P_TOWER * b / A100.gemm_flops, ACT_BYTES * b / A100.hbm_stream)
        emb = 4 * 2 * b * F32 * D / A100.hbm_gather  # gather r+w, scatter-add r+w, 2 tables
        # dense grad zeroed (4 B) and read by Adam (4 B), p/m/v read+written (24 B): every
        # row of the full (replicated, not sharded) tables on every GPU
        opt = (24 + 8) * emb_params / A100.hbm_stream
        ar = 0 if W == 1 else 2 * (W - 1) / W * (emb_params + P_TOWER) * F32 / ar_bw + 15e-6
        t = tower + emb + opt + ar + LAUNCH
        out[W] = (t, B / t, tower, emb, opt, ar)
    print("\nCheck against the published A100 figures (replicated tables, as the reference):")
    print("| W | tower | emb | Adam (full tables) | allreduce (tables + tower) | step ms | "
          "model M samples/s | published M samples/s | published / model |")
    print("|---|---|---|---|---|---|---|---|---|")
    for W, pub in ((1, 22.6e6), (8, 110e6)):
        t, sps, tower, emb, opt, ar = out[W]
        print("| %d | %s | %s | %s | %s | %s | %.0f | %.1f | %.2f |" % (
            W, ms(tower), ms(emb), ms(opt), ms(ar), ms(t), sps / 1e6, pub / 1e6, pub / sps))
    print("model efficiency at W=8: %.0f%%; published: %.0f%%" %
          (100 * out[8][1] / (8 * out[1][1]), 100 * 110e6 / (8 * 22.6e6)))


def cpu_check(path):
    """ncf_dist counts the bytes each rank sends; the model's formula must give them."""
    with open(path) as f:
        res = json.load(f)
    args = res["settings"]["ncf_dist_args"]
    dedup = "--dedup" in args
    print("\nPredicted vs measured bytes sent per step by rank 0 (%s, %s):" %
          (path, "dedup" if dedup else "no dedup"))
    print("| mode | W | b/rank | model MB | measured MB |")
    print("|---|---|---|---|---|")
    for mode, pts in res["runs"].items():
        for p in pts:
            W = p["world"]
            b = p["per_rank_batch"]
            if W == 1 or dedup:
                model = 0 if W == 1 else float("nan")
            else:
                model = 2 * b * (F32 + 2 * F32 * D) * (W - 1) / W + \
                    2 * (W - 1) / W * P_TOWER * F32
            print("| %s | %d | %d | %.3f | %.3f |" % (mode, W, b, model / 1e6,
                                                     p["bytes_sent_per_step"] / 1e6))


# ---- real clusters: A100 HDR and H100 NDR at 1, 2, 8, 16 nodes ---------------------
CLUSTER_NODES = [1, 2, 8, 16]
ML20M = Case("ml-20m (ml-20m-mlperf: 138,493 users, 26,744 items, batch 1,048,576)",
             138493, 26744, global_batch=1048576)
BIG = Case("10^8 users x 10^6 items, 131,072 samples per GPU", 10**8, 10**6, per_rank=131072)
WORKLOADS = (("ml20m", ML20M, "dense", "strong scaling: one global batch of 1,048,576 "
              "samples (the ml-20m-mlperf preset), dense Adam"),
             ("users1e8", BIG, "lazy", "weak scaling: 131,072 samples per GPU, lazy Adam "
              "(dense Adam sweeps a 29 GB shard per step at 8 GPUs)"))
PLOT_TITLES = {"ml20m": "ml-20m shape, global batch 1,048,576 (strong scaling), dense Adam",
               "users1e8": "10^8 users x 10^6 items, 131,072 samples/GPU (weak), lazy Adam"}


def cluster_rows():
    rows = []
    for key, case, opt, _ in WORKLOADS:
        for hw in (A100, H100):
            for N in CLUSTER_NODES:
                W = N * GPUS_PER_NODE
                rs = {m: step(case, W, hw, mode=m, dedup=True, opt=opt) for m in MODES}
                rows.append({"workload": key, "cluster": hw.name, "nodes": N, "gpus": W,
                             "modes": rs})
    return rows


def cluster_table(rows, key):
    out = ["| cluster | nodes | GPUs | samples/GPU | keys/GPU (both tables, rank dedup) | "
           "node unique | msgs across/GPU/step flat → two-hop | MB across/GPU flat = two-hop → + node | "
           "MB inside node flat → two-hop | **exchange ms** flat / two-hop / + node | "
           "step ms flat / two-hop / + node | M samples/s flat / two-hop / + node |",
           "|" + "---|" * 12]
    for row in rows:
        if row["workload"] != key:
            continue
        f, h, n = (row["modes"][m] for m in MODES)
        share = "%.0f%%" % (100 * n["share"]) if row["nodes"] > 1 else "–"
        out.append("| %s | %d | %d | %s | %s | %s | %d → %d | %s → %s | %s → %s | "
                   "**%s / %s / %s** | %s / %s / %s | %.0f / %.0f / %.0f |" % (
                       row["cluster"].split(",")[0], row["nodes"], row["gpus"],
                       "{:,}".format(int(f["b"])), "{:,}".format(int(f["ids_sent"])),
                       share, f["x_net_msgs"], h["x_net_msgs"],
                       mb(f["x_net_bytes"]), mb(n["x_net_bytes"]), mb(f["x_intra_bytes"]),
                       mb(h["x_intra_bytes"]), ms(f["x"]), ms(h["x"]), ms(n["x"]),
                       ms(f["step"]), ms(h["step"]), ms(n["step"]), f["sps"] / 1e6,
                       h["sps"] / 1e6, n["sps"] / 1e6))
    return "\n".join(out)


def cluster_inputs():
    return {
        "model": "launch/comm_model.py (formulas of src/embedding/exchange_model.cc); "
                 "a roofline, not a measurement",
        "clusters": {hw.name: {"links": hw.links.inputs(), "hbm_stream_TBps":
                               hw.hbm_stream / 1e12, "gather_TBps": hw.hbm_gather / 1e12,
                               "tower_TFLOPs": hw.gemm_flops / 1e12, "gpu_memory_GB":
                               hw.mem_gb} for hw in (A100, H100)},
        "gpus_per_node": GPUS_PER_NODE,
        "nodes": CLUSTER_NODES,
        "D": D, "samples_per_positive": S, "tower_params": P_TOWER,
        "workloads": {key: {"users": case.U, "items": case.I, "global_batch":
                            case.global_batch, "per_gpu_batch": case.per_rank,
                            "optimizer": opt, "what": what}
                      for key, case, opt, what in WORKLOADS},
        "dedup": "rank-level dedup in every mode (the 5 samples of a positive share its user; "
                 "uniform draws otherwise); node dedup: the node's distinct keys over its "
                 "ranks', uniform draws",
        "allreduce_latency_us": {"node": ALPHA_AR_NODE * 1e6, "net": ALPHA_AR_NET * 1e6},
        "fixed_per_step_ms": LAUNCH * 1e3,
        "not_modelled": "the pack/unpack between the hops and the node dedup's sort "
                        "(local memory passes); overlap of exchange and compute",
    }


def write_cluster(out_dir):
    rows = cluster_rows()
    os.makedirs(out_dir, exist_ok=True)
    inputs = cluster_inputs()
    md = ["# Model: flat vs two-hop vs two-hop + node dedup on A100 HDR and H100 NDR "
          "clusters", "",
          "**A model's prediction, not a measurement** (`/usr/bin/python3 "
          "launch/comm_model.py --cluster_out %s`). Per GPU, per training step; every mode "
          "with rank-level dedup. See docs/comm_cost_model.md sections 9 and 10 for the "
          "formulas and the reading." % out_dir, ""]
    for key, case, opt, what in WORKLOADS:
        md += ["## %s" % case.name, "", what + ".", "", cluster_table(rows, key), ""]
    md += ["## Inputs", ""]
    for hw in (A100, H100):
        l = hw.links
        md.append("- %s: intra-node %.0f GB/s, %.0f us per message; %.0f GB/s per NIC, %d "
                  "NICs per node, %.0f us per message; HBM streams %.2f TB/s, gathers %.2f "
                  "TB/s, tower GEMMs %.0f TFLOP/s. %s." % (
                      hw.name, l.intra_bw / 1e9, l.intra_lat * 1e6, l.inter_bw / 1e9,
                      l.nics_per_node, l.inter_lat * 1e6, hw.hbm_stream / 1e12,
                      hw.hbm_gather / 1e12, hw.gemm_flops / 1e12, l.source))
    for k in ("dedup", "not_modelled"):
        md.append("- %s: %s." % (k.replace("_", " "), inputs[k]))
    md.append("- D = %d floats per key; %d samples per positive; tower %d parameters; "
              "allreduce %.0f / %.0f us inside / across nodes; %.1f ms fixed per step." % (
                  D, S, P_TOWER, ALPHA_AR_NODE * 1e6, ALPHA_AR_NET * 1e6, LAUNCH * 1e3))
    with open(os.path.join(out_dir, "cluster_model.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    keep = ("b", "ids_sent", "share", "x", "x_intra_bytes", "x_net_bytes", "x_intra_msgs",
            "x_net_msgs", "tower", "emb", "opt", "ar", "step", "sps")
    js = {"inputs": inputs, "rows": [
        {k: v for k, v in r.items() if k != "modes"} |
        {"modes": {m: {k: r["modes"][m][k] for k in keep} for m in MODES}} for r in rows],
        "units": "seconds, bytes, messages per GPU per step; sps = samples/s"}
    with open(os.path.join(out_dir, "cluster_model.json"), "w") as f:
        json.dump(js, f, indent=1)
        f.write("\n")
    plotted = plot_cluster(rows, os.path.join(out_dir, "cluster_model.png"))
    print("comm_model: wrote %s/cluster_model.md, .json%s" %
          (out_dir, ", .png" if plotted else " (no matplotlib: no plot)"), file=sys.stderr)
    return rows


def plot_cluster(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(2, 2, figsize=(13, 9))
    colors = {A100.name: "tab:blue", H100.name: "tab:green"}
    styles = {"flat": ("o", "-"), "two_hop": ("s", "--"), "two_hop_node": ("^", ":")}
    for col, (key, case, opt, what) in enumerate(WORKLOADS):
        for hw in (A100, H100):
            pts = [r for r in rows if r["workload"] == key and r["cluster"] == hw.name]
            x = [r["nodes"] for r in pts]
            for m in MODES:
                mk, ls = styles[m]
                lbl = "%s, %s" % (hw.name.split(",")[0], MODE_NAMES[m])
                ax[0][col].plot(x, [r["modes"][m]["x"] * 1e3 for r in pts], marker=mk,
                                ls=ls, color=colors[hw.name], label=lbl)
                ax[1][col].plot(x, [r["modes"][m]["sps"] / 1e6 for r in pts], marker=mk,
                                ls=ls, color=colors[hw.name], label=lbl)
        ax[0][col].set_title(PLOT_TITLES[key], fontsize=10)
        ax[0][col].set_ylabel("embedding exchange, ms per step (model)")
        ax[1][col].set_ylabel("M samples/s, whole job (model)")
        for a in (ax[0][col], ax[1][col]):
            a.set_xscale("log", base=2)
            a.set_xticks(CLUSTER_NODES)
            a.set_xticklabels([str(n) for n in CLUSTER_NODES])
            a.set_xlabel("nodes of 8 GPUs")
            a.set_ylim(bottom=0)
            a.grid(alpha=0.3)
        ax[0][col].legend(fontsize=7)
    fig.suptitle("MODEL PREDICTION, not a measurement: launch/comm_model.py "
                 "(src/embedding/exchange_model.cc formulas)", fontsize=11)
    foot = "inputs: " + "; ".join(
        "%s: NVLink %.0f GB/s, NIC %.0f GB/s x %d/node, %g/%g us per message" % (
            hw.name.split(",")[0], hw.links.intra_bw / 1e9, hw.links.inter_bw / 1e9,
            hw.links.nics_per_node, hw.links.intra_lat * 1e6, hw.links.inter_lat * 1e6)
        for hw in (A100, H100)) + "; rank dedup in every mode; D = 192; fp32"
    fig.text(0.5, 0.005, foot, ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.02, 1, 0.96))
    fig.savefig(path, dpi=110)
    return True


def exchange_case(spec):
    """The three costs of one shape and set of links, for tests/test_exchange_model.cc."""
    v = spec.split(",")
    if len(v) != 10:
        sys.exit("--exchange_case needs N,L,D,k,s,intra_bw,intra_lat,inter_bw,inter_lat,nics "
                 "(10 values), got %r" % spec)
    N, L, d, k = int(v[0]), int(v[1]), int(v[2]), int(v[3])
    share = float(v[4])
    links = Links(float(v[5]), float(v[6]), float(v[7]), float(v[8]), int(v[9]), "case")
    for name, c in (("flat", flat_cost(N, L, d, k, links)),
                    ("two_hop", two_hop_cost(N, L, d, k, share, links, False)),
                    ("two_hop_node", two_hop_cost(N, L, d, k, share, links, True))):
        print("%s %.17g %d %d %.17g %.17g" % (name, c["seconds"], c["intra_msgs"],
                                              c["inter_msgs"], c["intra_bytes"],
                                              c["inter_bytes"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu_json", help="a launch/scaling.py result to compare bytes with")
    ap.add_argument("--cluster_out", help="write cluster_model.{md,json,png} to this folder")
    ap.add_argument("--exchange_case", help="print the three exchange costs of one shape: "
                    "N,L,D,k,s,intra_bw,intra_lat,inter_bw,inter_lat,nics (SI units)")
    a = ap.parse_args()
    if a.exchange_case:
        exchange_case(a.exchange_case)
        return
    ml20 = ML20M
    big = BIG
    print("tower + head parameters: %d (%.2f MB fp32); D = %d; activation bytes/sample %d"
          % (P_TOWER, P_TOWER * 4 / 1e6, D, ACT_BYTES))
    print("\n### ml-20m, strong scaling, global batch 1,048,576, dense Adam, flat all-to-all\n")
    print(table_flat(ml20, "dense", WS, 1))
    print("\n### ml-20m, flat vs two-hop vs two-hop + node dedup (all with dedup)\n")
    print(table_modes(ml20, "dense", WS, 1))
    big_ws = [8, 16, 32, 64, 128]
    for opt in ("dense", "lazy"):
        print("\n### 10^8 users x 10^6 items, weak scaling, 131,072 samples/GPU, %s Adam, "
              "flat all-to-all (efficiency vs W = 8)\n" % opt)
        print(table_flat(big, opt, big_ws, 8))
    print("\n### 10^8 users, flat vs two-hop vs two-hop + node dedup (dedup, lazy Adam)\n")
    print(table_modes(big, "lazy", big_ws, 8))
    strong = Case("1e8 users strong", 10**8, 10**6, global_batch=1048576)
    print("\n### 10^8 users, strong scaling at 1,048,576 samples/step, dedup, flat\n")
    print("| W | dense Adam step ms | M samples/s | eff | lazy Adam step ms | M samples/s | eff |")
    print("|---|---|---|---|---|---|---|")
    rd = [step(strong, W, dedup=True, opt="dense") for W in big_ws]
    rl = [step(strong, W, dedup=True, opt="lazy") for W in big_ws]
    efficiency(rd, 8)
    efficiency(rl, 8)
    for x, y in zip(rd, rl):
        print("| %d | %s | %.0f | %.0f%% | %s | %.0f | %.0f%% |" % (
            x["W"], ms(x["step"]), x["sps"] / 1e6, 100 * x["eff"], ms(y["step"]),
            y["sps"] / 1e6, 100 * y["eff"]))
    print("\n### ml-20m with the local work at the reference's speed (x%.1f, see the A100 "
          "check)\n" % REF_SLOW)
    print("| W | step ms no dedup | eff | step ms dedup | M samples/s | eff | "
          "step ms two-hop + node dedup | eff |")
    print("|---|---|---|---|---|---|---|---|")
    rn = [step(ml20, W, slow=REF_SLOW) for W in WS]
    rd = [step(ml20, W, dedup=True, slow=REF_SLOW) for W in WS]
    rh = [step(ml20, W, mode="two_hop_node", slow=REF_SLOW) for W in WS]
    for rows in (rn, rd, rh):
        efficiency(rows, 1)
    for x, y, z in zip(rn, rd, rh):
        print("| %d | %s | %.0f%% | %s | %.0f | %.0f%% | %s | %.0f%% |" % (
            x["W"], ms(x["step"]), 100 * x["eff"], ms(y["step"]), y["sps"] / 1e6,
            100 * y["eff"], ms(z["step"]), 100 * z["eff"]))
    rows = cluster_rows()
    for key, case, opt, what in WORKLOADS:
        print("\n### Clusters, %s: %s\n" % (case.name, what))
        print(cluster_table(rows, key))
    a100_check()
    if a.cluster_out:
        write_cluster(a.cluster_out)
    if a.cpu_json:
        cpu_check(a.cpu_json)


if __name__ == "__main__":
    main()
