#!/usr/bin/python3
"""Plain PyTorch NeuMF training step, the baseline ncf_dist's CPU speed is held against.

The model is the one ncf_dist trains (README "Training"): one nn.Embedding per entity
of width num_factors + layers[0]/2, sliced into its GMF and MLP parts; GMF = u * i; the
MLP is Linear + ReLU over [u_mlp ; i_mlp]; a linear head over [GMF ; MLP]; BCE with
logits averaged over the batch; torch.optim.Adam over every parameter. The embeddings
are not sparse, so Adam is dense: every row's moments decay every step, as in ncf_dist's
default and the TF / PyTorch references.

Only the step is timed. Ids are uniform random over the data set's sizes and labels are
random, generated before timing: there is no reader and no negative sampling here, while
ncf_dist's samples/s includes its record reader and its exact-exclusion negative
sampler. The comparison therefore favours PyTorch.

  /usr/bin/python3 bench/pytorch_neumf.py --users 6040 --items 3706 --preset ncf-paper \\
      --threads 1 --warmup 200 --steps 3000
Needs Debian's python3-torch (run with /usr/bin/python3).
"""
import argparse
import ctypes
import json
import os
import time


def configure_runtime():
    """Thread and kernel settings, which the libraries read when they load, so this runs
    before `import torch`:
    - OMP_NUM_THREADS and OPENBLAS_NUM_THREADS = --threads (ncf_dist also sets its
      OpenBLAS threads to --threads), so neither pool oversubscribes the cores;
    - OMP_WAIT_POLICY=PASSIVE unless --omp_spin: on a shared, loaded machine libgomp's
      spin-waiting makes a 2-thread step 5-10x slower than a 1-thread one;
    - OPENBLAS_CORETYPE: Debian's torch does its matrix products in OpenBLAS, which under
      a hypervisor may not recognise the CPU and fall back to old (Prescott) kernels.
      ncf_dist re-executes itself with OPENBLAS_CORETYPE set to the best kernels the CPU
      supports (src/common/blas_setup.cc); this does the same unless --no_blas_upgrade.
    A variable already set in the environment is left alone."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--threads", type=int, default=1)
    pre.add_argument("--no_blas_upgrade", action="store_true")
    pre.add_argument("--omp_spin", action="store_true")
    a, _ = pre.parse_known_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(a.threads))
    if not a.omp_spin:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if a.no_blas_upgrade or "OPENBLAS_CORETYPE" in os.environ:
        return
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        return
    if {"avx512f", "avx512bw", "avx512vl"} <= set(flags):
        os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"
    elif {"avx2", "fma"} <= set(flags):
        os.environ["OPENBLAS_CORETYPE"] = "Haswell"


def openblas_core():
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        return "unknown"


configure_runtime()
import torch  # noqa: E402
from torch import nn  # noqa: E402

# The presets of src/train/config.cc.
PRESETS = {
    "ml-20m-mlperf": dict(batch_size=1048576, lr=0.0045, beta1=0.25, beta2=0.5, eps=1e-8,
                          factors=64, layers=[256, 256, 128, 64], num_neg=4),
    "ncf-paper": dict(batch_size=256, lr=0.001, beta1=0.9, beta2=0.999, eps=1e-8,
                      factors=8, layers=[64, 32, 16, 8], num_neg=4),
}


class NeuMF(nn.Module):
    def __init__(self, U, I, factors, layers, sparse=False):
        super().__init__()
        self.mf = factors
        D = factors + layers[0] // 2  # one table width per entity, GMF part first
        self.user = nn.Embedding(U, D, sparse=sparse)
        self.item = nn.Embedding(I, D, sparse=sparse)
        nn.init.normal_(self.user.weight, 0.0, 0.01)
        nn.init.normal_(self.item.weight, 0.0, 0.01)
        tower = []
        for a, b in zip(layers[:-1], layers[1:]):
            lin = nn.Linear(a, b)
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)
            tower += [lin, nn.ReLU()]
        self.tower = nn.Sequential(*tower)
        self.head = nn.Linear(factors + layers[-1], 1)
        fan_in = factors + layers[-1]  # LeCun uniform
        nn.init.uniform_(self.head.weight, -(3.0 / fan_in) ** 0.5, (3.0 / fan_in) ** 0.5)
        nn.init.zeros_(self.head.bias)

    def forward(self, users, items):
        u = self.user(users)  # [B, D]
        i = self.item(items)
        gmf = u[:, :self.mf] * i[:, :self.mf]
        mlp = self.tower(torch.cat([u[:, self.mf:], i[:, self.mf:]], dim=1))
        return self.head(torch.cat([gmf, mlp], dim=1)).squeeze(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, required=True, help="U, rows of the user table")
    ap.add_argument("--items", type=int, required=True, help="I, rows of the item table")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="ncf-paper")
    ap.add_argument("--batch_size", type=int, help="samples per step (default: the preset's)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--warmup", type=int, default=50, help="untimed steps first")
    ap.add_argument("--steps", type=int, default=500, help="timed steps")
    ap.add_argument("--pool", type=int, default=8, help="distinct random batches cycled through")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--embedding_optimizer", choices=["dense_adam", "lazy_adam"],
                    default="dense_adam",
                    help="dense_adam: dense embedding gradients, one torch.optim.Adam (every "
                    "row decays every step); lazy_adam: sparse embedding gradients and "
                    "torch.optim.SparseAdam (touched rows only), as ncf_dist's lazy_adam")
    ap.add_argument("--no_blas_upgrade", action="store_true",
                    help="leave OpenBLAS on the kernels it picks itself")
    ap.add_argument("--omp_spin", action="store_true",
                    help="keep libgomp's default spin-waiting (no OMP_WAIT_POLICY=PASSIVE)")
    a = ap.parse_args()

    p = dict(PRESETS[a.preset])
    # As ncf_dist: a batch holds whole groups of one positive and num_neg negatives.
    B = (a.batch_size or p["batch_size"]) // (1 + p["num_neg"]) * (1 + p["num_neg"])
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    lazy = a.embedding_optimizer == "lazy_adam"
    model = NeuMF(a.users, a.items, p["factors"], p["layers"], sparse=lazy)
    hyper = dict(lr=p["lr"], betas=(p["beta1"], p["beta2"]), eps=p["eps"])
    if lazy:
        tables = [model.user.weight, model.item.weight]
        dense = [q for q in model.parameters() if all(q is not t for t in tables)]
        opts = [torch.optim.SparseAdam(tables, **hyper), torch.optim.Adam(dense, **hyper)]
    else:
        opts = [torch.optim.Adam(model.parameters(), **hyper)]
    loss_fn = nn.BCEWithLogitsLoss()
    pos = torch.zeros(B)
    pos[:: 1 + p["num_neg"]] = 1.0  # one positive then num_neg negatives, as a real batch
    pool = [(torch.randint(0, a.users, (B,)), torch.randint(0, a.items, (B,)),
             pos[torch.randperm(B)]) for _ in range(max(1, min(a.pool, a.warmup + a.steps)))]

    def step(k, phases=None):
        users, items, labels = pool[k % len(pool)]
        t0 = time.perf_counter()
        loss = loss_fn(model(users, items), labels)
        t1 = time.perf_counter()
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        for opt in opts:
            opt.step()
        t3 = time.perf_counter()
        if phases is not None:
            phases[0] += t1 - t0
            phases[1] += t2 - t1
            phases[2] += t3 - t2
        return loss

    for k in range(a.warmup):
        step(k)
    phases = [0.0, 0.0, 0.0]
    t0 = time.perf_counter()
    for k in range(a.steps):
        loss = step(a.warmup + k, phases)
    seconds = time.perf_counter() - t0
    sps = a.steps * B / seconds
    params = sum(q.numel() for q in model.parameters())
    core = openblas_core()
    print(f"pytorch_neumf: torch {torch.__version__}, preset {a.preset}, U {a.users}, "
          f"I {a.items}, batch {B}, threads {a.threads}, {a.embedding_optimizer}, "
          f"OpenBLAS core {core}, "
          f"OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY', 'default')}, {params} parameters; "
          f"{a.steps} steps in {seconds:.3f} s = {sps:,.0f} samples/s "
          f"({1e3 * seconds / a.steps:.3f} ms/step: forward {1e3 * phases[0] / a.steps:.3f}, "
          f"backward {1e3 * phases[1] / a.steps:.3f}, adam {1e3 * phases[2] / a.steps:.3f}); "
          f"last loss {loss.item():.4f}")
    print(json.dumps(dict(bench="pytorch_neumf", torch=torch.__version__, preset=a.preset,
                          users=a.users, items=a.items, batch=B, threads=a.threads,
                          embedding_optimizer=a.embedding_optimizer,
                          openblas_core=core,
                          omp_wait_policy=os.environ.get("OMP_WAIT_POLICY", "default"),
                          steps=a.steps, seconds=seconds, samples_per_s=sps,
                          forward_s=phases[0], backward_s=phases[1], adam_s=phases[2])))


if __name__ == "__main__":
    main()
