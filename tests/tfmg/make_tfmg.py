#!/usr/bin/env python3
"""Writes TensorFlow Model Garden NCF shards (official/recommendation:
create_ncf_data.py's layout with int64 features) from a ratings file, for the
tests of `ncf_prep --format tfmg`. It shares no code with ncf_prep: records are
tf.train.Example messages built with Python's protobuf runtime from a module
that `protoc --python_out` generates, at run time, from src/data/tf_example.proto;
TFRecord frames and their masked CRC-32C are written here (crcmod's crc-32c).

Preprocessing follows ncf_prep's MovieLens rules so both paths split alike:
a repeated (user, item) keeps its latest (timestamp, line); users with fewer
than --min_ratings items are dropped; dense ids in ascending raw-id order;
each user's latest (timestamp, then later line) item is held out.

Then TF-MG's data: per training cycle, every training positive once plus
--num_neg negatives each, uniform over the items outside the user's training
positives, shuffled, cut into prebatches of --train_batch rows (the last one
padded: user = k % num_users, item = k % num_items, label 0, valid 0), batch b
into shard b % --shards. Eval: per user, E negatives drawn with replacement
outside its training positives; duplicate_mask over [true, n_1 .. n_E]
(1 = repeats an earlier entry), then positions 0 and E swapped in items and
mask; users in id order, --eval_batch rows per batch, the last batch padded
with user 0 / item 0 users. meta_data.json as TF-MG writes it.

--truth FILE gets what was written: every user's training items and true item,
and its eval candidates and mask exactly as in the shards. --fault NAME writes
one defect (see FAULTS) and records in the truth file where it is.

  make_tfmg.py --proto src/data/tf_example.proto --ratings u.data --out DIR --truth truth.json
"""

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

FAULTS = [
    "none",
    "bad_crc",  # payload CRC of one training record flipped
    "feature_name",  # 'labels' renamed 'label' in one training record
    "wrong_length",  # item_id one value short in one training record
    "bytes_list",  # every feature a BytesList of raw bytes (the pre-2019 layout)
    "missing_cycle",  # the last training_cycle_<e> directory removed
    "missing_shard",  # eval_data/shard_3.tfrecords removed
    "meta_train_elements",  # meta_data.json num_train_elements one too many
    "cycle_other_positive",  # cycle 1: one positive's item replaced by a non-positive
    "cycle_repeat_positive",  # cycle 1: one positive replaced by another of the same user
    "cycle_missing_positive",  # cycle 1: one positive's label set to 0
    "eval_mask",  # eval: one mask value of a real user flipped
    "eval_repeat_user",  # eval: a user's list written under the previous user's id
    "bad_label",  # a label of 2 in one training record
]


# ----------------------------------------------------------------- framing ---

def crc32c_function():
    import crcmod.predefined

    fn = crcmod.predefined.mkCrcFun("crc-32c")
    assert fn(b"123456789") == 0xE3069283, "crcmod's crc-32c is not CRC-32C (Castagnoli)"
    return fn


CRC32C = crc32c_function()


def masked_crc(data):
    c = CRC32C(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(payload, corrupt_crc=False):
    head = struct.pack("<Q", len(payload))
    crc = masked_crc(payload) ^ (1 if corrupt_crc else 0)
    return head + struct.pack("<I", masked_crc(head)) + payload + struct.pack("<I", crc)


class ShardSet:
    """shard_0 .. shard_{n-1}.tfrecords of one directory; batch b goes to shard b % n."""

    def __init__(self, directory, n):
        os.makedirs(directory, exist_ok=True)
        self.paths = [os.path.join(directory, "shard_%d.tfrecords" % k) for k in range(n)]
        self.files = [open(p, "wb") for p in self.paths]
        self.offsets = [0] * n

    def write(self, batch, payload, corrupt_crc=False):
        k = batch % len(self.files)
        at = (self.paths[k], self.offsets[k])
        data = frame(payload, corrupt_crc)
        self.files[k].write(data)
        self.offsets[k] += len(data)
        return at

    def close(self):
        for f in self.files:
            f.close()


# ------------------------------------------------------------ tf.Example ---

def load_proto_module(proto):
    out = tempfile.mkdtemp(prefix="tfmg_proto_")
    subprocess.run(["protoc", "--proto_path=" + os.path.dirname(os.path.abspath(proto)),
                    "--python_out=" + out, os.path.abspath(proto)], check=True)
    sys.path.insert(0, out)
    import tf_example_pb2  # noqa: E402 (generated just above)

    return tf_example_pb2, out


def example(pb, features, as_bytes=False):
    ex = pb.Example()
    for name, values in features.items():
        f = ex.features.feature[name]
        if as_bytes:
            f.bytes_list.value.append(np.asarray(values, dtype=np.int32).tobytes())
        else:
            f.int64_list.value.extend(int(v) for v in values)
    return ex.SerializeToString()


# ----------------------------------------------------------- preprocessing ---

def read_ratings(path, min_ratings):
    latest = {}  # (user, item) -> (timestamp, line)
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) == 3:
                u, i, t = parts
            elif len(parts) == 4:
                u, i, _, t = parts
            else:
                sys.exit("%s:%d: expected 'user item [rating] timestamp'" % (path, line_no))
            key, when = (int(u), int(i)), (int(t), line_no)
            if key not in latest or when > latest[key]:
                latest[key] = when
    by_user = {}
    for (u, i), (t, line_no) in latest.items():
        by_user.setdefault(u, []).append((t, line_no, i))
    kept = sorted(u for u, v in by_user.items() if len(v) >= min_ratings)
    items = sorted({i for u in kept for (_, _, i) in by_user[u]})
    item_id = {i: k for k, i in enumerate(items)}
    train, test = [], []
    for u in kept:
        held = max(by_user[u])  # latest timestamp, then the later line
        test.append(item_id[held[2]])
        train.append(sorted(item_id[i] for (t, l, i) in by_user[u] if (t, l, i) != held))
    return train, test, len(items)


