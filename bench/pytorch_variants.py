#!/usr/bin/python3
"""PyTorch NeuMF written several ways, trained on the same samples in one process.

The peer ncf_dist is held against (bench/pytorch_neumf.py: its NeuMF, presets, data reader,
HR/NDCG rule and device negative sampler, imported from it) as eager code, as eager code
with its forward under torch.compile, and as an expert would write it for this model:

  eager_tf32, eager_amp_bf16
      NeuMF.forward per sample, torch.optim.Adam(foreach=True); TF32 matrix products
      allowed, or the forward under torch.autocast(bfloat16).
  compile_fwd_tf32, compile_fwd_amp_bf16
      the same with torch.compile(model): the forward only (what scripts/gpu_kit.sh timed
      before this script).
  expert_tf32, expert_amp_bf16
      the same function (SplitNeuMF: NeuMF's own parameters) computed the way the batch's
      structure allows. A batch is groups of S = 1 + num_neg samples of one user (the
      positive, then its negatives), so the user's half of layer 0, U_mlp W0u^T + b0, and
      the user's GMF row are computed once per group, not once per sample. Layer 0's item
      half is computed once per item: with I <= B (ml-20m-mlperf: I = 26,744 items,
      B = 1,048,575 samples) the whole item table's MLP part is projected once per step,
      P = I_mlp W0i^T [I x h0], and each sample reads its row of P; with I > B that would
      cost more than projecting each sample's own row, so the split model falls back to the
      per-sample product there (both paths are checked by --self_check). The step is
      compiled whole: forward + loss under torch.compile (AOTAutograd compiles the backward
      with it) in --expert_mode (default reduce-overhead: CUDA graphs;
      torch.compiler.cudagraph_mark_step_begin() before each step where it exists), the
      optimizer step compiled too, torch.optim.Adam(fused=True) on CUDA. Where torch has no
      torch.compile (Debian's torch 1.13), the split model runs eagerly with foreach Adam and
      the record says "compile unavailable: ..." (that still tests its algebra end to end);
      --no_compile does the same on any torch.

Every variant starts from the same initial parameters (NeuMF's init under --seed), uses the
preset's Adam hyper-parameters and batch, and trains --epochs epochs on one sample stream
built once per epoch on --device before any variant runs: a permutation of the training
positives (torch.randperm on the device, keyed by --seed and the epoch), num_neg negatives
per positive drawn with pytorch_neumf.draw_negatives_torch (uniform over the items outside
the user's positives.bin list), the positive first in each group of S. Each epoch is
--batch_size samples a step (rounded down to whole groups), the last step taking what is
left; that partial batch has another shape, so the compiled variants run it eagerly on the
same parameters and optimizer (a recompile would cost more than the step; the record says
so). Loss: BCE with logits averaged over the step's samples. After each epoch HR@K and
NDCG@K are computed as pytorch_neumf.py does (eager NeuMF.forward under no_grad, FP32 with
TF32 allowed, every eval user's list of the positive and E negatives; the positive loses
ties).

Timing, per variant: the first --warmup_steps steps of epoch 1 (compilation, CUDA graph
capture, library warm-up) are timed one by one with a device sync around each and reported
apart (warmup_seconds; compile_seconds = their time beyond as many median steps). The other
steps are timed with CUDA events around each step on cuda (perf_counter on cpu) and one
device sync at each end of the epoch; the loss is summed on the device (no .item() per
step). Reported: the median step (ms) over the full-size steps after warm-up (and their
mean: on a busy machine the two part), samples/s = batch / median step, each epoch's
samples / its wall time (epoch 1 including warm-up), and HR/NDCG per epoch. A variant
counts when its last HR@K is within --counts_tolerance (0.01) of eager_tf32's (the
reference); the summary names the fastest variant that counts per precision (tf32, bf16),
by its median-step samples/s.

A variant that fails (torch.compile missing or failing, fused Adam off CUDA, ...) is recorded
with status "failed" and the exception's first line, and the next one runs; the exit status
is 1 only when no variant ran.

Output: one JSON line per variant as it ends {"bench": "pytorch_variants", "kind": "variant",
...} ("counts" there where eager_tf32 ran before it), then a table and a final {"bench":
"pytorch_variants", "kind": "summary", ...} with "counts" against the reference whatever the
order; --metrics_json FILE appends the variant lines as they are printed.

  /usr/bin/python3 bench/pytorch_variants.py --data_dir /tmp/bench-ml-1m --preset ncf-paper \\
      --epochs 2 --device cpu --variants eager_tf32,compile_fwd_tf32,expert_tf32
  python3 bench/pytorch_variants.py --data_dir data/syn-ml-20m --preset ml-20m-mlperf \\
      --device cuda --epochs 3

--self_check (CPU, tiny random models, no data): SplitNeuMF's output equals NeuMF.forward on
grouped batches and its gradients w.r.t. every parameter equal NeuMF's (float64 to 1e-12,
float32 to 1e-6), on the item-table path (I <= B) and the per-sample fallback (I > B); the
sample stream is groups of one positive and negatives of one user, outside the user's list.

Needs PyTorch (Debian's python3-torch: run with /usr/bin/python3).
"""
import copy
import json
import os
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytorch_neumf as pn  # noqa: E402  (sets the thread variables before torch loads)
import argparse  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

