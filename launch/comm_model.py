#!/usr/bin/env python3
"""Communication-cost model of one ncf_dist training step (docs/comm_cost_model.md).

Prints the tables of that page: predicted step time, samples/s and scaling efficiency
for NeuMF on ml-20m and on a 10^8-user table, on 1..16 nodes of 8 H100 GPUs, with and
without id de-duplication and with a hierarchical (node-first) exchange. Every constant
is named below with where it comes from; change one and rerun to see what follows.

  python3 launch/comm_model.py                 # the page's tables (markdown)
  python3 launch/comm_model.py --cpu_json bench/results/cpu_scaling_DATE.json
                                               # also: predicted vs measured bytes/step
"""
import argparse
import json
import math

# ---- hardware (per GPU), H100 SXM ---------------------------------------------------
HBM = 3.35e12          # B/s, datasheet; ANCHORS.md
HBM_STREAM = 0.90 * HBM  # sequential read+write streams (Adam, activations): ~90% of peak
HBM_GATHER = 2.65e12   # row gather / scatter-add: FBGEMM 2.77 / 2.54 TB/s (ANCHORS.md)
TF32_PEAK = 494.7e12   # dense TF32 tensor-core FLOP/s, H100 SXM datasheet (989 is with sparsity)
GEMM_EFF = 0.50        # fraction of TF32 peak the tower GEMMs reach (K = 64..256: small)
NVLINK_A2A = 370e9     # NCCL all-to-all bus bandwidth inside a node (ANCHORS.md)
NIC = 48e9             # per-GPU 400 Gb/s NIC, NCCL across nodes (ANCHORS.md)
GPUS_PER_NODE = 8
# Latencies: assumptions (no anchor), typical of NCCL small-message timings.
ALPHA_A2A_NODE = 20e-6            # one all-to-all inside a node
ALPHA_A2A_NET = 30e-6             # one all-to-all across nodes, plus per peer:
ALPHA_A2A_PEER = 0.5e-6           #   grouped send/recv issue cost per remote peer
ALPHA_AR_NODE, ALPHA_AR_NET = 15e-6, 40e-6  # one small allreduce
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
    """Expected distinct rows in n_draws uniform draws from n_rows: an upper bound on
    the distinct count for any skewed (popularity) distribution, by concavity."""
    if n_rows <= 0:
        return 0.0
    return n_rows * (1 - math.exp(-n_draws / n_rows))


class Case:
    def __init__(self, name, users, items, per_rank=None, global_batch=None):
        self.name, self.U, self.I = name, users, items
        self.per_rank, self.global_batch = per_rank, global_batch

    def b(self, W):
        return self.per_rank if self.per_rank else self.global_batch / W


def ids_per_table(case, b, samples_in_group, dedup):
    """(user ids, item ids) a group of ranks sends, per rank, after optional dedup.
    The 5 samples of a positive share its user, so users dedup at least S-fold."""
    if not dedup:
        return b, b
    groups = samples_in_group / b
    u = unique(samples_in_group / S, case.U) / groups
    i = unique(samples_in_group, case.I) / groups
    return u, i


