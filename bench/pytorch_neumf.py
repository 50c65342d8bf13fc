#!/usr/bin/python3
"""Plain PyTorch NeuMF, the baseline ncf_dist's CPU speed and quality are held against.

The model is the one ncf_dist trains (docs/training.md): one nn.Embedding per entity
of width num_factors + layers[0]/2, sliced into its GMF and MLP parts; GMF = u * i; the
MLP is Linear + ReLU over [u_mlp ; i_mlp]; a linear head over [GMF ; MLP]; BCE with
logits averaged over the batch; torch.optim.Adam over every parameter. The embeddings
are not sparse, so Adam is dense: every row's moments decay every step, as in ncf_dist's
default and the TF / PyTorch references.

Two modes.

Random ids (--users U --items I): only the step is timed. Ids are uniform random over
the data set's sizes and labels are random, generated before timing: there is no reader
and no negative sampling here, while ncf_dist's samples/s includes its record reader and
its exact-exclusion negative sampler. The comparison therefore favours PyTorch.

  /usr/bin/python3 bench/pytorch_neumf.py --users 6040 --items 3706 --preset ncf-paper \\
      --threads 1 --warmup 200 --steps 3000

Training on a dataset (--data_dir DIR, an ncf_prep directory): trains --epochs epochs and
evaluates after each, as `ncf_dist --data_dir DIR --preset P --train_epochs E` does, so
both sides can be compared at equal quality. Read from the files directly, with the
checks ncf_dist makes where they are cheap (each refusal names the file, and the byte
offset where there is one): metadata.json against its own crc32c; positives.bin (size,
whole-file CRC-32C, magic, header counts, offsets); every train-* and eval-* shard (size
and whole-file CRC-32C against the metadata, each frame's length and masked length CRC,
the header record against the metadata, the record count and frame size, num_valid per
record, id ranges, eval user ids, the positive's mask bit). Payloads are decoded with a
module that `protoc --python_out` generates from src/data/ncf_record.proto into a
temporary directory (python3-protobuf, protobuf-compiler, python3-crcmod: all installed
by scripts/setup.sh; --record_module_dir takes a module protoc wrote elsewhere, and
--skip_crc leaves the CRC-32Cs unchecked where crcmod is missing). Not checked: each
eval list's duplicate mask against its items (ncf_dist recomputes it; here the stored mask
is used as it is, as ncf_dist then does).
- Training positives: the valid rows of the train shards. Each epoch visits all of them
  once in a fresh random order (numpy, keyed by --seed and the epoch); ncf_dist instead
  reads the shuffled records in a per-epoch record order. --max_steps caps each epoch as
  ncf_dist's flag does.
- A batch is --batch_size samples (default: the preset's), rounded down to whole groups
  of one positive and num_neg negatives; the last step of an epoch takes what is left.
  Loss: BCE with logits averaged over the step's samples (ncf_dist's "global batch").
- Negatives: num_neg per positive, drawn uniformly over the items the user never
  interacted with: candidates uniform over [0, I), rejected and redrawn while they are
  in the user's positives.bin list (its training items and its held-out test item), as
  ncf_dist's sampler does (src/data/negatives.h). The draws come from numpy's PCG64
  (--sampler numpy, the default on a CPU) or torch's generator on the device, keyed by
  --seed and the epoch (--sampler torch, the default with --device cuda: the lists' search
  runs there too), not ncf_dist's Philox stream: the same distribution, not the same
  samples.
- Adam: the preset's learning rate, betas and epsilon (src/train/config.cc), overridable
  like ncf_dist's flags; initialisation as ncf_dist's (docs/training.md), from torch's generator.
- Evaluation: each eval record's list (the held-out positive, then the E negatives
  ncf_prep wrote) is scored; rank = the number of negatives whose mask bit is 1 and whose
  score is not below the positive's (the positive loses ties; a NaN counts against it);
  a hit when rank < K, NDCG term log 2 / log(rank + 2): src/model/metrics.cc's rule.
  --eval_users N takes the same fixed subset of N users as ncf_dist --eval_users N with
  the same --seed (its Philox selection sampling, reimplemented with numpy).
- Time: an epoch's train seconds run from its start to its last optimizer step, negative
  sampling and batch assembly included (ncf_dist's include its reader and sampler);
  samples/s = the epoch's samples / train seconds. The final JSON line also splits out
  the seconds spent in the steps alone.

  /usr/bin/python3 bench/pytorch_neumf.py --data_dir /tmp/bench-ml-1m --preset ncf-paper \\
      --epochs 3 --threads 2
  build/src/ncf_dist --data_dir /tmp/bench-ml-1m --preset ncf-paper --train_epochs 3 \\
      --threads 2 --hr_threshold -1

Output: one line per epoch in ncf_dist's layout (epoch, loss, HR@K, NDCG@K, train_s,
samples/s, eval_s), --metrics_json FILE appends ncf_dist's per-epoch JSON keys, and a
final JSON line {"bench": "pytorch_neumf_train", ...} with every figure.
--self_check runs the metric on hand-made score lists and the Philox generator on its
published test vectors, and exits. --init_params FILE --epochs 0 evaluates the parameters
`ncf_dist --save_params FILE` wrote: the same HR and NDCG as ncf_dist's epoch line, which
checks this evaluation (and the --eval_users subset) against ncf_dist's on one model.

Needs Debian's python3-torch (run with /usr/bin/python3).
"""
import argparse
import ctypes
import json
import math
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
import numpy as np  # noqa: E402
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