VARIANTS = ["eager_tf32", "eager_amp_bf16", "compile_fwd_tf32", "compile_fwd_amp_bf16",
            "expert_tf32", "expert_amp_bf16"]
REFERENCE = "eager_tf32"


def precision_of(name):
    return "bf16" if name.endswith("amp_bf16") else "tf32"


class SplitNeuMF(nn.Module):
    """NeuMF (bench/pytorch_neumf.py) on a batch of G groups of S samples of one user each:
    users_g [G] (each group's user), items [G * S]. The same function and the same
    parameters (it wraps the NeuMF it is given): logits [G * S] equal
    base(users_g.repeat_interleave(S), items) up to rounding.

    Layer 0 is Linear(2h -> o0) over [u_mlp ; i_mlp], i.e. u_mlp W0u^T + i_mlp W0i^T + b0
    with W0 = [W0u | W0i]: the user term (+ b0) once per group; the item term once per item
    when the item table has at most B = G * S rows (P = item table's MLP part x W0i^T once,
    then each sample reads P[item]); otherwise per sample, from the sample's own item row
    (the per-item projection would then cost more than the per-sample one). GMF: the
    group's user row times each sample's item row."""

    def __init__(self, base, S, B):
        super().__init__()
        self.base = base
        self.S = S
        self.by_table = base.item.num_embeddings <= B
        self.h = base.tower[0].in_features // 2

    def forward(self, users_g, items):
        b, S, h, mf = self.base, self.S, self.h, self.base.mf
        G = users_g.shape[0]
        lin0 = b.tower[0]
        u = F.embedding(users_g, b.user.weight)  # [G, D]: one row per group
        z_user = F.linear(u[:, mf:], lin0.weight[:, :h], lin0.bias)  # [G, o0]
        w_item = b.item.weight
        if self.by_table:
            p = F.linear(w_item[:, mf:], lin0.weight[:, h:])  # [I, o0]: once per item
            z_item = p[items]  # [G*S, o0]
            i_gmf = w_item[:, :mf][items]  # [G*S, mf]: the GMF columns only
        else:
            i = F.embedding(items, w_item)  # [G*S, D]
            z_item = F.linear(i[:, mf:], lin0.weight[:, h:])
            i_gmf = i[:, :mf]
        o0 = z_user.shape[1]
        z0 = (z_item.view(G, S, o0) + z_user[:, None, :]).reshape(G * S, o0)
        mlp = b.tower[2:](torch.relu(z0))  # tower[1] is layer 0's ReLU
        gmf = (i_gmf.view(G, S, mf) * u[:, None, :mf]).reshape(G * S, mf)
        return b.head(torch.cat([gmf, mlp], dim=1)).squeeze(1)


# ----------------------------------------------------------------- self check ---

