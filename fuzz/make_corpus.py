#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/) from
real files the project writes: tiny MovieLens, NCF-paper and CSV inputs, the
datasets build/src/ncf_prep prepares from them and from its synthetic
generator, TF Model Garden shards from tests/tfmg/make_tfmg.py, and a
checkpoint that build/src/ncf_dist writes. Each seed is laid out as its
target reads its input (the target's opening comment): a mode byte, then
files separated by SEP_FILE, records separated by SEP_RECORD.

  fuzz/make_corpus.py [--build build] [--out fuzz/corpus]

Run again after a format change; the seeds are kept in the repository, a few
KB each.
"""

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

SEP_FILE = b"\n=ncf-fuzz-file=\n"
SEP_RECORD = b"\n=ncf-fuzz-record=\n"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def frames(data):
    """The payloads of a TFRecord-framed file (CRCs are not checked here)."""
    out, at = [], 0
    while at + 12 <= len(data):
        (n,) = struct.unpack_from("<Q", data, at)
        out.append(data[at + 12 : at + 12 + n])
        at += 16 + n
    return out


def records_part(data):
    parts = frames(data)
    for p in parts:
        assert SEP_RECORD not in p and SEP_FILE not in p
    return SEP_RECORD.join(parts)


def read(path):
    with open(path, "rb") as f:
        return f.read()


class Corpus:
    def __init__(self, out):
        self.out = out
        self.count = {}

    def add(self, target, name, data):
        d = os.path.join(self.out, target)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


def run(cmd, **kw):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, **kw)


# ------------------------------------------------------------- raw inputs ---

def udata_lines(users=9, items=14):
    """A u.data-like file: raw ids with gaps, repeats and equal timestamps."""
    lines = []
    t = 874965758
    for u in range(users):
        for k in range(3 + u % 4):
            item = 1 + (u * 5 + k * 3) % items
            lines.append((10 + u * 3, item, 1 + (u + k) % 5, t + (k * 7 + u) % 11))
    lines.append(lines[2])  # a repeated pair
    return lines


def write_inputs(tmp):
    rows = udata_lines()
    udata = "".join("%d\t%d\t%d\t%d\n" % r for r in rows).encode()
    dat = "".join("%d::%d::%d::%d\n" % r for r in rows).encode()
    csv = ("userId,movieId,rating,timestamp\n" +
           "".join("%d,%d,%d.5,%d\r\n" % (u, i, min(r, 4), t) for u, i, r, t in rows)).encode()
    # NCF paper: users 0..5, train lines, one test line per user, 4 negatives each.
    train, test, neg = [], [], []
    for u in range(6):
        for k in range(3):
            train.append("%d\t%d\t%d\t%d" % (u, (u + 2 * k) % 11, 4, 978300760 + k))
        test.append("%d\t%d\t5\t978301000" % (u, (u + 7) % 11))
        neg.append("(%d,%d)\t" % (u, (u + 7) % 11) + "\t".join(str((u + 9 + j) % 11) for j in range(4)))
    paper = ["\n".join(x).encode() + b"\n" for x in (train, test, neg)]
    # An interaction log: string ids (one quoted with a comma, one with a quote),
    # ISO timestamps with offsets and fractions, ratings, a header.
    log = [b"customer_id,sku,ts,stars"]
    for u in range(8):
        for k in range(2 + u % 3):
            user = b'"cust,%d"' % u if u == 3 else (b'"c""%d"' % u if u == 5 else b"c%02x" % (u * 37))
            log.append(b"%s,SKU-%03d,2019-03-%02dT0%d:1%d:0%d.%dZ,%d" %
                       (user, (u * 7 + k * 5) % 19, 1 + u, k, u % 6, k, u, 1 + (u + k) % 5))
    log.append(b"c07,SKU-001,2019-03-09 10:11:12+02:00,4")
    log.append(b"c07,SKU-002,1552125600,2")
    csvlog = b"\r\n".join(log) + b"\r\n"
    paths = {}
    for name, data in [("u.data", udata), ("ratings.dat", dat), ("ratings.csv", csv),
                       ("log.csv", csvlog), ("p.train.rating", paper[0]),
                       ("p.test.rating", paper[1]), ("p.test.negative", paper[2])]:
        p = os.path.join(tmp, name)
        with open(p, "wb") as f:
            f.write(data)
        paths[name] = p
    return paths


# -------------------------------------------------------------- datasets ---

def dataset_bundle(d):
    meta = read(os.path.join(d, "metadata.json"))
    j = json.loads(meta)
    parts = [meta, read(os.path.join(d, "positives.bin"))]
    for s in j["shards"]:
        parts.append(records_part(read(os.path.join(d, s["name"]))))
    for which in ("user", "item"):
        if "id_maps" in j:
            parts.append(read(os.path.join(d, j["id_maps"][which]["name"])))
    for p in parts:
        assert SEP_FILE not in p
    return SEP_FILE.join(parts)


def dataset_seeds(c, name, d):
    j = json.loads(read(os.path.join(d, "metadata.json")))
    meta = read(os.path.join(d, "metadata.json"))
    c.add("metadata", name + "-sealed", b"\x00" + meta)
    c.add("metadata", name + "-raw", b"\x01" + meta)
    c.add("dataset", name, b"\x00" + dataset_bundle(d))
    pos = read(os.path.join(d, "positives.bin"))
    c.add("positives", name, b"\x00" + struct.pack("<I", j["num_items"]) + pos)
    if "id_maps" in j:
        m = j["id_maps"]
        mode = (1 if m["user"].get("kind") == "string" else 0) | \
               (2 if m["item"].get("kind") == "string" else 0)
        c.add("id_maps", name, bytes([mode]) +
              struct.pack("<HH", m["user"]["count"] & 0xffff, m["item"]["count"] & 0xffff) +
              read(os.path.join(d, m["user"]["name"])) + SEP_FILE +
              read(os.path.join(d, m["item"]["name"])))
    # Records: a whole shard file, its payloads to frame, one record of each kind.
    train = [s for s in j["shards"] if s["kind"] == "train"][0]
    ev = [s for s in j["shards"] if s["kind"] == "eval"][0]
    tdata, edata = read(os.path.join(d, train["name"])), read(os.path.join(d, ev["name"]))
    c.add("records", name + "-file", b"\x00\x00\x00\x00\x00" + tdata)
    c.add("records", name + "-framed", b"\x01\x00\x00\x00\x00" + records_part(edata))
    rows = j["train_record_rows"]
    tpay = frames(tdata)[1]
    valid = rows if train["num_records"] > 1 else train["num_valid_rows"]
    c.add("records", name + "-train", bytes([2, (rows - 1) % 16, min(j["num_users"], 256) - 1,
                                             min(j["num_items"], 256) - 1, valid]) + tpay)
    epay = frames(edata)[1]
    given = 1 if j.get("eval_masks") == "given" else 0
    c.add("records", name + "-eval", bytes([3, j["eval_negatives"] % 24, min(j["num_users"], 256) - 1,
                                            min(j["num_items"], 256) - 1, given | (ev["first_record"] << 1)]) + epay)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "fuzz", "corpus"))
    args = ap.parse_args()
    prep = os.path.join(args.build, "src", "ncf_prep")
    c = Corpus(args.out)
    tmp = tempfile.mkdtemp(prefix="ncf-corpus-")
    try:
        inp = write_inputs(tmp)
        small = ["--record_rows", "5", "--num_shards", "2", "--eval_negatives", "3", "--threads", "1"]
        ds = {}
        ds["synthetic"] = os.path.join(tmp, "syn")
        run([prep, "--synthetic", "custom", "--users", "7", "--items", "40", "--interactions", "40",
             "--min_per_user", "3", "--output", ds["synthetic"]] + small)
        ds["movielens"] = os.path.join(tmp, "ml")
        run([prep, "--input", inp["u.data"], "--output", ds["movielens"]] + small)
        ds["csv"] = os.path.join(tmp, "csv")
        run([prep, "--input", inp["log.csv"], "--format", "csv", "--columns",
             "user=customer_id,item=sku,timestamp=ts,rating=stars", "--output", ds["csv"]] + small)
        ds["ncf-paper"] = os.path.join(tmp, "paper")
        run([prep, "--input", os.path.join(tmp, "p"), "--format", "ncf-paper", "--output",
             ds["ncf-paper"], "--record_rows", "5", "--num_shards", "2", "--eval_negatives", "4",
             "--threads", "1"])
        tf = os.path.join(tmp, "tf")
        run([sys.executable, os.path.join(ROOT, "tests", "tfmg", "make_tfmg.py"), "--proto",
             os.path.join(ROOT, "src", "data", "tf_example.proto"), "--ratings", inp["u.data"],
             "--out", tf, "--num_neg", "1", "--eval_negatives", "3", "--epochs", "2",
             "--train_batch", "16", "--eval_users_per_batch", "3", "--shards", "1"])
        ds["tfmg"] = os.path.join(tmp, "tfds")
        run([prep, "--input", tf, "--format", "tfmg", "--output", ds["tfmg"], "--record_rows", "5",
             "--num_shards", "2", "--threads", "1"])
        for name, d in ds.items():
            dataset_seeds(c, name, d)

        # Text sources.
        c.add("movielens", "u.data", b"\x10\x00" + read(inp["u.data"]))
        c.add("movielens", "ratings.dat", b"\x11\x01" + read(inp["ratings.dat"]))
        c.add("movielens", "ratings.csv", b"\x12\x04" + read(inp["ratings.csv"]))
        c.add("movielens", "detected", b"\x17\x02" + read(inp["ratings.csv"]))
        c.add("ncf_paper", "ml-1m", b"\x01" + SEP_FILE.join(
            read(inp[n]) for n in ("p.train.rating", "p.test.rating", "p.test.negative")))
        log = read(inp["log.csv"])
        c.add("csv", "by-name", b"\x80\x00user=customer_id,item=sku,timestamp=ts,rating=stars" +
              SEP_FILE + log)
        c.add("csv", "by-position-gz", b"\xf4\x05user=0,item=1,timestamp=2,rating=3" + SEP_FILE + log)
        c.add("csv", "ids-only", b"\x88\x40user=0,item=1" + SEP_FILE +
              b"".join(b"u%d,i%d\n" % (k % 5, (k * 3) % 7) for k in range(20)))
        c.add("csv", "tab-skip", b"\xa2\x01user=0,item=2,timestamp=1" + SEP_FILE +
              b"a\t2020-01-01\tx\nb\t2020-01-02\ty\na\t2020-01-03\t\"z\"\"q\"\n"
              b"b\tnot-a-time\tw\nb\t2020-02-29T12:00\tv\na\t5\" screen\tu\n")
        for k, ts in enumerate([b"1552125600", b"-86400", b"2019-03-04", b"2019-03-04T05:06:07",
                                b"2019-03-04 05:06:07Z", b"2019-03-04T05:06:07.123456+05:30",
                                b"2019-03-04T05:06-0800", b"2000-02-29T23:59:60+01", b" 2019-03-04 "]):
            c.add("csv_timestamp", "ts%d" % k, ts)

        # ncf_recommend lists: maps from the MovieLens and CSV datasets' ids.
        users_int = b"\n".join(b"%d" % (10 + 3 * u) for u in range(9))
        items_int = b"\n".join(b"%d" % i for i in range(1, 15))
        users_str = b"c00\nc25\ncust,3\nc\"5\nc6f"
        items_str = b"SKU-000\nSKU-005\nSKU-012"
        c.add("recommend_lists", "inline-int", b"\x00" + b"10,13, 16 ,40" + SEP_FILE + users_int +
              SEP_FILE + items_int)
        c.add("recommend_lists", "file-int", b"\x01" + b"user\n10\n\n13\n" + SEP_FILE + users_int +
              SEP_FILE + items_int)
        c.add("recommend_lists", "pairs-str", b"\x0e" + b"user,item\n\"cust,3\",SKU-005\nc00,SKU-000\n" +
              SEP_FILE + users_str + SEP_FILE + items_str)
        c.add("recommend_lists", "inline-str", b"\x04" + b"\"cust,3\",\"c\"\"5\",c00" + SEP_FILE +
              users_str + SEP_FILE + items_str)
        c.add("recommend_lists", "identity", b"\x12" + b"0,1\n2,3\n" + SEP_FILE + b"a\nb\nc\nd" +
              SEP_FILE + b"a\nb\nc\nd\ne")

        # TF-MG input: meta_data.json, eval_data, the cycles.
        meta = read(os.path.join(tf, "meta_data.json"))
        parts = [meta, records_part(read(os.path.join(tf, "eval_data", "shard_0.tfrecords")))]
        for e in range(2):
            parts.append(records_part(read(os.path.join(tf, "training_cycle_%d" % e, "shard_0.tfrecords"))))
        c.add("tfmg", "two-cycles", b"\x00" + SEP_FILE.join(parts))
        c.add("tfmg", "first-cycle", b"\x04" + SEP_FILE.join(parts[:3]))

        # Checkpoints of a tiny model trained on the synthetic dataset: SGD
        # (tables only) and lazy Adam (with the tables' moments).
        dist = os.path.join(args.build, "src", "ncf_dist")
        for opt in ("sgd", "lazy_adam"):
            ck = os.path.join(tmp, "ck-" + opt)
            run([dist, "--data_dir", ds["synthetic"], "--num_factors", "2", "--layers", "4,2",
                 "--batch_size", "10", "--train_epochs", "1", "--threads", "1", "--topk", "3",
                 "--embedding_optimizer", opt, "--checkpoint_dir", ck,
                 "--checkpoint_every_steps", "1", "--keep_checkpoints", "1"])
            (step,) = os.listdir(ck)
            d = os.path.join(ck, step)
            manifest = read(os.path.join(d, "manifest.json"))
            names = [f["name"] for f in json.loads(manifest)["files"]]
            bundle = SEP_FILE.join([manifest] + [read(os.path.join(d, n)) for n in names])
            c.add("checkpoint", opt, b"\x00" + bundle)
            c.add("checkpoint", opt + "-in-dir", b"\x04" + bundle)
            c.add("trained_model", opt, b"\x00" + bundle)
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