def draw_outside(rng, users, keys, num_items):
    """One item per entry of `users`, uniform over the items whose key
    user * num_items + item is not in `keys` (sorted): rejection, vectorised."""
    items = rng.integers(0, num_items, len(users))
    while True:
        k = users * num_items + items
        pos = np.minimum(np.searchsorted(keys, k), len(keys) - 1)
        bad = keys[pos] == k
        if not bad.any():
            return items
        items[bad] = rng.integers(0, num_items, int(bad.sum()))


def first_occurrence_repeats(values):
    seen, mask = set(), []
    for v in values:
        mask.append(1 if v in seen else 0)
        seen.add(v)
    return mask


# ------------------------------------------------------------------- main ---

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--proto", required=True, help="src/data/tf_example.proto")
    ap.add_argument("--ratings", required=True, help="user item [rating] timestamp per line")
    ap.add_argument("--out", required=True, help="TF-MG data directory to write")
    ap.add_argument("--truth", help="JSON file of what was written")
    ap.add_argument("--num_neg", type=int, default=4)
    ap.add_argument("--eval_negatives", type=int, default=999)
    ap.add_argument("--epochs", type=int, default=3, help="training cycles")
    ap.add_argument("--train_batch", type=int, default=1024, help="train_prebatch_size")
    ap.add_argument("--eval_users_per_batch", type=int, default=4,
                    help="eval_prebatch_size = this x (1 + eval_negatives)")
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--min_ratings", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fault", default="none", choices=FAULTS)
    a = ap.parse_args()

    pb, proto_dir = load_proto_module(a.proto)
    try:
        run(a, pb)
    finally:
        shutil.rmtree(proto_dir, ignore_errors=True)