# ------------------------------------------------------------------ dataset ---
# The layouts of src/data/format.h: TFRecord frames (uint64 length | masked CRC-32C of it
# | payload | masked CRC-32C of it), ncf_record.proto payloads, positives.bin.

FORMAT_VERSIONS = (1, 2)  # src/data/dataset.h: kOldestFormatVersion .. kFormatVersion
POSITIVES_MAGIC = b"NCFPOS01"
POSITIVES_HEADER = 32  # magic[8], uint64 num_users, uint64 nnz, uint64 reserved


class DataError(Exception):
    """A dataset file that cannot be used; the message names the file."""


def crc32c_function():
    import crcmod.predefined  # python3-crcmod; its C extension reads ~200 MB/s
    return crcmod.predefined.mkCrcFun("crc-32c")


def masked(crc):
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def record_module(record_dir=None):
    """ncf_record_pb2, generated by protoc from the project's own .proto into a temporary
    directory (so it always matches the C++ side's schema), or the one protoc wrote into
    record_dir (--record_module_dir: a machine whose own PATH has no protoc)."""
    import shutil
    import subprocess
    import sys
    import tempfile
    if record_dir:
        if not os.path.isfile(os.path.join(record_dir, "ncf_record_pb2.py")):
            raise DataError(f"--record_module_dir {record_dir}: no ncf_record_pb2.py in it "
                            "(protoc --python_out=DIR src/data/ncf_record.proto)")
        sys.path.insert(0, record_dir)
        import ncf_record_pb2
        return ncf_record_pb2
    proto = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "data",
                         "ncf_record.proto")
    proto = os.path.normpath(proto)
    if not os.path.isfile(proto):
        raise DataError(f"{proto}: not found (the record schema; run from a checkout)")
    if shutil.which("protoc") is None:
        raise DataError("protoc not found: install protobuf-compiler (scripts/setup.sh)")
    out = tempfile.mkdtemp(prefix="ncf_record_pb2_")
    subprocess.run(["protoc", f"--proto_path={os.path.dirname(proto)}", f"--python_out={out}",
                    os.path.basename(proto)], check=True)
    sys.path.insert(0, out)
    import ncf_record_pb2
    shutil.rmtree(out, ignore_errors=True)  # the module is loaded
    return ncf_record_pb2


def load_metadata(d, crc):
    path = os.path.join(d, "metadata.json")
    try:
        with open(path, "rb") as f:
            j = json.loads(f.read().decode("utf-8"))
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror}")
    except ValueError as e:
        raise DataError(f"{path}: not JSON: {e}")
    if not isinstance(j, dict):
        raise DataError(f"{path}: not a JSON object")
    version = j.get("format_version")
    if version not in FORMAT_VERSIONS:
        raise DataError(f"{path}: format_version {version!r} is not supported "
                        f"({FORMAT_VERSIONS[0]} to {FORMAT_VERSIONS[-1]}): re-run ncf_prep")
    if crc is None:
        pass  # --skip_crc
    elif "crc32c" in j:
        # metadata_crc32c(): CRC-32C of nlohmann's compact dump, keys sorted, without the field.
        rest = {k: v for k, v in j.items() if k != "crc32c"}
        canon = json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        got = crc(canon.encode("utf-8"))
        if got != j["crc32c"]:
            raise DataError(f"{path}: the content does not match its crc32c "
                            f"({j['crc32c']:#010x} stored, {got:#010x} computed)")
    elif version == 1:
        print(f"pytorch_neumf: warning: {path} is format version 1, without its own crc32c: "
              "a changed value in it cannot be detected")
    else:
        raise DataError(f"{path}: no crc32c field: re-run ncf_prep")
    need = ["dataset_id", "num_users", "num_items", "num_train", "num_positives",
            "num_eval_users", "eval_negatives", "train_record_rows", "train_frame_bytes",
            "eval_frame_bytes", "shards", "positives"]
    for k in need:
        if k not in j:
            raise DataError(f"{path}: metadata field '{k}' is missing")
    return j


