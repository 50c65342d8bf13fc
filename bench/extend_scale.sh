#!/usr/bin/env bash
# ncf_prep --extend at scale: a CSV log of --users users (string ids, 2 to 4
# interactions each over 30 days, --items items with a skewed popularity),
# then a day that brings --new_users new users (2 to 4 interactions each) and
# --returning rows of known users. Records, with GNU time, the wall time and
# peak memory of
#   day 1:   a fresh prep of the first 30 days (the parent),
#   extend:  ncf_prep --extend of the new day,
#   whole:   a fresh prep of the whole log (what a day costs without --extend),
# each after the same log was written by mawk (deterministic for a seed).
#
#   bench/extend_scale.sh [--users N] [--new_users N] [--returning N] [--items N] [--out DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
die() { echo "extend_scale.sh: $*" >&2; exit 1; }
users=10000000 new_users=1000000 returning=2000000 items=100000 out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --users) users="$2"; shift 2 ;;
    --new_users) new_users="$2"; shift 2 ;;
    --returning) returning="$2"; shift 2 ;;
    --items) items="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
bench_positive_ints users new_users returning items
bench_programs "${NCF_BUILD_DIR:-$root/build}"
commit=$(bench_commit "$root")
[ -n "$out" ] || out="$root/bench/results/extend_scale_$(date -u +%F)_$commit"
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
csv=(--format csv --columns "user=user,item=item,timestamp=ts" --eval_negatives 99)

# Day 1 .. 30 of the known users, then day 31: new users and returning ones.
mawk -v U="$users" -v I="$items" 'BEGIN { srand(1); print "user,item,ts"
  for (u = 0; u < U; u++) { k = 2 + int(rand() * 3)
    for (j = 0; j < k; j++) { r = rand(); printf "u%09d,i%07d,%d\n", u, int(I * r * r), int(rand() * 2592000) } } }' \
  >"$work/days-1-30.csv"
mawk -v U="$users" -v N="$new_users" -v R="$returning" -v I="$items" 'BEGIN { srand(2); print "user,item,ts"
  for (u = U; u < U + N; u++) { k = 2 + int(rand() * 3)
    for (j = 0; j < k; j++) { r = rand(); printf "u%09d,i%07d,%d\n", u, int(I * r * r), 2592000 + int(rand() * 86400) } }
  for (j = 0; j < R; j++) { r = rand(); printf "u%09d,i%07d,%d\n", int(rand() * U), int(I * r * r), 2592000 + int(rand() * 86400) } }' \
  >"$work/day-31.csv"
{ cat "$work/days-1-30.csv"; tail -n +2 "$work/day-31.csv"; } >"$work/days-1-31.csv"

measure() {  # NAME, then the command
  local name=$1; shift
  {
    echo "\$ $*"
    /usr/bin/time -f "$name %e s %M KiB" -o "$work/$name.time" "$@" 2>&1
    cat "$work/$name.time"
  } >>"$out/log.txt"
}
: >"$out/log.txt"
measure day1 "$prep" --input "$work/days-1-30.csv" "${csv[@]}" --output "$work/day1"
measure extend "$prep" --input "$work/day-31.csv" "${csv[@]}" --extend "$work/day1" \
  --output "$work/day31"
measure whole "$prep" --input "$work/days-1-31.csv" "${csv[@]}" --output "$work/whole"
row() {  # NAME LABEL FILE
  read -r _ s _ kib _ <"$work/$1.time"
  printf '%-44s %8.1f s %8.0f MiB   %s: %s rows\n' "$2" "$s" "$((kib / 1024))" "$3" \
    "$(($(wc -l <"$work/$3") - 1))"
}
{
  echo "# ncf_prep --extend at scale, $(date -u +%FT%TZ), commit $commit"
  echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "command: bench/extend_scale.sh --users $users --new_users $new_users --returning $returning --items $items"
  row day1 "fresh prep of days 1-30 (the parent)" days-1-30.csv
  row extend "ncf_prep --extend day1 with day 31" day-31.csv
  row whole "fresh prep of days 1-31 (the whole log)" days-1-31.csv
  grep -E '^  (users|items): ' "$out/log.txt" | sed 's/^ */extend: /'
} | tee "$out/summary.txt"