def run(a, pb):
    rng = np.random.default_rng(a.seed)
    train, test, num_items = read_ratings(a.ratings, a.min_ratings)
    U, E = len(train), a.eval_negatives
    L = E + 1
    if U == 0:
        sys.exit("no user with %d ratings" % a.min_ratings)
    for u in range(U):
        if len(train[u]) >= num_items:
            sys.exit("user %d has every item as a training positive" % u)
    users = np.repeat(np.arange(U, dtype=np.int64), [len(t) for t in train])
    items = np.concatenate([np.asarray(t, dtype=np.int64) for t in train])
    keys = np.sort(users * num_items + items)
    P = len(items)
    as_bytes = a.fault == "bytes_list"
    fault = {"kind": a.fault}
    if os.path.exists(a.out):
        shutil.rmtree(a.out)
    os.makedirs(a.out)

    # --------------------------------------------------------- training cycles
    elements = P * (1 + a.num_neg)
    train_steps = -(-elements // a.train_batch)
    # The faulty record: the second of shard 0 when there is one.
    fault_batch = a.shards if train_steps > a.shards else 0
    for e in range(a.epochs):
        neg_users = np.repeat(users, a.num_neg)
        neg_items = draw_outside(rng, neg_users, keys, num_items)
        cu = np.concatenate([users, neg_users])
        ci = np.concatenate([items, neg_items])
        cl = np.concatenate([np.ones(P, np.int64), np.zeros(P * a.num_neg, np.int64)])
        perm = rng.permutation(elements)
        cu, ci, cl = cu[perm], ci[perm], cl[perm]
        shards = ShardSet(os.path.join(a.out, "training_cycle_%d" % e), a.shards)
        for b in range(train_steps):
            lo, hi = b * a.train_batch, min((b + 1) * a.train_batch, elements)
            pad = a.train_batch - (hi - lo)
            k = np.arange(pad, dtype=np.int64)
            f = {
                "user_id": np.concatenate([cu[lo:hi], k % U]),
                "item_id": np.concatenate([ci[lo:hi], k % num_items]),
                "labels": np.concatenate([cl[lo:hi], np.zeros(pad, np.int64)]),
                "valid_point_mask": np.concatenate([np.ones(hi - lo, np.int64),
                                                    np.zeros(pad, np.int64)]),
            }
            corrupt = False
            here = e == 0 and b == fault_batch and a.fault in (
                "feature_name", "wrong_length", "bad_label", "bad_crc")
            if here and a.fault == "feature_name":
                f["label"] = f.pop("labels")
            elif here and a.fault == "wrong_length":
                f["item_id"] = f["item_id"][:-1]
            elif here and a.fault == "bad_label":
                f["labels"] = f["labels"].copy()
                f["labels"][3] = 2
            elif here and a.fault == "bad_crc":
                corrupt = True
            elif e == 1 and b == fault_batch and a.fault.startswith("cycle_"):
                rows = [r for r in range(hi - lo) if f["labels"][r] == 1 and
                        len(train[f["user_id"][r]]) >= 2]
                r = rows[0]
                u, i = int(f["user_id"][r]), int(f["item_id"][r])
                f["item_id"] = f["item_id"].copy()
                f["labels"] = f["labels"].copy()
                if a.fault == "cycle_other_positive":
                    f["item_id"][r] = next(j for j in range(num_items) if j not in train[u])
                elif a.fault == "cycle_repeat_positive":
                    f["item_id"][r] = next(j for j in train[u] if j != i)
                else:
                    f["labels"][r] = 0
                fault.update(user=u, item=i, new_item=int(f["item_id"][r]))
                here = True
            at = shards.write(b, example(pb, f, as_bytes), corrupt)
            if here or (as_bytes and e == 0 and b == 0):
                fault.update(file=at[0], offset=at[1])
        shards.close()

    # -------------------------------------------------------------------- eval
    eval_batch = a.eval_users_per_batch * L
    eval_steps = -(-(U * L) // eval_batch)
    lists = []
    for u in range(U):
        negs = draw_outside(rng, np.full(E, u, np.int64), keys, num_items)
        pre = [test[u]] + [int(x) for x in negs]
        mask = first_occurrence_repeats(pre)
        pre[0], pre[E] = pre[E], pre[0]
        mask[0], mask[E] = mask[E], mask[0]
        lists.append((pre, mask))
    pad_items = [0] * L
    pad_mask = first_occurrence_repeats(pad_items)
    pad_mask[0], pad_mask[E] = pad_mask[E], pad_mask[0]
    shards = ShardSet(os.path.join(a.out, "eval_data"), a.shards)
    for b in range(eval_steps):
        f = {"user_id": [], "item_id": [], "duplicate_mask": []}
        for s in range(a.eval_users_per_batch):
            u = b * a.eval_users_per_batch + s
            its, mk = lists[u] if u < U else (pad_items, pad_mask)
            if u < U and a.fault == "eval_mask" and u == U // 2:
                j = next(j for j in range(E) if mk[j] == 0)  # a counted negative
                mk = list(mk)
                mk[j] = 1
                fault.update(user=u)
            uid = u if u < U else 0
            if a.fault == "eval_repeat_user" and u == U // 2:
                uid = u - 1
                fault.update(user=uid)
            f["user_id"] += [uid] * L
            f["item_id"] += its
            f["duplicate_mask"] += mk
        at = shards.write(b, example(pb, f, as_bytes))
        if "user" in fault and a.fault.startswith("eval_") and "file" not in fault:
            fault.update(file=at[0], offset=at[1])
    shards.close()

    meta = {
        "num_users": U,
        "num_items": num_items,
        "constructor_type": "bisection",
        "num_train_elements": elements + (1 if a.fault == "meta_train_elements" else 0),
        "num_eval_elements": U * L,
        "num_train_epochs": a.epochs,
        "train_prebatch_size": a.train_batch,
        "eval_prebatch_size": eval_batch,
        "num_train_steps": train_steps,
        "num_eval_steps": eval_steps,
    }
    with open(os.path.join(a.out, "meta_data.json"), "w") as f:
        json.dump(meta, f, indent=2)

    if a.fault in ("cycle_repeat_positive", "cycle_missing_positive", "eval_repeat_user"):
        # Named by its directory: which of two records (or the cycle) the error names varies.
        fault.update(file=os.path.dirname(fault["file"]))
    if a.fault == "missing_cycle":
        gone = os.path.join(a.out, "training_cycle_%d" % (a.epochs - 1))
        shutil.rmtree(gone)
        fault.update(file=gone)
    elif a.fault == "missing_shard":
        gone = os.path.join(a.out, "eval_data", "shard_3.tfrecords")
        os.remove(gone)
        fault.update(file=gone)
    elif a.fault == "meta_train_elements":
        fault.update(file=os.path.join(a.out, "meta_data.json"))

    if a.truth:
        with open(a.truth, "w") as f:
            json.dump({
                "num_users": U, "num_items": num_items, "num_train": P,
                "eval_negatives": E, "num_neg": a.num_neg,
                "train": train, "test": test,
                "eval_items": [x[0] for x in lists], "eval_mask": [x[1] for x in lists],
                "padding_users": eval_steps * a.eval_users_per_batch - U,
                "fault": fault,
            }, f)


if __name__ == "__main__":
    main()