def read_positives(d, meta, crc):
    """positives.bin: offsets [U+1] (int64) and items [nnz] (int32), each user's sorted."""
    path = os.path.join(d, "positives.bin")
    U, nnz = meta["num_users"], meta["num_positives"]
    want = POSITIVES_HEADER + (U + 1) * 8 + nnz * 4
    try:
        raw = np.fromfile(path, dtype=np.uint8)
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror}")
    if raw.size != want or meta["positives"].get("bytes") != want:
        raise DataError(f"{path}: file has {raw.size} bytes, the metadata says "
                        f"{meta['positives'].get('bytes')} ({U} users, {nnz} positives make "
                        f"{want}): re-run ncf_prep")
    got = None if crc is None else crc(raw.data)
    if crc is not None and got != meta["positives"].get("crc32c"):
        raise DataError(f"{path}: CRC-32C {got:#010x}, the metadata says "
                        f"{meta['positives'].get('crc32c', 0):#010x}: the file changed after "
                        "ncf_prep wrote it")
    if raw[:8].tobytes() != POSITIVES_MAGIC:
        raise DataError(f"{path} at byte 0: bad magic (not a positives file)")
    hu, hn = (int(x) for x in raw[8:24].view("<u8"))
    if (hu, hn) != (U, nnz):
        raise DataError(f"{path} at byte 8: header says {hu} users / {hn} positives, "
                        f"the metadata {U} / {nnz}")
    offsets = raw[POSITIVES_HEADER:POSITIVES_HEADER + (U + 1) * 8].view("<i8").astype(np.int64)
    items = raw[POSITIVES_HEADER + (U + 1) * 8:].view("<i4").astype(np.int64)
    if offsets[0] != 0 or offsets[-1] != nnz or np.any(np.diff(offsets) < 0):
        raise DataError(f"{path}: offsets are not 0 .. {nnz} in order")
    if nnz and (items.min() < 0 or items.max() >= meta["num_items"]):
        raise DataError(f"{path}: an item id is outside [0, {meta['num_items']})")
    return offsets, items


def read_shard(d, meta, shard, index, count, crc, pb):
    """Yields (byte offset, payload) of every record of one shard after checking the file
    and its header against the metadata."""
    path = os.path.join(d, shard["name"])
    train = shard["kind"] == "train"
    try:
        with open(path, "rb") as f:
            buf = f.read()
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror}")
    if len(buf) != shard["bytes"]:
        raise DataError(f"{path} at byte offset {min(len(buf), shard['bytes'])}: file has "
                        f"{len(buf)} bytes but the metadata says {shard['bytes']}")

    def frame(off, bad_crc_ok=False):
        if off + 16 > len(buf):
            raise DataError(f"{path}: truncated record header at byte offset {off}")
        n = int.from_bytes(buf[off:off + 8], "little")
        if crc is not None and (int.from_bytes(buf[off + 8:off + 12], "little")
                                != masked(crc(buf[off:off + 8]))):
            raise DataError(f"{path}: bad length CRC in record at byte offset {off}")
        if n > len(buf) - off - 16:
            raise DataError(f"{path}: record at byte offset {off} has length {n}, which runs "
                            f"past the end of the file ({len(buf)} bytes)")
        return n

    if crc is not None and crc(buf) != shard["crc32c"]:
        # Name the first frame whose payload CRC is wrong, else the file as a whole.
        off = 0
        while off < len(buf):
            n = frame(off)
            body = buf[off + 12:off + 12 + n]
            if int.from_bytes(buf[off + 12 + n:off + 16 + n], "little") != masked(crc(body)):
                raise DataError(f"{path}: bad payload CRC in record at byte offset {off}")
            off += 16 + n
        raise DataError(f"{path}: CRC-32C of the file does not match the metadata's")
    n = frame(0)
    h = pb.ShardHeader()
    try:
        h.ParseFromString(buf[12:12 + n])
    except Exception:  # protobuf's DecodeError
        raise DataError(f"{path} at byte offset 0: shard header does not parse")
    rows = meta["train_record_rows"] if train else meta["eval_negatives"] + 1
    want = dict(format_version=meta["format_version"], kind=pb.TRAIN if train else pb.EVAL,
                # a proto bytes field (src/data/ncf_record.proto), the metadata's a string
                dataset_id=meta["dataset_id"].encode(), shard_index=index, num_shards=count,
                num_records=shard["num_records"], first_record=shard["first_record"],
                record_rows=rows, num_users=meta["num_users"], num_items=meta["num_items"],
                num_valid_rows=shard["num_valid_rows"])
    for k, v in want.items():
        if getattr(h, k) != v:
            raise DataError(f"{path} at byte offset 0: header {k} is {getattr(h, k)!r} but the "
                            f"metadata says {v!r}")
    fb = meta["train_frame_bytes"] if train else meta["eval_frame_bytes"]
    start = 16 + n
    if start + shard["num_records"] * fb != len(buf):
        raise DataError(f"{path}: {shard['num_records']} records of {fb} bytes after a "
                        f"{start}-byte header do not fill the file's {len(buf)} bytes")
    for k in range(shard["num_records"]):
        off = start + k * fb
        if frame(off) != fb - 16:
            raise DataError(f"{path} at byte offset {off}: record frame is {frame(off) + 16} "
                            f"bytes, expected {fb}")
        yield path, off, buf[off + 12:off + fb - 4]


