#!/usr/bin/env bash
# The test command again and again on a fresh clone, recorded: a suite that fails at
# random shows here, not on a newcomer's first day.
#   bash bench/repeat_ci.sh [--ci N] [--cluster M] [--out DIR]
# Clones this checkout's HEAD into a fresh directory, runs `bash .ci/run` (CI=true, as CI
# does) N times in a row there (default 3), then the Slurm and cluster tests (the
# one-node Slurm preemption test tests/slurm/test_preempt.sh, then every test across
# simulated hosts, tests/cluster/run_all.sh, on that clone's build) M times in a row
# (default 5), and
# writes DIR (default build/repeat_ci_<date>_<commit>/, untracked: a CI run is a check, not a
# benchmark record, so it does not go to bench/results/): runs.tsv (kind, round,
# start, seconds, exit code), summary.md, and each run's log. Exit code 0 only when every
# run passed. Needs what the runs need (root for the cluster and Slurm tests).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ci=3 cluster=5 out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --ci) ci=$2; shift 2 ;;
    --cluster) cluster=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "repeat_ci: unknown argument '$1' (--ci N, --cluster M, --out DIR)" >&2; exit 2 ;;
  esac
done
[[ "$ci" =~ ^[0-9]+$ && "$cluster" =~ ^[0-9]+$ ]] ||
  { echo "repeat_ci: --ci and --cluster take counts, got '$ci' and '$cluster'" >&2; exit 2; }
commit=$(git -C "$root" rev-parse --short HEAD)
[ -z "$(git -C "$root" status --porcelain --untracked-files=no)" ] ||
  echo "repeat_ci: note: the checkout has uncommitted changes; the clone runs $commit without them" >&2
out=${out:-$root/build/repeat_ci_$(date -u +%F)_$commit}
mkdir -p "$out"
clone=$(mktemp -d /var/tmp/ncf-repeat-XXXXXX)
trap 'rm -rf "$clone"' EXIT
git clone -q --no-local "$root" "$clone/src"
git -C "$clone/src" checkout -q "$commit"

printf 'kind\tround\tstart_utc\tseconds\texit\n' >"$out/runs.tsv"
failed=0
run_one() {  # KIND ROUND CMD...
  local kind=$1 round=$2 t0 rc=0 start
  shift 2
  start=$(date -u +%FT%TZ)
  t0=$SECONDS
  (cd "$clone/src" && "$@") >"$out/$kind-$round.log" 2>&1 || rc=$?
  printf '%s\t%s\t%s\t%s\t%s\n' "$kind" "$round" "$start" "$((SECONDS - t0))" "$rc" >>"$out/runs.tsv"
  echo "repeat_ci: $kind $round: exit $rc in $((SECONDS - t0)) s"
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
}
for i in $(seq "$ci"); do run_one ci "$i" env CI=true bash .ci/run; done
[ "$cluster" -eq 0 ] || [ "$ci" -gt 0 ] || (cd "$clone/src" && bash scripts/build.sh)
for i in $(seq "$cluster"); do
  run_one cluster "$i" bash -c 'bash tests/slurm/test_preempt.sh build && bash tests/cluster/run_all.sh build'
done

{
  echo "# .ci/run and the cluster tests, repeated on a fresh clone"
  echo
  echo "- commit: $commit ($(git -C "$root" log -1 --format=%s "$commit" | cut -c1-100))"
  echo "- machine: $(nproc) cores, $(free -g | awk '/^Mem:/{print $2}') GiB, $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "- command: bash bench/repeat_ci.sh --ci $ci --cluster $cluster"
  echo "- failed runs: $failed of $((ci + cluster))"
  echo
  echo "| kind | round | start (UTC) | seconds | exit |"
  echo "| --- | --- | --- | --- | --- |"
  tail -n +2 "$out/runs.tsv" | awk -F'\t' '{printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5}'
  echo
  echo "Per run (the test summary lines of each log):"
  echo
  for f in "$out"/ci-*.log "$out"/cluster-*.log; do
    [ -f "$f" ] || continue
    echo "- $(basename "$f"):"
    grep -E "tests passed|tests failed|^cluster: (passed|FAILED|skipped)|^cluster: [0-9]+ test|^test_preempt: |fuzz_replay: " "$f" |
      sed 's/^/    /' | head -20
  done
} >"$out/summary.md"
echo "repeat_ci: $failed failed run(s); record in $out"
[ "$failed" -eq 0 ]
