"""Recomputes NeuMF scores from ncf_export's NumPy files and compares them.

    python3 check_npy.py NPY_DIR SCORES.csv [PAIRS]

SCORES.csv: 'user,item,score' lines (ncf_recommend --pairs); the first PAIRS
pairs (default all) are recomputed with NumPy from the manifest's layout and
must match within 1e-5. Exits non-zero with the first mismatch.
"""
import csv
import json
import sys

import numpy as np


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
    rows = list(csv.reader(open(scores_path)))[1:]
    if limit is not None:
        rows = rows[:limit]
    u = np.array([int(r[0]) for r in rows])
    i = np.array([int(r[1]) for r in rows])
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