def load_dataset(d, check_crc=True, record_dir=None):
    """Everything training and evaluation need from an ncf_prep directory, checked (the
    CRC-32Cs only with check_crc)."""
    crc = crc32c_function() if check_crc else None
    pb = record_module(record_dir)
    meta = load_metadata(d, crc)
    U, I = meta["num_users"], meta["num_items"]
    offsets, pos_items = read_positives(d, meta, crc)
    shards = {kind: sorted((s for s in meta["shards"] if s.get("kind") == kind),
                           key=lambda s: s["first_record"]) for kind in ("train", "eval")}

    # Train positives: the valid rows of every record, in global record order.
    rows = meta["train_record_rows"]
    n_rec = sum(s["num_records"] for s in shards["train"])
    users, items, g = [], [], 0
    for idx, s in enumerate(shards["train"]):
        for path, off, payload in read_shard(d, meta, s, idx, len(shards["train"]), crc, pb):
            r = pb.TrainRecord()
            try:
                r.ParseFromString(payload)
            except Exception:
                raise DataError(f"{path} at byte offset {off}: train record does not parse")
            valid = rows if g + 1 < n_rec else meta["num_train"] - (n_rec - 1) * rows
            if not r.HasField("num_valid") or r.num_valid != valid:
                raise DataError(f"{path} at byte offset {off}: train record has {r.num_valid} "
                                f"valid rows, expected {valid}")
            if len(r.users) != rows * 4 or len(r.items) != rows * 4:
                raise DataError(f"{path} at byte offset {off}: train record arrays hold "
                                f"{len(r.users)}/{len(r.items)} bytes, expected {rows * 4}")
            u = np.frombuffer(r.users, "<i4", valid)
            i = np.frombuffer(r.items, "<i4", valid)
            if valid and (u.min() < 0 or u.max() >= U or i.min() < 0 or i.max() >= I):
                raise DataError(f"{path} at byte offset {off}: a user or item id is outside "
                                f"[0, {U}) x [0, {I})")
            users.append(u)
            items.append(i)
            g += 1
    train_users = np.concatenate(users).astype(np.int64) if users else np.zeros(0, np.int64)
    train_items = np.concatenate(items).astype(np.int64) if items else np.zeros(0, np.int64)
    if train_users.size != meta["num_train"]:
        raise DataError(f"{d}/metadata.json: num_train is {meta['num_train']} but the train "
                        f"shards hold {train_users.size} rows")

    # Eval lists: record g is user g's [positive, E negatives] and its duplicate mask.
    L = meta["eval_negatives"] + 1
    lists, masks, g = [], [], 0
    for idx, s in enumerate(shards["eval"]):
        for path, off, payload in read_shard(d, meta, s, idx, len(shards["eval"]), crc, pb):
            r = pb.EvalRecord()
            try:
                r.ParseFromString(payload)
            except Exception:
                raise DataError(f"{path} at byte offset {off}: eval record does not parse")
            if not r.HasField("user") or r.user != g:
                raise DataError(f"{path} at byte offset {off}: eval record is for user "
                                f"{r.user}, expected {g}")
            if len(r.items) != L * 4 or len(r.dup_mask) != (L + 7) // 8:
                raise DataError(f"{path} at byte offset {off}: eval record holds "
                                f"{len(r.items) // 4} items and {len(r.dup_mask)} mask bytes, "
                                f"expected {L} and {(L + 7) // 8}")
            lists.append(r.items)
            masks.append(r.dup_mask)
            g += 1
    if g != meta["num_eval_users"]:
        raise DataError(f"{d}/metadata.json: num_eval_users is {meta['num_eval_users']} but "
                        f"the eval shards hold {g} records")
    eval_items = np.frombuffer(b"".join(lists), "<i4").reshape(g, L).astype(np.int32)
    eval_mask = np.unpackbits(np.frombuffer(b"".join(masks), np.uint8).reshape(g, -1),
                              axis=1, bitorder="little")[:, :L].astype(bool)
    if g and (eval_items.min() < 0 or eval_items.max() >= I):
        raise DataError(f"{d}: an eval item id is outside [0, {I})")
    if g and not eval_mask[:, 0].all():
        bad = int(np.argmin(eval_mask[:, 0]))
        raise DataError(f"{d}: the eval list of user {bad} masks out its positive")
    return dict(meta=meta, offsets=offsets, pos_items=pos_items, train_users=train_users,
                train_items=train_items, eval_items=eval_items, eval_mask=eval_mask)


# ---------------------------------------------------------- Philox (subset) ---

def philox4x32(c0, c1, c2, c3, k0, k1):
    """Philox-4x32-10 (src/common/philox.h) on uint64 arrays holding 32-bit words."""
    m32 = np.uint64(0xFFFFFFFF)
    c = [np.asarray(x, np.uint64) & m32 for x in (c0, c1, c2, c3)]
    k0, k1 = np.uint64(k0 & 0xFFFFFFFF), np.uint64(k1 & 0xFFFFFFFF)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c[0]
        p1 = np.uint64(0xCD9E8D57) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & m32, (p0 >> np.uint64(32)) ^ c[3] ^ k1,
             p0 & m32]
        k0 = np.uint64((int(k0) + 0x9E3779B9) & 0xFFFFFFFF)
        k1 = np.uint64((int(k1) + 0xBB67AE85) & 0xFFFFFFFF)
    return c


