#!/usr/bin/env bash
# Runs the fuzz targets (fuzz/README.md) for a time or a number of executions
# each, up to nproc of them at once, and records the run:
#
#   bash bench/fuzz.sh --time 600                    # every target, 10 minutes each
#   bash bench/fuzz.sh --runs 1000000 csv tfmg       # these two, 10^6 inputs each
#   bash bench/fuzz.sh --time 60 --jobs 1 --out DIR metadata
#   bash bench/fuzz.sh --record-only --out DIR       # the record of a finished run
#
# Builds build-fuzz/ first (scripts/fuzz_build.sh: installs clang and the
# sanitizer runtimes when missing). Each target starts from its seeds
# (fuzz/corpus/<t>) and its findings' reproducers (fuzz/regressions/<t>); what
# it learns goes to build-fuzz/work/<run>/corpus/<t> (not kept in the
# repository). The record, bench/results/fuzz_<date>_<commit>/ unless --out:
#   summary.md   command, machine, commit, and per target: executions,
#                executions/s, corpus entries, coverage (edges, features),
#                peak RSS, wall seconds, findings
#   logs/<t>.log the last 200 lines of each target's libFuzzer log
#   findings/<t>/ what it found (crash-, leak-, timeout-, oom- inputs)
# --record-only writes the record again from the run's working files
# (build-fuzz/work/<run>/: each target's log, wall time and artifacts, and in
# its file run the commit, command and limit it started with), for a run whose
# targets ran in parts.
# Exits non-zero when any target found something.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${NCF_FUZZ_BUILD_DIR:-$root/build-fuzz}"
targets_all=(metadata records dataset positives id_maps movielens ncf_paper csv csv_timestamp
  tfmg checkpoint trained_model recommend_lists)

limit=(-max_total_time=60)
jobs="$(nproc)"
out=""
record_only=0
targets=()
command_line="bash bench/fuzz.sh $*"
while [ $# -gt 0 ]; do
  case "$1" in
    --time) limit=(-max_total_time="$2"); shift 2 ;;
    --runs) limit=(-runs="$2"); shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --record-only) record_only=1; shift ;;
    -h | --help) sed -n '2,24p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -eq 0 ] && targets=("${targets_all[@]}")
for t in "${targets[@]}"; do
  [ -f "$root/fuzz/fuzz_$t.cc" ] || { echo "fuzz.sh: no target $t (fuzz/fuzz_$t.cc)" >&2; exit 2; }
done

[ "$record_only" -eq 1 ] || bash "$root/scripts/fuzz_build.sh"
# Stack traces for undefined behaviour too (ASan prints its own).
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
commit="$(git -C "$root" rev-parse --short HEAD)"
dirty="$(git -C "$root" status --short -- src fuzz | wc -l)"
stamp="$(date -u +%Y-%m-%d)"
[ -n "$out" ] || out="$root/bench/results/fuzz_${stamp}_${commit}"
work="$build/work/$(basename "$out")"
if [ "$record_only" -eq 1 ]; then
  [ -f "$work/run" ] || { echo "fuzz.sh: no run to record in $work (no $work/run)" >&2; exit 2; }
  { read -r commit dirty; read -r jobs; read -r -a limit; read -r command_line; } <"$work/run"
  for t in "${targets[@]}"; do
    [ -f "$work/$t.wall" ] || { echo "fuzz.sh: $t has not finished in $work (no $t.wall)" >&2; exit 2; }
  done
fi
mkdir -p "$out/logs" "$out/findings" "$work"

# One target: its own working corpus, seeds and regressions read as extra
# corpus directories (libFuzzer adds new inputs to the first directory only).
run_one() {
  local t="$1" corpus="$work/corpus/$1" art="$work/artifacts/$1/" log="$work/$1.log"
  mkdir -p "$corpus" "$art"
  local dirs=("$corpus" "$root/fuzz/corpus/$t")
  [ -d "$root/fuzz/regressions/$t" ] && dirs+=("$root/fuzz/regressions/$t")
  local t0=$SECONDS rc=0
  "$build/fuzz_$t" "${limit[@]}" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$art" "${dirs[@]}" >"$log" 2>&1 || rc=$?
  echo "$((SECONDS - t0)) $rc" >"$work/$t.wall"
}

if [ "$record_only" -eq 0 ]; then
  printf '%s %s\n%s\n%s\n%s\n' "$commit" "$dirty" "$jobs" "${limit[*]}" "$command_line" >"$work/run"
  echo "fuzz.sh: ${targets[*]}: ${limit[*]}, $jobs at a time; record in $out" >&2
  running=0
  for t in "${targets[@]}"; do
    if [ "$running" -ge "$jobs" ]; then
      wait -n || true
      running=$((running - 1))
    fi
    run_one "$t" &
    running=$((running + 1))
  done
  wait || true
fi

# The record.
found=0
{
  echo "# Fuzz run $(basename "$out")"
  echo
  echo "- command: \`$command_line\` (each target: \`build-fuzz/fuzz_<t> ${limit[*]}" \
    "-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 <corpus> fuzz/corpus/<t>" \
    "fuzz/regressions/<t>\`), $jobs at a time"
  echo "- commit: $commit ($dirty files under src/ and fuzz/ differ from it)"
  echo "- machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores," \
    "$(free -g | awk '/^Mem:/{print $2}') GiB memory$(
      [ "$record_only" -eq 1 ] || echo "; load at the end $(cut -d' ' -f1-3 /proc/loadavg)")"
  echo "- compiler: $(clang++ --version | head -1); -O1, -fsanitize=fuzzer,address,undefined," \
    "-fno-sanitize-recover=undefined"
  echo "- date: $(date -u +%FT%TZ)"
  echo
  echo "| target | executions | exec/s | corpus | coverage (edges) | features | peak RSS MB | wall s | findings |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
  for t in "${targets[@]}"; do
    log="$work/$t.log"
    execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
    rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)"
    rss="$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)"
    last="$({ grep -E '^#[0-9]+' "$log" || true; } | tail -1)"
    cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")"
    ft="$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")"
    corp="$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<<"$last")"
    read -r wall rc <"$work/$t.wall"
    mapfile -t arts < <(find "$work/artifacts/$t" -type f | sort)
    what="none"
    if [ ${#arts[@]} -gt 0 ] || [ "$rc" -ne 0 ]; then
      found=1
      mkdir -p "$out/findings/$t"
      [ ${#arts[@]} -gt 0 ] && cp "${arts[@]}" "$out/findings/$t/"
      what="exit $rc: $(for a in "${arts[@]}"; do basename "$a"; done | tr '\n' ' ')"
    fi
    echo "| $t | ${execs:-?} | ${rate:-?} | ${corp:-?} | ${cov:-?} | ${ft:-?} | ${rss:-?} | $wall | $what |"
    tail -n 200 "$log" >"$out/logs/$t.log"
  done
} >"$out/summary.md"
cat "$out/summary.md"
exit "$found"
