"""Recomputes NeuMF scores from ncf_export's NumPy files and compares them.

    python3 check_npy.py NPY_DIR SCORES.csv [PAIRS]

SCORES.csv: 'user,item,score' lines (ncf_recommend --pairs); the first PAIRS
pairs (default all) are recomputed with NumPy from the manifest's layout and
must match within 1e-5. The ids are the dataset's: with user_ids.npy /
item_ids.npy (int64, or bytes for string ids) or NAME_offsets.npy +
NAME_bytes.npy in NPY_DIR they are mapped to rows through them, else they are
the rows. Exits non-zero with the first mismatch.
"""
import csv
import json
import os
import sys

import numpy as np


_ROWS = {}


def row_of(npy, what, text):
    """The table row of an id as ncf_recommend wrote it."""
    if what not in _ROWS:
        ids = None
        if os.path.exists(f"{npy}/{what}_ids.npy"):
            ids = np.load(f"{npy}/{what}_ids.npy")
            ids = [x.item() if ids.dtype.kind != "S" else bytes(x) for x in ids]
        elif os.path.exists(f"{npy}/{what}_ids_offsets.npy"):
            off = np.load(f"{npy}/{what}_ids_offsets.npy")
            data = np.load(f"{npy}/{what}_ids_bytes.npy").tobytes()
            ids = [data[off[k]:off[k + 1]] for k in range(len(off) - 1)]
        _ROWS[what] = None if ids is None else {x: k for k, x in enumerate(ids)}
    table = _ROWS[what]
    if table is None:
        return int(text)
    key = text.encode("utf-8", "surrogateescape")
    if key not in table:
        key = int(text)
    return table[key]


def main():
    npy, scores_path = sys.argv[1], sys.argv[2]
    limit = int(sys.argv[3]) if len(sys.argv) > 3 else None
    man = json.load(open(f"{npy}/manifest.json"))
    mf, layers = man["mf_dim"], man["layers"]
    users = np.load(f"{npy}/user_embeddings.npy")
    items = np.load(f"{npy}/item_embeddings.npy")
    assert users.shape == (man["num_users"], man["embedding_width"]), users.shape
    assert items.dtype == np.float32
    tower = [(np.load(f"{npy}/mlp_{l}_weight.npy"), np.load(f"{npy}/mlp_{l}_bias.npy"))
             for l in range(len(layers) - 1)]
    w, c = np.load(f"{npy}/head_weight.npy"), np.load(f"{npy}/head_bias.npy")
    # Ids as bytes, exactly as written (any bytes may be in a string id).
    with open(scores_path, newline="", encoding="utf-8", errors="surrogateescape") as f:
        rows = list(csv.reader(f))[1:]
    if limit is not None:
        rows = rows[:limit]
    u = np.array([row_of(npy, "user", r[0]) for r in rows])
    i = np.array([row_of(npy, "item", r[1]) for r in rows])
    want = np.array([float(r[2]) for r in rows])
    pu, pi = users[u].astype(np.float64), items[i].astype(np.float64)
    gmf = pu[:, :mf] * pi[:, :mf]
    x = np.concatenate([pu[:, mf:], pi[:, mf:]], axis=1)
    for W, b in tower:
        x = np.maximum(x @ W.T.astype(np.float64) + b, 0.0)
    logit = np.concatenate([gmf, x], axis=1) @ w.astype(np.float64) + c[0]
    got = 1.0 / (1.0 + np.exp(-logit))
    err = np.abs(got - want)
    k = int(np.argmax(err))
    print(f"check_npy: {len(rows)} pairs, max |score difference| {err.max():.3g}")
    if err.max() > 1e-5:
        print(f"check_npy: pair {k} (user {u[k]}, item {i[k]}): numpy {got[k]:.9g}, "
              f"ncf_recommend {want[k]:.9g}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