def eval_subset(num_users, want, seed):
    """ncf_dist --eval_users: selection sampling over user ids in order, with
    CounterRng{seed, kStreamEvalUsers = 8, index 0}.uniform_double(u) for user u."""
    want = min(want, num_users)
    d = np.arange(num_users, dtype=np.uint64)
    v = philox4x32(0, 0, d >> np.uint64(1), 8, seed, seed >> 32)
    odd = (d & np.uint64(1)).astype(bool)
    hi = np.where(odd, v[2], v[0])
    lo = np.where(odd, v[3], v[1])
    w = (hi << np.uint64(32)) | lo
    uni = ((w >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)).tolist()
    chosen, sel = 0, []
    for u in range(num_users):
        if chosen >= want:
            break
        if uni[u] * float(num_users - u) < float(want - chosen):
            sel.append(u)
            chosen += 1
    return np.array(sel, dtype=np.int64)


# ------------------------------------------------------------------ metrics ---

def hit_ndcg(scores, mask, K):
    """Sums of hits and NDCG terms over users; scores [n, L] with the positive in column 0,
    mask [n, L] (True: the entry counts). The positive loses ties; NaN counts against it."""
    counted = mask[:, 1:] & ~(scores[:, 1:] < scores[:, :1])
    rank = counted.sum(dim=1).to(torch.float64)
    hit = rank < K
    ndcg = torch.where(hit, math.log(2.0) / torch.log(rank + 2.0), torch.zeros_like(rank))
    return float(hit.sum()), float(ndcg.sum())