def _grads(model, fn):
    model.zero_grad(set_to_none=True)
    out = fn()
    # a loss that weighs every output differently, so each one's gradient counts
    w = torch.linspace(-1.0, 2.0, out.numel(), dtype=out.dtype)
    (out * w).sum().backward()
    return out.detach().clone(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def check_split(U, I, G, S, dtype, tol, seed):
    torch.manual_seed(seed)
    base = pn.NeuMF(U, I, 3, [8, 6, 4]).to(dtype)
    with torch.no_grad():  # weights large enough that ReLU masks and products matter
        for p in base.parameters():
            p.uniform_(-1.0, 1.0)
    B = G * S
    split = SplitNeuMF(base, S, B)
    users_g = torch.randint(0, U, (G,))
    items = torch.randint(0, I, (B,))
    ref_out, ref_g = _grads(base, lambda: base(users_g.repeat_interleave(S), items))
    out, g = _grads(base, lambda: split(users_g, items))
    err = (out - ref_out).abs().max().item()
    assert err <= tol, f"U {U} I {I} B {B} {dtype}: forward differs by {err} > {tol}"
    for n in ref_g:
        e = (g[n] - ref_g[n]).abs().max().item()
        scale = max(1.0, ref_g[n].abs().max().item())
        assert e <= tol * scale, f"U {U} I {I} B {B} {dtype}: d/d{n} differs by {e}"
    assert all(ref_g[n].abs().max().item() > 0 for n in ref_g), "a parameter got no gradient"
    return split.by_table, err


def check_stream():
    """build_stream on a small case: groups of S, positive first, negatives of the group's
    user outside its list, and every positive once."""
    U, I, num_neg = 5, 9, 3
    lists = [[0, 1], [2], [3, 4, 5], [8], [0, 7]]
    tu = torch.tensor([u for u, x in enumerate(lists) for _ in x], dtype=torch.int64)
    ti = torch.tensor([i for x in lists for i in x], dtype=torch.int64)
    counts = np.array([len(x) for x in lists])
    pos_keys = torch.from_numpy(np.repeat(np.arange(U, dtype=np.int64), counts) * I +
                                np.array([i for x in lists for i in x], dtype=np.int64))
    s = build_stream(tu, ti, pos_keys, I, num_neg, 7, 0, tu.numel(), torch.device("cpu"))
    S = 1 + num_neg
    users, items = s["users"].view(-1, S), s["items"].view(-1, S)
    assert torch.equal(users[:, 0], s["users_g"]) and bool((users == users[:, :1]).all())
    got = sorted(zip(users[:, 0].tolist(), items[:, 0].tolist()))
    assert got == sorted(zip(tu.tolist(), ti.tolist())), got
    for g in range(users.shape[0]):
        u = int(users[g, 0])
        assert all(int(x) not in lists[u] for x in items[g, 1:]), (u, items[g])


def self_check():
    results = []
    for U, I, G, S in ((7, 11, 4, 3), (7, 50, 4, 3)):  # I <= B = 12, then I > B
        for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
            by_table, err = check_split(U, I, G, S, dtype, tol, seed=U * I + S)
            results.append((I, G * S, by_table, str(dtype).split(".")[-1], err))
    assert [r[2] for r in results] == [True, True, False, False], results
    check_stream()
    for I, B, by_table, dt, err in results:
        print(f"pytorch_variants: I {I}, B {B}: layer 0's item half "
              f"{'from the projected item table' if by_table else 'per sample'}, {dt}: "
              f"forward within {err:.1e}, every parameter's gradient within tolerance")
    print("pytorch_variants: self check passed (SplitNeuMF is NeuMF on grouped batches, both "
          "layer-0 paths, forward and gradients; the sample stream's groups and negatives)")


# ------------------------------------------------------------------ the data ---

def build_stream(tu, ti, pos_keys, I, num_neg, seed, epoch, count, dev):
    """One epoch's samples on dev: `count` positives in a random order (torch.randperm keyed
    by seed and epoch), each followed by num_neg negatives of its user."""
    gen = torch.Generator(device=dev)
    gen.manual_seed(int(seed) * 1000003 + epoch)
    perm = torch.randperm(tu.numel(), generator=gen, device=dev)[:count]
    users_g = tu[perm]
    pos = ti[perm]
    chunk = 1 << 22  # positives per call of the sampler (bounds its temporaries)
    neg = torch.cat([pn.draw_negatives_torch(gen, users_g[k:k + chunk], num_neg, pos_keys, I)
                     for k in range(0, count, chunk)]) if count else \
        torch.zeros(0, num_neg, dtype=torch.int64, device=dev)
    S = 1 + num_neg
    return dict(users_g=users_g, users=users_g.repeat_interleave(S),
                items=torch.cat([pos[:, None], neg], dim=1).reshape(-1))


# ------------------------------------------------------------------ training ---

class Timer:
    """Per-step times inside an epoch: CUDA events on cuda (one sync at the end), else
    perf_counter."""

    def __init__(self, dev):
        self.cuda = dev.type == "cuda"
        self.marks = []
        self.partial = []  # per mark: a partial (last) batch, left out of the median

    def start(self, partial=False):
        self.partial.append(partial)
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append([e, None])
        else:
            self.marks.append([time.perf_counter(), None])

    def stop(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks[-1][1] = e
        else:
            self.marks[-1][1] = time.perf_counter()

    def seconds(self):  # after a sync
        if self.cuda:
            return [a.elapsed_time(b) / 1e3 for a, b in self.marks]
        return [b - a for a, b in self.marks]


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def make_variant(name, base, S, B, p, dev, expert_mode, no_compile=False):
    """(step(users_g, users, items, labels) -> loss tensor, eager_step for other shapes,
    notes, compiled?) for one variant on its own copy of the model."""
    amp = precision_of(name) == "bf16"
    kind = name.rsplit("_tf32", 1)[0].rsplit("_amp_bf16", 1)[0]
    notes = []
    hyper = dict(lr=p["lr"], betas=(p["beta1"], p["beta2"]), eps=p["eps"])
    has_compile = hasattr(torch, "compile") and not no_compile
    why = ("torch.compile disabled (--no_compile)" if no_compile else
           f"torch {torch.__version__} has no torch.compile")

    def autocast():
        return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp)

    def eager_loss(users_g, users, items, labels, fwd):
        with autocast():
            logits = fwd(users, items)
        return F.binary_cross_entropy_with_logits(logits.float(), labels)

    if kind in ("eager", "compile_fwd"):
        opt = torch.optim.Adam(base.parameters(), foreach=True, **hyper)
        fwd = base
        if kind == "compile_fwd":
            if not has_compile:
                raise RuntimeError(why)
            fwd = torch.compile(base)
            notes.append("torch.compile(model): the forward only; Adam eager (foreach)")

        def step(users_g, users, items, labels, fwd=fwd):
            opt.zero_grad(set_to_none=True)
            loss = eager_loss(users_g, users, items, labels, fwd)
            loss.backward()
            opt.step()
            return loss.detach()

        def eager_step(users_g, users, items, labels):
            opt.zero_grad(set_to_none=True)
            loss = eager_loss(users_g, users, items, labels, base)
            loss.backward()
            opt.step()
            return loss.detach()
        return step, eager_step, notes, kind == "compile_fwd"

    # expert
    split = SplitNeuMF(base, S, B)
    I = base.item.num_embeddings
    how = "once per item from the item table" if split.by_table else "per sample"
    notes.append(f"layer 0's item half {how} (I = {I} {'<=' if split.by_table else '>'} "
                 f"B = {B}); user half and GMF user rows once per group")
    fused = dev.type == "cuda"
    opt = torch.optim.Adam(base.parameters(), **hyper, **({"fused": True} if fused else
                                                         {"foreach": True}))
    notes.append("Adam fused" if fused else "Adam foreach (fused Adam is CUDA-only)")

    def split_loss(users_g, items, labels):
        with autocast():
            logits = split(users_g, items)
        return F.binary_cross_entropy_with_logits(logits.float(), labels)

    def eager_step(users_g, users, items, labels):  # the split model, uncompiled
        opt.zero_grad(set_to_none=True)
        loss = split_loss(users_g, items, labels)
        loss.backward()
        opt.step()
        return loss.detach()

    if not has_compile:
        notes.append(f"compile unavailable: {why}; "
                     "the split model ran eagerly")
        return eager_step, eager_step, notes, False

    loss_c = torch.compile(split_loss, mode=expert_mode)
    notes.append(f"forward + loss + backward compiled, mode {expert_mode}")
    mark = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
    if mark is not None and dev.type == "cuda":
        notes.append("cudagraph_mark_step_begin() per step")
    else:
        mark = None

    def opt_step_plain():
        opt.step()
    opt_c = torch.compile(opt_step_plain)
    state = {"opt": opt_c, "opt_compiled": True}

    def step(users_g, users, items, labels):
        if mark is not None:
            mark()
        opt.zero_grad(set_to_none=True)
        loss = loss_c(users_g, items, labels)
        loss.backward()
        if state["opt_compiled"]:
            try:
                state["opt"]()
            except Exception as e:  # compile failed before the step ran: step eagerly
                state["opt_compiled"] = False
                state["opt"] = opt_step_plain
                notes.append("the compiled optimizer step failed at its first call ("
                             + first_line(e) + "): Adam stepped eagerly instead")
                opt.step()
        else:
            opt.step()
        return loss.detach()
    notes.append("optimizer step compiled (torch.compile, default mode)")
    return step, eager_step, notes, True


def first_line(e):
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0][:300] if s else ''}"