def step(case, W, dedup=False, hier=False, opt="dense", overlap=False, slow=1.0):
    """Seconds per step on one rank and the pieces, as a dict. slow multiplies the local
    work (tower, embedding passes, optimizer): 1 = this model's roofline."""
    b = case.b(W)
    N = max(1, math.ceil(W / GPUS_PER_NODE))
    g = min(W, GPUS_PER_NODE)
    r = {"W": W, "nodes": N, "b": b}
    # Tower: FLOP-bound or activation-traffic-bound, whichever is slower.
    t_flop = 6 * P_TOWER * b / (GEMM_EFF * TF32_PEAK)
    t_act = ACT_BYTES * b / HBM_STREAM
    r["tower"] = max(t_flop, t_act)
    # Ids this rank sends per table (flat: dedup over its own b samples).
    nu, ni = ids_per_table(case, b, b, dedup)
    row = F32 * D
    if W == 1:
        emb_bytes = 4 * (b + b) * row  # gather r+w and sort-reduce r+w, both tables
    else:
        # requester: un-permute fwd + permute/sum bwd = 2(b + n) rows; owner: gather r+w
        # and sort-reduce r+w of the n rows it receives (= n by symmetry) = 4n rows.
        emb_bytes = sum(2 * (b + n) * row + 4 * n * row for n in (nu, ni))
    r["emb"] = emb_bytes / HBM_GATHER
    # Embedding optimizer on this rank's shard.
    rows_local = (case.U + case.I) / W
    grad_rows = (unique(case.b(W) * W / S, case.U) + unique(case.b(W) * W, case.I)) / W
    if opt == "dense":   # p, m, v read + written for every local row: 24 B per element
        r["opt"] = 6 * F32 * D * rows_local / HBM_STREAM + grad_rows * row / HBM_GATHER
    else:                # lazy: only the rows that got a gradient, random access
        r["opt"] = (6 * F32 * D + row) * grad_rows / HBM_GATHER
    # Exchange: per table ids (4 B) out, vectors (4D B) back, gradients (4D B) out.
    per_id = F32 + 2 * row
    if W == 1:
        r["x_bytes"], r["x_net_bytes"], r["x"] = 0.0, 0.0, 0.0
    elif not hier or N == 1:
        V = (nu + ni) * per_id                     # volume incl. the own block
        intra = V * (g - 1) / W
        inter = V * (W - g) / W
        r["x_bytes"], r["x_net_bytes"] = intra + inter, inter
        bw = max(intra / NVLINK_A2A, inter / NIC)
        alpha = ALPHA_A2A_NODE if N == 1 else ALPHA_A2A_NET + ALPHA_A2A_PEER * (W - 1)
        r["x"] = bw + 8 * alpha                    # 2 tables x (counts, ids, rows, grads)
    else:
        # Stage 1 on NVLink: route each (deduped) id to the local GPU whose local rank is
        # the owner's; that GPU dedups the node's ids for its owners; stage 2 crosses the
        # network only between GPUs of the same local rank (N - 1 peers).
        V1 = (nu + ni) * per_id
        intra = V1 * (g - 1) / g
        nu_node, ni_node = ids_per_table(case, b, b * g, dedup)  # per GPU share after node dedup
        V2 = (nu_node + ni_node) * per_id
        inter = V2 * (N - 1) / N
        # Each of ids / rows / gradients crosses NVLink once (stage 1) and the network
        # once (stage 2); the two stages run one after the other.
        r["x_bytes"], r["x_net_bytes"] = intra + inter, inter
        alpha = 8 * ALPHA_A2A_NODE + 8 * (ALPHA_A2A_NET + ALPHA_A2A_PEER * (N - 1))
        r["x"] = intra / NVLINK_A2A + inter / NIC + alpha
    r["ids_sent"] = nu + ni
    # Dense allreduce of the replicated tower + head (ring/tree, one buffer).
    if W == 1:
        r["ar"] = 0.0
    else:
        ar_bytes = 2 * (W - 1) / W * P_TOWER * F32
        r["ar"] = ar_bytes / (NVLINK_A2A if N == 1 else NIC) + \
            (ALPHA_AR_NODE if N == 1 else ALPHA_AR_NET)
    for k in ("tower", "emb", "opt"):
        r[k] *= slow
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


def table_flat(case, opt, ws, base_w):
    out = []
    out.append("| W | nodes | b/rank | tower | emb passes | %s opt | local | ids sent/rank | "
               "to peers MB | of it over IB MB | exchange | allreduce | **step ms** | "
               "**M samples/s** | **eff** | step, overlap | eff, overlap |" % opt)
    out.append("|" + "---|" * 17)
    for dedup in (False, True):
        rows = [step(case, W, dedup=dedup, opt=opt) for W in ws]
        rows_ov = [step(case, W, dedup=dedup, opt=opt, overlap=True) for W in ws]
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


