#!/usr/bin/env python3
"""A synthetic interaction log with string ids and a time column, cut into days.

Writes OUT/day-1.csv .. OUT/day-D.csv (header user,item,ts; ts in seconds),
the rows of each day in time order, and OUT/days-1-D.csv with all of them.
Users have a taste (one of 16 groups of items, drawn from most of the time)
and items a popularity, so a model has something to learn; a share of the
users and items first appear on later days, as in a real growing log. The
same arguments give the same files.

  scripts/make_log.py --users 3000 --items 600 --rows 60000 --days 2 --out logs
"""
import argparse
import os
import random


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, required=True)
    ap.add_argument("--items", type=int, required=True)
    ap.add_argument("--rows", type=int, required=True)
    ap.add_argument("--days", type=int, default=2)
    ap.add_argument("--last_day_share", type=float, default=0.2,
                    help="share of the rows in the last day (the rest spread evenly)")
    ap.add_argument("--new_share", type=float, default=0.1,
                    help="share of users and items that first appear after day 1")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.users < 1 or a.items < 17 or a.rows < 1 or a.days < 1:
        ap.error("need --users >= 1, --items >= 17, --rows >= 1, --days >= 1")
    if not 0 < a.last_day_share < 1 or not 0 <= a.new_share < 1:
        ap.error("--last_day_share in (0, 1), --new_share in [0, 1)")
    rng = random.Random(a.seed)
    os.makedirs(a.out, exist_ok=True)

    # Day boundaries in seconds: the last day holds last_day_share of the rows.
    day = 86400
    shares = [1.0] if a.days == 1 else \
        [(1 - a.last_day_share) / (a.days - 1)] * (a.days - 1) + [a.last_day_share]
    groups = 16
    item_group = [i % groups for i in range(a.items)]
    by_group = [[i for i in range(a.items) if item_group[i] == g] for g in range(groups)]
    popularity = [1.0 / (1 + r) ** 0.8 for r in range(a.items)]
    rng.shuffle(popularity)
    # The first day on which each user and item may appear.
    user_start = [0 if a.days == 1 or rng.random() >= a.new_share else rng.randrange(1, a.days)
                  for _ in range(a.users)]
    item_start = [0 if a.days == 1 or rng.random() >= a.new_share else rng.randrange(1, a.days)
                  for _ in range(a.items)]
    taste = [rng.randrange(groups) for _ in range(a.users)]
    activity = [rng.paretovariate(1.5) for _ in range(a.users)]

    rows = []
    for d, share in enumerate(shares):
        n = int(round(a.rows * share))
        users = [u for u in range(a.users) if user_start[u] <= d]
        items = [i for i in range(a.items) if item_start[i] <= d]
        if not users or not items:
            continue
        weights = [activity[u] for u in users]
        pop = [popularity[i] for i in items]
        open_by_group = [[i for i in g if item_start[i] <= d] for g in by_group]
        picks = rng.choices(users, weights=weights, k=n)
        popular = rng.choices(items, weights=pop, k=n)
        for k, u in enumerate(picks):
            cands = open_by_group[taste[u]]
            item = rng.choice(cands) if cands and rng.random() < 0.8 else popular[k]
            rows.append((d * day + rng.randrange(day), "u%07d" % u, "sku-%05d" % item))
    rows.sort()
    for d in range(a.days):
        with open(os.path.join(a.out, "day-%d.csv" % (d + 1)), "w") as f:
            f.write("user,item,ts\n")
            for t, u, i in rows:
                if d * day <= t < (d + 1) * day:
                    f.write("%s,%s,%d\n" % (u, i, t))
    with open(os.path.join(a.out, "days-1-%d.csv" % a.days), "w") as f:
        f.write("user,item,ts\n")
        for t, u, i in rows:
            f.write("%s,%s,%d\n" % (u, i, t))


if __name__ == "__main__":
    main()