def run_variant(name, init_model, streams, labels, S, B, p, dev, a, evaluate):
    if hasattr(torch, "_dynamo"):
        torch._dynamo.reset()  # no compiled code or graphs of the last variant
    base = copy.deepcopy(init_model).to(dev)
    step, eager_step, notes, compiled = make_variant(name, base, S, B, p, dev, a.expert_mode,
                                                     a.no_compile)
    timer_ms, warm, epochs = [], [], []
    partial_eager = 0
    for e, s in enumerate(streams):
        n = s["items"].numel()
        steps = (n + B - 1) // B
        loss_sum = torch.zeros((), device=dev)
        timer = Timer(dev)
        samples = 0
        sync(dev)
        t0 = time.perf_counter()
        for k in range(steps):
            lo, hi = k * B, min((k + 1) * B, n)
            ug = s["users_g"][lo // S:hi // S]
            args = (ug, s["users"][lo:hi], s["items"][lo:hi], labels[:hi - lo])
            full = hi - lo == B
            fn = step if full else eager_step
            if not full and compiled:
                partial_eager += 1
            if e == 0 and k < a.warmup_steps:
                sync(dev)
                ts = time.perf_counter()
                loss_sum += fn(*args)
                sync(dev)
                warm.append(time.perf_counter() - ts)
            else:
                timer.start(partial=not full)
                loss_sum += fn(*args)
                timer.stop()
            samples += hi - lo
        sync(dev)
        train_s = time.perf_counter() - t0
        secs = timer.seconds()
        timer_ms += [1e3 * t for t, part in zip(secs, timer.partial) if not part]
        hr, nd, eval_s = evaluate(base)
        epochs.append(dict(epoch=e + 1, loss=loss_sum.item() / max(1, steps), hr=hr, ndcg=nd,
                           train_seconds=train_s, samples=samples,
                           samples_per_second=samples / train_s if train_s else 0.0,
                           eval_seconds=eval_s, steps=steps))
        print(f"pytorch_variants: {name} epoch {e + 1}: loss {epochs[-1]['loss']:.5f}, "
              f"HR@{a.topk} {hr:.4f}, NDCG@{a.topk} {nd:.4f}, {train_s:.2f} s "
              f"({epochs[-1]['samples_per_second']:,.0f} samples/s), eval {eval_s:.2f} s",
              flush=True)
    if partial_eager:
        notes.append(f"{partial_eager} partial last batch(es) ran eagerly on the same "
                     "parameters and optimizer (another shape: no recompile)")
    med = statistics.median(timer_ms) if timer_ms else None
    if med is None and warm:
        notes.append("no step after warm-up: the median is over the warm-up steps")
        med = 1e3 * statistics.median(warm)
    warm_s = sum(warm)
    steady = [r for r in epochs[1:]] or epochs
    return dict(status="ok", notes=notes, median_step_ms=med,
                mean_step_ms=statistics.fmean(timer_ms) if timer_ms else None,
                samples_per_s=B / (med / 1e3) if med else None,
                timed_steps=len(timer_ms),
                epoch_samples_per_s=[r["samples_per_second"] for r in epochs],
                steady_epoch_samples_per_s=(sum(r["samples"] for r in steady) /
                                            sum(r["train_seconds"] for r in steady)),
                warmup_steps=len(warm), warmup_seconds=warm_s,
                compile_seconds=max(0.0, warm_s - len(warm) * (med or 0) / 1e3),
                hr=[r["hr"] for r in epochs], ndcg=[r["ndcg"] for r in epochs],
                loss=[r["loss"] for r in epochs], per_epoch=epochs)


def train(a, p):
    t_load = time.perf_counter()
    ds = pn.load_dataset(a.data_dir, check_crc=not a.skip_crc, record_dir=a.record_module_dir)
    meta = ds["meta"]
    U, I = meta["num_users"], meta["num_items"]
    load_s = time.perf_counter() - t_load
    S = 1 + p["num_neg"]
    B = (a.batch_size or p["batch_size"]) // S * S
    if B < S:
        raise SystemExit(f"pytorch_variants: --batch_size must be at least 1 + num_neg = {S}")
    P = B // S
    counts = np.diff(ds["offsets"])
    if counts.size and counts.max() >= I:
        raise SystemExit(f"pytorch_variants: user {int(np.argmax(counts))} interacted with all "
                         f"{I} items: no negative exists")
    pos_keys = np.repeat(np.arange(U, dtype=np.int64), counts) * I + ds["pos_items"]
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("pytorch_variants: --device cuda: torch sees no usable GPU")
    dev = torch.device(a.device)
    torch.set_num_threads(a.threads)
    # TF32 for every FP32 product (the *_amp_bf16 variants' FP32 ops and evaluation too)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    if hasattr(torch, "set_float32_matmul_precision"):
        torch.set_float32_matmul_precision("high")

    n_pos = ds["train_users"].size
    steps = (n_pos + P - 1) // P
    if a.max_steps > 0:
        steps = min(steps, a.max_steps)
    count = min(n_pos, steps * P)
    t0 = time.perf_counter()
    tu = torch.from_numpy(ds["train_users"]).to(dev)
    ti = torch.from_numpy(ds["train_items"]).to(dev)
    pos_keys_t = torch.from_numpy(pos_keys).to(dev)
    streams = [build_stream(tu, ti, pos_keys_t, I, p["num_neg"], a.seed, e, count, dev)
               for e in range(a.epochs)]
    del tu, ti, pos_keys_t
    sync(dev)
    stream_s = time.perf_counter() - t0
    labels = torch.zeros(S, device=dev)
    labels[0] = 1.0
    labels = labels.repeat(P)

    E1 = meta["eval_negatives"] + 1
    ev_users = np.arange(meta["num_eval_users"], dtype=np.int64)
    if a.eval_users > 0:
        ev_users = pn.eval_subset(meta["num_eval_users"], a.eval_users, a.seed)
    ev_items = torch.from_numpy(ds["eval_items"][ev_users]).to(dev)
    ev_mask = torch.from_numpy(ds["eval_mask"][ev_users]).to(dev)
    ev_users_t = torch.from_numpy(ev_users).to(dev)
    per_eval = max(1, a.eval_batch_size // E1)
    del ds

    def evaluate(model):  # pytorch_neumf.py's evaluate(): eager, no_grad, FP32 (TF32)
        sync(dev)
        t = time.perf_counter()
        model.eval()
        hr = nd = 0.0
        with torch.no_grad():
            for b in range(0, ev_users_t.numel(), per_eval):
                it = ev_items[b:b + per_eval].long()
                us = ev_users_t[b:b + per_eval, None].expand_as(it)
                s = model(us.reshape(-1), it.reshape(-1)).view(it.shape)
                h, n = pn.hit_ndcg(s, ev_mask[b:b + per_eval], a.topk)
                hr += h
                nd += n
        model.train()
        n = max(1, ev_users_t.numel())
        return hr / n, nd / n, time.perf_counter() - t

    torch.manual_seed(a.seed)
    init_model = pn.NeuMF(U, I, p["factors"], p["layers"])  # on the CPU, as pytorch_neumf
    names = a.variants.split(",")
    dev_name = torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"
    print(f"pytorch_variants: torch {torch.__version__} on {dev_name}, data {a.data_dir} "
          f"({U} users, {I} items, {n_pos} train positives, {ev_users.size} eval users x "
          f"1 + {E1 - 1}; read in {load_s:.1f} s), preset {a.preset}, batch {B} ({P} groups x "
          f"{S}), {steps} steps/epoch, {a.epochs} epochs; sample streams built on {a.device} "
          f"in {stream_s:.2f} s; threads {a.threads}; variants {', '.join(names)}", flush=True)
    metrics = open(a.metrics_json, "a") if a.metrics_json else None
    records = []

    def counts(r, ref):
        if r["status"] != "ok" or ref is None:
            return None
        return abs(r["hr"][-1] - ref["hr"][-1]) <= a.counts_tolerance

    for name in names:
        rec = dict(bench="pytorch_variants", kind="variant", variant=name,
                   precision=precision_of(name), torch=torch.__version__, device=a.device,
                   gpu=dev_name, preset=a.preset, batch=B, group=S, users=U, items=I,
                   epochs=a.epochs, steps_per_epoch=steps, seed=a.seed, k=a.topk,
                   expert_mode=a.expert_mode if name.startswith("expert") else None)
        try:
            rec.update(run_variant(name, init_model, streams, labels, S, B, p, dev, a, evaluate))
        except Exception as e:
            rec.update(status="failed", reason=first_line(e))
            print(f"pytorch_variants: {name} failed: {rec['reason']}", flush=True)
            traceback.print_exc(file=sys.stderr)  # the whole story, into the log
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        records.append(rec)
        # Its line now, so that a run cut short (a time limit) still leaves the variants that
        # ended; "counts" here where the reference ran before it (the default order).
        ref = next((r for r in records if r["variant"] == REFERENCE and r["status"] == "ok"),
                   None)
        rec["counts"] = counts(rec, ref)
        line = json.dumps(rec)
        print(line, flush=True)
        if metrics:
            metrics.write(line + "\n")
            metrics.flush()
    if metrics:
        metrics.close()
    ref = next((r for r in records if r["variant"] == REFERENCE and r["status"] == "ok"), None)
    for r in records:
        r["counts"] = counts(r, ref)
    best = {}
    for prec in ("tf32", "bf16"):
        ok = [r for r in records if r["precision"] == prec and r["counts"] and
              r["samples_per_s"]]
        best[prec] = max(ok, key=lambda r: r["samples_per_s"])["variant"] if ok else None
    print_table(records, a.topk)
    ran = [r for r in records if r["status"] == "ok"]
    print(json.dumps(dict(
        bench="pytorch_variants", kind="summary", torch=torch.__version__, device=a.device,
        gpu=dev_name, data_dir=a.data_dir, preset=a.preset, batch=B, epochs=a.epochs,
        steps_per_epoch=steps, users=U, items=I, train_positives=int(n_pos),
        load_seconds=load_s, stream_seconds=stream_s, reference=REFERENCE,
        reference_hr=ref["hr"][-1] if ref else None, counts_tolerance=a.counts_tolerance,
        ran=[r["variant"] for r in ran],
        failed={r["variant"]: r["reason"] for r in records if r["status"] != "ok"},
        samples_per_s={r["variant"]: r["samples_per_s"] for r in ran},
        hr={r["variant"]: r["hr"][-1] for r in ran},
        counts={r["variant"]: r["counts"] for r in ran},
        fastest_counting=best,
        fastest_counting_samples_per_s={k: next(r["samples_per_s"] for r in records
                                                if r["variant"] == v) if v else None
                                        for k, v in best.items()})))
    return 0 if ran else 1


def print_table(records, K):
    print(f"{'variant':<22} {'status':<7} {'step ms':>9} {'samples/s':>14} "
          f"{'epoch samples/s':>16} {'warm-up s':>9} {'HR@' + str(K) + ' per epoch':<26} "
          f"{'NDCG@' + str(K):>8} counts")
    for r in records:
        if r["status"] != "ok":
            print(f"{r['variant']:<22} failed  {r['reason'][:110]}")
            continue
        hrs = " ".join(f"{x:.4f}" for x in r["hr"])
        print(f"{r['variant']:<22} {'ok':<7} {r['median_step_ms']:9.3f} "
              f"{r['samples_per_s']:14,.0f} {r['steady_epoch_samples_per_s']:16,.0f} "
              f"{r['warmup_seconds']:9.2f} {hrs:<26} {r['ndcg'][-1]:8.4f} "
              f"{'-' if r['counts'] is None else ('yes' if r['counts'] else 'no')}")
        for note in r["notes"]:
            print(f"{'':<22}   {note}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data_dir", help="an ncf_prep dataset")
    ap.add_argument("--skip_crc", action="store_true",
                    help="do not check the files' CRC-32Cs (pytorch_neumf.py's flag)")
    ap.add_argument("--record_module_dir",
                    help="import ncf_record_pb2 from this folder instead of running protoc")
    ap.add_argument("--preset", choices=sorted(pn.PRESETS), default="ncf-paper")
    ap.add_argument("--batch_size", type=int, help="samples per step (default: the preset's)")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, of {', '.join(VARIANTS)} (default: all)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max_steps", type=int, default=-1,
                    help="steps per epoch at most (negative: whole epochs)")
    ap.add_argument("--warmup_steps", type=int, default=3,
                    help="the first steps of epoch 1, timed apart (compilation, graph capture)")
    ap.add_argument("--expert_mode", choices=["reduce-overhead", "max-autotune", "default"],
                    default="reduce-overhead", help="torch.compile mode of the expert's step")
    ap.add_argument("--no_compile", action="store_true",
                    help="act as if torch had no torch.compile: compile_fwd_* fail, expert_* "
                    "run the split model eagerly (the CPU test, and a torch whose compiler "
                    "cannot build here)")
    ap.add_argument("--topk", type=int, default=10)
    ap.add_argument("--eval_batch_size", type=int, default=100000)
    ap.add_argument("--eval_users", type=int, default=0,
                    help="evaluate ncf_dist's seeded subset of this many users (0: all)")
    ap.add_argument("--counts_tolerance", type=float, default=0.01,
                    help="a variant counts when its last HR is this close to eager_tf32's")
    ap.add_argument("--metrics_json", help="append one JSON line per variant to this file")
    ap.add_argument("--self_check", action="store_true",
                    help="check the split model against NeuMF on tiny random models, exit")
    ap.add_argument("--no_blas_upgrade", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--omp_spin", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.self_check:
        return self_check()
    if not a.data_dir:
        ap.error("give --data_dir (or --self_check)")
    bad = [v for v in a.variants.split(",") if v not in VARIANTS]
    if bad:
        ap.error(f"--variants: unknown {', '.join(bad)} (known: {', '.join(VARIANTS)})")
    if a.epochs < 1:
        ap.error("--epochs must be at least 1")
    p = dict(pn.PRESETS[a.preset])
    try:
        return train(a, p)
    except pn.DataError as e:
        raise SystemExit(f"pytorch_variants: {e}")


if __name__ == "__main__":
    sys.exit(main() or 0)