def self_check():
    t = torch.tensor
    # The positive (column 0) at 0.5 against negatives; K = 2.
    s = t([[0.5, 0.9, 0.1, 0.2],    # rank 1: hit, 1/log2(3)
           [0.5, 0.5, 0.1, 0.2],    # a tie counts against the positive: rank 1
           [0.5, 0.9, 0.8, 0.2],    # rank 2: no hit at K = 2
           [0.5, 0.9, 0.9, 0.1],    # the second 0.9 is masked (a repeat): rank 1
           [0.5, float("nan"), 0.1, 0.2],  # NaN counts against it: rank 1
           [float("nan"), 0.1, 0.1, 0.1],  # NaN positive: every counted negative beats it
           [0.5, 0.1, 0.1, 0.1]])   # rank 0: 1.0
    m = torch.ones_like(s, dtype=torch.bool)
    m[3, 2] = False
    hr, nd = hit_ndcg(s, m, 2)
    want_hr, want_nd = 5.0, 4 / math.log2(3) + 1.0
    assert hr == want_hr and abs(nd - want_nd) < 1e-12, (hr, nd, want_hr, want_nd)
    hr, nd = hit_ndcg(s, m, 3)  # row 2 (rank 2) is a hit at K = 3; row 5 (rank 3) is not
    assert hr == 6.0 and abs(nd - (want_nd + 0.5)) < 1e-12, (hr, nd)
    hr, nd = hit_ndcg(s, m, 1)  # only rank 0
    assert (hr, nd) == (1.0, 1.0), (hr, nd)
    # Philox-4x32-10 known answers (Random123's kat_vectors).
    kat = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
           ((0xffffffff,) * 4, (0xffffffff, 0xffffffff),
            (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
           ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
            (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]
    for ctr, key, want in kat:
        got = tuple(int(x) for x in philox4x32(*ctr, *key))
        assert got == want, ([hex(x) for x in got], [hex(x) for x in want])
    sub = eval_subset(1000, 100, 1)
    assert sub.size == 100 and np.all(np.diff(sub) > 0), sub
    check_torch_sampler()
    print("pytorch_neumf: self check passed (HR/NDCG on hand-made lists at K = 1, 2, 3; "
          "Philox-4x32-10 known answers; eval subset size; the torch sampler's exclusion)")


# ----------------------------------------------------------------- training ---

def draw_negatives(rng, users, num_neg, pos_keys, I):
    """[n, num_neg] items, uniform over [0, I) minus each user's positives.bin list
    (pos_keys: the sorted keys user * I + item of every list)."""
    neg = rng.integers(0, I, size=(users.size, num_neg), dtype=np.int64)
    u = np.broadcast_to(users[:, None], neg.shape)
    todo = np.ones(neg.shape, dtype=bool)
    while True:
        iu, ij = np.nonzero(todo)
        if iu.size == 0:
            return neg
        keys = u[iu, ij] * I + neg[iu, ij]
        at = np.minimum(np.searchsorted(pos_keys, keys), pos_keys.size - 1)
        hit = pos_keys[at] == keys
        todo[iu[~hit], ij[~hit]] = False
        iu, ij = iu[hit], ij[hit]
        neg[iu, ij] = rng.integers(0, I, size=iu.size, dtype=np.int64)


def draw_negatives_torch(gen, users, num_neg, pos_keys, I):
    """draw_negatives on torch tensors (users [n] and the sorted pos_keys on one device):
    every draw that hits its user's list is drawn again from `gen` until none does."""
    dev = users.device
    neg = torch.randint(0, I, (users.numel(), num_neg), generator=gen, device=dev,
                        dtype=torch.int64)
    if pos_keys.numel() == 0:
        return neg
    u = users[:, None].expand_as(neg)
    todo = torch.ones_like(neg, dtype=torch.bool)
    last = pos_keys.numel() - 1
    while True:
        keys = u * I + neg
        at = torch.searchsorted(pos_keys, keys).clamp_(max=last)
        hit = todo & (pos_keys[at] == keys)
        count = int(hit.sum())
        if count == 0:
            return neg
        neg[hit] = torch.randint(0, I, (count,), generator=gen, device=dev, dtype=torch.int64)
        todo = hit


def check_torch_sampler():
    """Users holding all but one item, some items, or none: every draw avoids its user's
    list, a user with one free item always gets it, and one with none free draws them all."""
    I = 7
    lists = [list(range(I - 1)), [0, 2, 4], []]
    counts = np.array([len(x) for x in lists])
    pos_keys = torch.from_numpy(np.repeat(np.arange(3, dtype=np.int64), counts) * I +
                                np.array([i for x in lists for i in x], dtype=np.int64))
    gen = torch.Generator().manual_seed(5)
    users = torch.tensor([0, 1, 2, 0, 1, 2] * 50, dtype=torch.int64)
    neg = draw_negatives_torch(gen, users, 4, pos_keys, I)
    for k in range(users.numel()):
        u = int(users[k])
        for j in range(4):
            assert 0 <= int(neg[k, j]) < I and int(neg[k, j]) not in lists[u], (u, neg[k])
    assert bool((neg[users == 0] == I - 1).all()), neg[users == 0]
    assert set(int(x) for x in neg[users == 2].flatten()) == set(range(I))


def load_ncf_dist_params(model, path):
    """Parameters from `ncf_dist --save_params FILE` (raw float32): for each tower layer W
    [out x in] then b [out], the head w [F] and c [1] (src/model/neumf.h), then the user
    and the item table [rows x D] in global row order."""
    with torch.no_grad():
        linears = [m for m in model.tower if isinstance(m, nn.Linear)] + [model.head]
        dest = [q for lin in linears for q in (lin.weight, lin.bias)]
        dest += [model.user.weight, model.item.weight]
        flat = np.fromfile(path, dtype="<f4")
        want = sum(q.numel() for q in dest)
        if flat.size != want:
            raise DataError(f"{path}: {flat.size} floats, the model has {want} parameters "
                            "(another preset, --num_factors or --layers?)")
        at = 0
        for q in dest:
            q.copy_(torch.from_numpy(flat[at:at + q.numel()].copy()).view_as(q))
            at += q.numel()


def train_on_data(a, p):
    t_load = time.perf_counter()
    ds = load_dataset(a.data_dir, check_crc=not a.skip_crc, record_dir=a.record_module_dir)
    meta = ds["meta"]
    U, I = meta["num_users"], meta["num_items"]
    load_s = time.perf_counter() - t_load
    S = 1 + p["num_neg"]
    B = (a.batch_size or p["batch_size"]) // S * S
    if B < S:
        raise SystemExit(f"pytorch_neumf: --batch_size must be at least 1 + num_neg = {S}")
    P = B // S  # positives per step
    counts = np.diff(ds["offsets"])
    if counts.size and counts.max() >= I:
        u = int(np.argmax(counts))
        raise SystemExit(f"pytorch_neumf: user {u} interacted with all {I} items: "
                         "no negative exists")
    pos_keys = np.repeat(np.arange(U, dtype=np.int64), counts) * I + ds["pos_items"]
    del ds["pos_items"]

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("pytorch_neumf: --device cuda: torch sees no usable GPU")
    dev = torch.device(a.device)
    model = NeuMF(U, I, p["factors"], p["layers"])
    if a.init_params:
        load_ncf_dist_params(model, a.init_params)
    model = model.to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=p["lr"], betas=(p["beta1"], p["beta2"]),
                           eps=p["eps"])
    loss_fn = nn.BCEWithLogitsLoss()

    # Eval: all users, or ncf_dist's --eval_users subset.
    E1 = meta["eval_negatives"] + 1
    ev_users = np.arange(meta["num_eval_users"], dtype=np.int64)
    if a.eval_users > 0:
        ev_users = eval_subset(meta["num_eval_users"], a.eval_users, a.seed)
    ev_items = torch.from_numpy(ds["eval_items"][ev_users]).to(dev)
    ev_mask = torch.from_numpy(ds["eval_mask"][ev_users]).to(dev)
    ev_users_t = torch.from_numpy(ev_users).to(dev)
    per_eval = max(1, a.eval_batch_size // E1)

    def evaluate():
        t0 = time.perf_counter()
        model.eval()
        hr = nd = 0.0
        with torch.no_grad():
            for b in range(0, ev_users_t.numel(), per_eval):
                it = ev_items[b:b + per_eval].long()
                us = ev_users_t[b:b + per_eval, None].expand_as(it)
                s = model(us.reshape(-1), it.reshape(-1)).view(it.shape)
                h, n = hit_ndcg(s, ev_mask[b:b + per_eval], a.topk)
                hr += h
                nd += n
        model.train()
        n = max(1, ev_users_t.numel())
        return hr / n, nd / n, time.perf_counter() - t0

    tu, ti = ds["train_users"], ds["train_items"]
    n_pos = tu.size
    steps = (n_pos + P - 1) // P
    if a.max_steps > 0:
        steps = min(steps, a.max_steps)
    chunk_steps = max(1, (1 << 20) // P)  # negatives are drawn ~1M positives at a time
    group = torch.zeros(S, device=dev)
    group[0] = 1.0
    core = openblas_core()
    print(f"pytorch_neumf: torch {torch.__version__}, data {a.data_dir} ({U} users, {I} items, "
          f"{n_pos} train positives, {ev_users.size} of {meta['num_eval_users']} eval users x "
          f"1 + {E1 - 1}; read and checked in {load_s:.1f} s), preset {a.preset}, batch {B} "
          f"({P} positives x (1 + {p['num_neg']})), {steps} steps/epoch, Adam lr {p['lr']} "
          f"betas {p['beta1']}/{p['beta2']} eps {p['eps']}, threads {a.threads}, OpenBLAS core "
          f"{core}, OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY', 'default')}, "
          f"device {a.device}")
    K = a.topk
    print(f"{'epoch':>6} {'loss':>9} {'HR@' + str(K):>8} {'NDCG@' + str(K):>8} {'train_s':>9} "
          f"{'samples/s':>12} {'eval_s':>8}", flush=True)
    metrics = open(a.metrics_json, "a") if a.metrics_json else None
    epochs = []
    if a.epochs == 0:
        hr, nd, eval_s = evaluate()
        print(f"{0:6d} {float('nan'):9.5f} {hr:8.4f} {nd:8.4f} {0.0:9.2f} {0.0:12.0f} "
              f"{eval_s:8.2f}  (evaluation only)", flush=True)
        print(json.dumps(dict(bench="pytorch_neumf_eval", data_dir=a.data_dir,
                              init_params=a.init_params, eval_users=int(ev_users.size), k=K,
                              hr=hr, ndcg=nd, eval_seconds=eval_s)))
        return
    sampler = a.sampler or ("torch" if a.device == "cuda" else "numpy")
    pos_keys_t = torch.from_numpy(pos_keys).to(dev) if sampler == "torch" else None
    for e in range(a.epochs):
        rng = np.random.default_rng([a.seed, e])
        gen = None
        if sampler == "torch":
            gen = torch.Generator(device=dev)
            gen.manual_seed(int(a.seed) * 1000003 + e)
        t0 = time.perf_counter()
        order = rng.permutation(n_pos)[:steps * P]
        step_s = sample_s = 0.0
        loss_sum, samples, done = 0.0, 0, 0
        while done < steps:
            c1 = min(steps, done + chunk_steps)
            ts = time.perf_counter()
            sel = order[done * P:c1 * P]
            us, its = tu[sel], ti[sel]
            if sampler == "torch":
                us_t = torch.from_numpy(us).to(dev)
                neg = draw_negatives_torch(gen, us_t, p["num_neg"], pos_keys_t, I)
                users = us_t.repeat_interleave(S)
                items = torch.cat([torch.from_numpy(its).to(dev)[:, None], neg],
                                  dim=1).reshape(-1)
            else:
                neg = draw_negatives(rng, us, p["num_neg"], pos_keys, I)
                users = torch.from_numpy(np.repeat(us, S)).to(dev)
                items = torch.from_numpy(
                    np.concatenate([its[:, None], neg], axis=1).reshape(-1)).to(dev)
            labels = group.repeat(sel.size)
            sample_s += time.perf_counter() - ts
            for k in range(c1 - done):
                ts = time.perf_counter()
                lo, hi = k * B, min((k + 1) * B, labels.numel())
                loss = loss_fn(model(users[lo:hi], items[lo:hi]), labels[lo:hi])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                loss_sum += loss.item()
                samples += hi - lo
                step_s += time.perf_counter() - ts
            done = c1
        train_s = time.perf_counter() - t0
        hr, nd, eval_s = evaluate() if not a.no_eval else (0.0, 0.0, 0.0)
        r = dict(epoch=e + 1, loss=loss_sum / max(1, steps), hr=hr, ndcg=nd, k=K,
                 train_seconds=train_s, samples_per_second=samples / train_s if train_s else 0,
                 eval_seconds=eval_s, steps=steps, samples=samples, step_seconds=step_s,
                 sampling_seconds=sample_s)
        epochs.append(r)
        print(f"{e + 1:6d} {r['loss']:9.5f} {hr:8.4f} {nd:8.4f} {train_s:9.2f} "
              f"{r['samples_per_second']:12.0f} {eval_s:8.2f}", flush=True)
        if metrics:
            metrics.write(json.dumps(r) + "\n")
            metrics.flush()
    total_s = sum(r["train_seconds"] for r in epochs)
    total_n = sum(r["samples"] for r in epochs)
    print(json.dumps(dict(
        bench="pytorch_neumf_train", torch=torch.__version__, preset=a.preset,
        data_dir=a.data_dir, device=a.device, sampler=sampler, users=U, items=I,
        train_positives=int(n_pos),
        eval_users=int(ev_users.size), eval_negatives=E1 - 1, batch=B, num_neg=p["num_neg"],
        lr=p["lr"], beta1=p["beta1"], beta2=p["beta2"], eps=p["eps"], threads=a.threads,
        openblas_core=core, omp_wait_policy=os.environ.get("OMP_WAIT_POLICY", "default"),
        seed=a.seed, epochs=len(epochs), steps_per_epoch=steps, k=K,
        hr=epochs[-1]["hr"] if epochs else None, ndcg=epochs[-1]["ndcg"] if epochs else None,
        samples_per_second=total_n / total_s if total_s else 0, train_seconds=total_s,
        step_seconds=sum(r["step_seconds"] for r in epochs), load_seconds=load_s,
        per_epoch=epochs)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, help="random ids: U, rows of the user table")
    ap.add_argument("--items", type=int, help="random ids: I, rows of the item table")
    ap.add_argument("--data_dir", help="train and evaluate on this ncf_prep dataset instead "
                    "of timing steps of random ids")
    ap.add_argument("--skip_crc", action="store_true",
                    help="--data_dir: do not check the files' CRC-32Cs (for a machine without "
                    "crcmod, on data another reader checked; every other check is made)")
    ap.add_argument("--record_module_dir",
                    help="--data_dir: import ncf_record_pb2 from this folder (written by "
                    "protoc --python_out) instead of running protoc")
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
    g = ap.add_argument_group("--data_dir mode")
    g.add_argument("--epochs", type=int, default=1, help="epochs to train (ncf_dist's "
                   "--train_epochs; 0: evaluate once, e.g. with --init_params)")
    g.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the model, its batches and the evaluation live")
    g.add_argument("--max_steps", type=int, default=-1,
                   help="stop each epoch after this many steps (negative: whole epochs)")
    g.add_argument("--topk", type=int, default=10, help="K of HR@K and NDCG@K")
    g.add_argument("--eval_batch_size", type=int, default=100000,
                   help="eval samples (users x (1 + E)) scored per batch")
    g.add_argument("--eval_users", type=int, default=0,
                   help="evaluate ncf_dist's fixed subset of this many users, drawn with "
                   "--seed (0: all)")
    g.add_argument("--no_eval", action="store_true", help="skip evaluation after each epoch")
    g.add_argument("--sampler", choices=["numpy", "torch"],
                   help="where negatives are drawn and checked against the lists: numpy on "
                   "the host, or torch on --device (default: torch with cuda, else numpy)")
    g.add_argument("--metrics_json", help="append one JSON line per epoch to this file")
    g.add_argument("--init_params", help="start from the parameters `ncf_dist --save_params` "
                   "wrote (with --epochs 0: evaluate them and stop), to hold this script's "
                   "evaluation against ncf_dist's on one model")
    for flag, key in (("--learning_rate", "lr"), ("--beta1", "beta1"), ("--beta2", "beta2"),
                      ("--epsilon", "eps")):
        g.add_argument(flag, type=float, dest=key, help="overrides the preset's")
    g.add_argument("--num_neg", type=int, help="negatives per positive (overrides the preset's)")
    ap.add_argument("--self_check", action="store_true",
                    help="check the HR/NDCG rule and the Philox generator on known cases, exit")
    a = ap.parse_args()
    if a.self_check:
        return self_check()

    p = dict(PRESETS[a.preset])
    for key in ("lr", "beta1", "beta2", "eps", "num_neg"):
        if getattr(a, key) is not None:
            p[key] = getattr(a, key)
    if a.data_dir:
        if a.users is not None or a.items is not None:
            ap.error("--data_dir takes the table sizes from the dataset: drop --users/--items")
        if a.embedding_optimizer != "dense_adam":
            ap.error("--data_dir trains with dense Adam only (ncf_dist's default)")
        try:
            return train_on_data(a, p)
        except DataError as e:
            raise SystemExit(f"pytorch_neumf: {e}")
    if a.users is None or a.items is None:
        ap.error("give --users and --items (random ids), or --data_dir")
    if a.device != "cpu":
        ap.error("--device is a --data_dir option (random ids run on the CPU)")
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