def table_hier(case, opt, ws, base_w):
    out = ["| W | nodes | IB MB/GPU flat | IB MB/GPU hier | exchange flat | exchange hier | "
           "step flat | step hier | M samples/s hier | eff hier |", "|" + "---|" * 10]
    base = step(case, base_w, dedup=True, opt=opt)
    for W in ws:
        if W <= GPUS_PER_NODE:
            continue
        f = step(case, W, dedup=True, opt=opt)
        h = step(case, W, dedup=True, hier=True, opt=opt)
        eff = h["sps"] * base_w / (W * base["sps"])
        out.append("| %d | %d | %s | %s | %s | %s | %s | %s | %.0f | %.0f%% |" % (
            W, h["nodes"], mb(f["x_net_bytes"]), mb(h["x_net_bytes"]), ms(f["x"]), ms(h["x"]),
            ms(f["step"]), ms(h["step"]), h["sps"] / 1e6, 100 * eff))
    return "\n".join(out)


def a100_check():
    """The same arithmetic for the published reference (ANCHORS.md: NVIDIA's PyTorch NCF,
    TF32, batch 2^20: 22.6M samples/s on 1x A100-40GB, 110M on 8x): replicated tables,
    dense embedding gradients allreduced, one fused Adam over all parameters."""
    hbm = 0.90 * 1.555e12              # A100-40GB HBM2 1,555 GB/s (datasheet)
    gather = 1.555e12 * HBM_GATHER / HBM  # same fraction of peak as on H100
    flops = GEMM_EFF * 156e12          # TF32 dense peak (datasheet)
    ar_bw = 230e9                      # NCCL allreduce bus bandwidth, NVLink3 (assumption)
    B = 1048576
    emb_params = (138493 + 26744) * D
    out = {}
    for W in (1, 8):
        b = B / W
        tower = max(6 * P_TOWER * b / flops, ACT_BYTES * b / hbm)
        emb = 4 * 2 * b * F32 * D / gather          # gather r+w, scatter-add r+w, 2 tables
        # dense grad zeroed (4 B) and read by Adam (4 B), p/m/v read+written (24 B): every
        # row of the full (replicated, not sharded) tables on every GPU
        opt = (24 + 8) * emb_params / hbm
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu_json", help="a launch/scaling.py result to compare bytes with")
    a = ap.parse_args()
    ml20 = Case("ml-20m", 138493, 26744, global_batch=1048576)
    big = Case("1e8 users", 10**8, 10**6, per_rank=131072)
    print("tower + head parameters: %d (%.2f MB fp32); D = %d; activation bytes/sample %d"
          % (P_TOWER, P_TOWER * 4 / 1e6, D, ACT_BYTES))
    print("\n### ml-20m, strong scaling, global batch 1,048,576, dense Adam, flat all-to-all\n")
    print(table_flat(ml20, "dense", WS, 1))
    print("\n### ml-20m, hierarchical exchange (dedup), vs flat (dedup)\n")
    print(table_hier(ml20, "dense", WS, 1))
    big_ws = [8, 16, 32, 64, 128]
    for opt in ("dense", "lazy"):
        print("\n### 10^8 users x 10^6 items, weak scaling, 131,072 samples/GPU, %s Adam, "
              "flat all-to-all (efficiency vs W = 8)\n" % opt)
        print(table_flat(big, opt, big_ws, 8))
    print("\n### 10^8 users, hierarchical exchange (dedup, lazy Adam), vs flat (dedup)\n")
    print(table_hier(big, "lazy", big_ws, 8))
    strong = Case("1e8 users strong", 10**8, 10**6, global_batch=1048576)
    print("\n### 10^8 users, strong scaling at 1,048,576 samples/step, dedup\n")
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
          "step ms hier+dedup | eff |")
    print("|---|---|---|---|---|---|---|---|")
    rn = [step(ml20, W, slow=REF_SLOW) for W in WS]
    rd = [step(ml20, W, dedup=True, slow=REF_SLOW) for W in WS]
    rh = [step(ml20, W, dedup=True, hier=True, slow=REF_SLOW) for W in WS]
    for rows in (rn, rd, rh):
        efficiency(rows, 1)
    for x, y, z in zip(rn, rd, rh):
        print("| %d | %s | %.0f%% | %s | %.0f | %.0f%% | %s | %.0f%% |" % (
            x["W"], ms(x["step"]), 100 * x["eff"], ms(y["step"]), y["sps"] / 1e6,
            100 * y["eff"], ms(z["step"]), 100 * z["eff"]))
    a100_check()
    if a.cpu_json:
        cpu_check(a.cpu_json)


if __name__ == "__main__":
    main()
