#!/usr/bin/env bash
# One binary with and without a switch (an environment variable or flags), side by side in one run: ncf_dist
# on CPU ranks at the ml-20m-mlperf preset, for each precision and batch, alternating
# the two settings (default first) so that a drift of the machine hits both alike.
#   bash bench/env_switch_speed.sh                       # --layer0_by_item on (layer 0 by item)
#   SWITCH_ENV=NCF_VECTOR_ISA=baseline bash bench/env_switch_speed.sh
# Per (precision, batch, setting) one run of SWITCH_SAMPLES training samples (as
# --max_steps = samples / batch) and an evaluation of SWITCH_EVAL_USERS users; the figure is
# its epoch line's samples/s, and its HR@10 shows the quality alike.
# Results: bench/results/env_switch_<name>_<date>_<commit>[+local]/: info.txt (machine, commit,
# commands), log.txt (every run's output), runs/*.jsonl (--metrics_json), summary.md.
# Env:
#   NCF_BUILD_DIR        the build whose src/ncf_dist and src/ncf_prep run (default build)
#   NCF_BENCH_DATA       where the synthetic ml-20m lives (default /tmp: bench-ml-20m, made
#                        when missing, shared with bench/tower_speed.sh)
#   SWITCH_ENV           NAME=VALUE: the switch is this environment variable, or
#   SWITCH_FLAGS         the switch is these ncf_dist flags (default "--layer0_by_item on"
#                        where SWITCH_ENV is not given)
#   SWITCH_PRECISIONS    default "fp32 bf16"
#   SWITCH_BATCHES       default "65536 1048576"
#   SWITCH_SAMPLES       training samples per run (default 4194304)
#   SWITCH_EVAL_USERS    eval users per run (default 20000; 0: no evaluation)
#   SWITCH_REPEATS       runs per setting (default 1; the summary takes the median)
#   SWITCH_THREADS       threads per run (default: nproc)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
die() { echo "env_switch_speed: $*" >&2; exit 1; }
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"
build="${NCF_BUILD_DIR:-$root/build}"
bench_programs "$build"
bin="$(cd "$build/src" && pwd)"
data="${NCF_BENCH_DATA:-/tmp}/bench-ml-20m"
switch_env="${SWITCH_ENV:-}"
switch_flags="${SWITCH_FLAGS:-}"
[ -z "$switch_env" ] || [ -z "$switch_flags" ] || die "SWITCH_ENV and SWITCH_FLAGS both given: one switch a run"
[ -n "$switch_env" ] || [ -n "$switch_flags" ] || switch_flags="--layer0_by_item on"
switch="${switch_env:-$switch_flags}"
precisions="${SWITCH_PRECISIONS:-fp32 bf16}"
batches="${SWITCH_BATCHES:-65536 1048576}"
samples="${SWITCH_SAMPLES:-4194304}"
eval_users="${SWITCH_EVAL_USERS:-20000}"
repeats="${SWITCH_REPEATS:-1}"
threads="${SWITCH_THREADS:-$(nproc)}"
bench_positive_ints samples repeats threads
[ -z "$switch_env" ] || [[ "$switch_env" =~ ^[A-Z_][A-Z0-9_]*=[^[:space:]]*$ ]] ||
  die "SWITCH_ENV='$switch_env' is not NAME=VALUE"
[ -z "$switch_flags" ] || [[ "$switch_flags" =~ ^--[a-z] ]] ||
  die "SWITCH_FLAGS='$switch_flags' does not start with a flag (--name)"
tag="$(bench_commit "$root")"
if [ -n "$switch_env" ]; then
  name="$(echo "${switch_env%%=*}" | tr '[:upper:]' '[:lower:]')"
else
  name="$(echo "$switch_flags" | sed 's/^--//; s/[^A-Za-z0-9]\{1,\}/_/g; s/_$//')"
fi
out="$root/bench/results/env_switch_${name}_$(date -u +%F)_$tag"
mkdir -p "$out/runs"
if [ ! -s "$data/metadata.json" ]; then
  "$bin/ncf_prep" --synthetic ml-20m --output "$data" --progress off >"$out/prep.log" 2>&1
fi
{
  echo "# env_switch_speed: ncf_dist with and without $switch, on CPU ranks"
  echo "date: $(date -u +%FT%TZ)  commit: $tag"
  echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/^Mem:/{print $2}') GiB"
  echo "cpu flags: $(grep -o -w 'amx_bf16\|avx512_bf16\|avx512f' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "binaries: $bin (ncf_dist built $(date -u -r "$bin/ncf_dist" +%FT%TZ))"
  echo "data: $data; samples per run $samples; eval users $eval_users; threads $threads; repeats $repeats"
  echo "commands:"
} >"$out/info.txt"
: >"$out/log.txt"
for p in $precisions; do
  for b in $batches; do
    steps=$((samples / b))
    [ "$steps" -ge 1 ] || steps=1
    for r in $(seq 1 "$repeats"); do
      for setting in default switch; do
        json="$out/runs/$p.b$b.$setting.$r.jsonl"
        cmd=("$bin/ncf_dist" --data_dir "$data" --preset ml-20m-mlperf --device cpu
          --threads "$threads" --batch_size "$b" --max_steps "$steps" --train_epochs 1
          --precision "$p" --hr_threshold -1 --progress off --metrics_json "$json")
        if [ "$eval_users" -gt 0 ]; then cmd+=(--eval_users "$eval_users"); else cmd+=(--no_eval); fi
        envs=()
        if [ "$setting" = switch ]; then
          [ -n "$switch_env" ] && envs=("$switch_env")
          # shellcheck disable=SC2206  # the flags as words
          [ -n "$switch_flags" ] && cmd+=($switch_flags)
        fi
        echo "  ${envs[*]:+${envs[*]} }${cmd[*]}" >>"$out/info.txt"
        {
          echo "\$ ${envs[*]:+${envs[*]} }${cmd[*]}"
          env "${envs[@]}" "${cmd[@]}" 2>&1 || echo "# FAILED: exit $?"
        } >>"$out/log.txt"
      done
    done
  done
done
python3 - "$out" "$switch" "$precisions" "$batches" "$repeats" <<'EOF'
import json, statistics, sys
out, switch, precisions, batches, repeats = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split(), int(sys.argv[5])
def runs(p, b, s):
    got = []
    for r in range(1, repeats + 1):
        try:
            lines = [json.loads(l) for l in open(f"{out}/runs/{p}.b{b}.{s}.{r}.jsonl") if l.strip()]
            got.append(lines[-1])
        except (OSError, IndexError, ValueError):
            pass
    return got
rows = ["| precision | batch | default samples/s | %s samples/s | default / %s | HR@10 default | HR@10 %s |" % (switch, switch, switch),
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
for p in precisions:
    for b in batches:
        d, s = runs(p, b, "default"), runs(p, b, "switch")
        if not d or not s:
            rows.append(f"| {p} | {b} | missing | missing | | | |")
            continue
        sd = statistics.median(x["samples_per_second"] for x in d)
        ss = statistics.median(x["samples_per_second"] for x in s)
        hr = lambda x: f"{x['hr']:.4f}" if x.get("k") and x.get("eval_seconds", 0) > 0 else "n/a (no evaluation)"
        rows.append(f"| {p} | {int(b):,} | {sd:,.0f} | {ss:,.0f} | {sd / ss:.2f}x | {hr(d[-1])} | {hr(s[-1])} |")
open(f"{out}/summary.md", "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
EOF
echo "env_switch_speed: results in $out"
