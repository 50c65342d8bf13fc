"""gpu_kit stage pytorch_neumf (`run bench`): pytorch_neumf_gpu.py PYTORCH_NEUMF.py
METADATA.json BATCH. Needs PyTorch and a GPU."""
# The NeuMF of bench/pytorch_neumf.py on the GPU: same model and Adam, random ids over the
# synthetic ml-20m sizes, the ml-20m-mlperf batch; eager FP32, TF32, AMP (bf16 autocast),
# and torch.compile where they work.
import importlib.util, json, sys, time
spec = importlib.util.spec_from_file_location("pytorch_neumf", sys.argv[1])
sys_argv, sys.argv = sys.argv, [sys.argv[0]]
pn = importlib.util.module_from_spec(spec); spec.loader.exec_module(pn)
sys.argv = sys_argv
import torch
from torch import nn
meta = json.load(open(sys.argv[2]))
def count(*keys):
    for k in keys:
        for d in (meta, meta.get("counts", {})):
            if isinstance(d, dict) and k in d:
                return int(d[k])
    raise KeyError(keys)
U, I = count("num_users", "users"), count("num_items", "items")
p = pn.PRESETS["ml-20m-mlperf"]
B = int(sys.argv[3]) // (1 + p["num_neg"]) * (1 + p["num_neg"])
dev = torch.device("cuda")
print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, U {U}, I {I}, batch {B}")
results = {}
def run(label, amp=False, tf32=False, compile_=False, steps=30, warmup=10):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(1)
    model = pn.NeuMF(U, I, p["factors"], p["layers"]).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=p["lr"], betas=(p["beta1"], p["beta2"]), eps=p["eps"])
    fwd = torch.compile(model) if compile_ else model
    loss_fn = nn.BCEWithLogitsLoss()
    pool = [(torch.randint(0, U, (B,), device=dev), torch.randint(0, I, (B,), device=dev),
             (torch.rand(B, device=dev) < 1 / (1 + p["num_neg"])).float()) for _ in range(4)]
    def step(k):
        u, i, y = pool[k % len(pool)]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            logits = fwd(u, i)
        loss = loss_fn(logits.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    for k in range(warmup):
        step(k)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for k in range(steps):
        loss = step(k)
    torch.cuda.synchronize()
    s = time.perf_counter() - t0
    results[label] = steps * B / s
    print(f"{label}: {steps} steps in {s:.3f} s = {steps * B / s:,.0f} samples/s, loss {loss.item():.4f}", flush=True)
for label, kw in [("fp32", {}), ("tf32", dict(tf32=True)), ("amp_bf16", dict(tf32=True, amp=True)),
                  ("compile_tf32", dict(tf32=True, compile_=True)),
                  ("compile_amp_bf16", dict(tf32=True, amp=True, compile_=True))]:
    try:
        run(label, **kw)
    except Exception as e:  # torch.compile needs a working Triton / C compiler
        print(f"{label}: failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
print(json.dumps(dict(bench="pytorch_neumf_gpu", users=U, items=I, batch=B, samples_per_s=results)))
if not results:
    sys.exit(1)
