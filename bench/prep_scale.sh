#!/usr/bin/env bash
# ncf_prep --format csv at scale: a 10^8-row interaction log with string ids
# (~10^7 users as 16-hex-character hashes, ~10^6 SKU items, ISO 8601
# timestamps, ratings), generated once by gen_interactions and cached, then
# prepared under /usr/bin/time -v. Records wall time, peak RSS, rows/s, the
# per-stage lines of --progress on, the machine, its load, the commit and the
# command in bench/results/prep_csv_<rows>_<date>_<commit>/ (README.md and the
# raw outputs). The dataset written is removed afterwards; the input stays
# cached for the next run (CLEAN=1 removes it too).
#
#   bash bench/prep_scale.sh                       # 10^8 rows, --eval_negatives 99
#   E=999 bash bench/prep_scale.sh                 # the MLPerf protocol (~40 GB of eval shards)
#   ROWS=10000000 USERS=1000000 ITEMS=100000 bash bench/prep_scale.sh
#
# Environment: BUILD (default build), WORK (default /var/tmp/ncf_prep_scale: bulky
# data, never in the repository), ROWS, USERS, ITEMS, TIMESTAMPS (iso|int|mixed),
# E (eval negatives), THREADS (0: all cores), EXTRA (more ncf_prep flags), CLEAN,
# INPUT (an existing file of the same shape instead, e.g. the .gz of the cached one).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD:-$root/build}"
work="${WORK:-/var/tmp/ncf_prep_scale}"
rows="${ROWS:-100000000}"
users="${USERS:-10000000}"
items="${ITEMS:-1000000}"
timestamps="${TIMESTAMPS:-iso}"
E="${E:-99}"
threads="${THREADS:-0}"
extra="${EXTRA:-}"

[ -x "$build/src/ncf_prep" ] || { echo "prep_scale: no $build/src/ncf_prep (build first)" >&2; exit 1; }
[ -x "$build/bench/gen_interactions" ] || cmake --build "$build" --target gen_interactions >/dev/null
mkdir -p "$work"
input="${INPUT:-$work/interactions_${rows}_${users}_${items}_${timestamps}.csv}"
if [ ! -s "$input" ]; then
  echo "prep_scale: generating $input" >&2
  "$build/bench/gen_interactions" --rows "$rows" --users "$users" --items "$items" \
    --timestamps "$timestamps" --seed 1 --output "$input"
fi

commit="$(git -C "$root" rev-parse --short HEAD)"
git -C "$root" diff --quiet HEAD -- src bench 2>/dev/null || commit="${commit}+wt"
date="$(date -u +%Y-%m-%d)"
label="$(python3 -c "import sys; n=int(sys.argv[1]); e=len(str(n))-1; print(f'1e{e}' if n==10**e else str(n))" "$rows")"
out="$root/bench/results/prep_csv_${label}_${date}_${commit}"
run="E${E}_threads${threads}$([[ "$input" == *.gz ]] && echo _gz)_$(date -u +%H%M%S)"
mkdir -p "$out"
data="$work/dataset"
rm -rf "$data"

cmd=("$build/src/ncf_prep" --input "$input" --format csv
     --columns user=user_id,item=item_id,timestamp=timestamp,rating=rating
     --eval_negatives "$E" --threads "$threads" --output "$data" --progress on)
# shellcheck disable=SC2206
[ -n "$extra" ] && cmd+=($extra)

load_before="$(uptime)"
echo "prep_scale: ${cmd[*]}" >&2
/usr/bin/time -v "${cmd[@]}" >"$out/$run.out" 2>"$out/$run.err" ||
  echo "prep_scale: ncf_prep failed (see $out/$run.err)" >&2
load_after="$(uptime)"
du_data="$(du -sh "$data" 2>/dev/null | cut -f1)"
rm -rf "$data"
[ "${CLEAN:-0}" = 1 ] && rm -f "$input"

python3 - "$out" "$run" "$rows" "$E" "$input" "$du_data" "$commit" "$load_before" \
  "$load_after" "${cmd[*]}" <<'EOF'
import json, os, re, subprocess, sys
out, run, rows, E, inp, du, commit, before, after, cmd = sys.argv[1:]
err = open(f"{out}/{run}.err").read()
def field(name):
    m = re.search(rf"{name}.*?: (.*)", err)
    return m.group(1).strip() if m else "?"
wall = field("Elapsed \\(wall clock\\) time")
parts = [float(p) for p in wall.split(":")]
secs = sum(p * 60 ** (len(parts) - 1 - k) for k, p in enumerate(parts))
lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
model = re.search(r"Model name:\s*(.*)", lscpu)
cpus = re.search(r"^CPU\(s\):\s*(.*)", lscpu, re.M)
mem = int(open("/proc/meminfo").read().split("\n")[0].split()[1])
rec = {"run": run, "rows": int(rows), "E": int(E), "wall_s": secs,
       "peak_rss_gib": int(field("Maximum resident set size")) / 1048576,
       "user_s": field("User time"), "sys_s": field("System time"),
       "cpu": field("Percent of CPU this job got"), "exit": field("Exit status"),
       "dataset": du, "input": inp, "input_gb": os.path.getsize(inp) / 1e9,
       "load_before": before.strip(), "load_after": after.strip(), "command": cmd,
       "machine": f"{model.group(1) if model else '?'}, {cpus.group(1) if cpus else '?'} CPUs, "
                  f"{mem / 1048576:.1f} GiB RAM",
       "stages": [l for l in err.splitlines() if l.startswith("prep: ") and "% users" not in l]}
with open(f"{out}/runs.jsonl", "a") as f:
    f.write(json.dumps(rec) + "\n")
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl")]
with open(f"{out}/README.md", "w") as f:
    f.write(f"# ncf_prep --format csv at scale ({commit})\n\n")
    f.write("Written by bench/prep_scale.sh; one row per run (runs.jsonl), raw output in RUN.err "
            "(--progress on and /usr/bin/time -v) and RUN.out.\n\n")
    f.write("| run | rows | E | wall | peak RSS | rows/s | dataset written | user / sys CPU | "
            "load before → after (1 min) | exit |\n")
    f.write("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |\n")
    load = lambda s: s.split("load average:")[-1].split(",")[0].strip()
    for r in runs:
        f.write(f"| {r['run']} | {r['rows']:,} | {r['E']} | {r['wall_s']:.1f} s | "
                f"{r['peak_rss_gib']:.2f} GiB | {r['rows'] / r['wall_s']:,.0f} | {r['dataset']} | "
                f"{r['user_s']} s / {r['sys_s']} s ({r['cpu']}) | {load(r['load_before'])} → "
                f"{load(r['load_after'])} | {r['exit']} |\n")
    for r in runs:
        f.write(f"\n## {r['run']}\n\n- machine: {r['machine']}\n"
                f"- input: `{r['input']}` ({r['input_gb']:.2f} GB, bench/gen_interactions.cc)\n"
                f"- load before: `{r['load_before']}`\n- load after: `{r['load_after']}`\n"
                f"- command: `{r['command']}`\n\nPer stage (`--progress on`):\n\n```\n"
                + "\n".join(r["stages"]) + "\n```\n")
    f.write(f"\ncommit {commit} (`+wt`: uncommitted changes in src/ or bench/ on top of it)\n")
print(open(f"{out}/README.md").read())
EOF
