#!/usr/bin/env bash
# Flat vs two-hop vs two-hop + node dedup on a simulated cluster: H hosts (network
# namespaces of this machine, tests/cluster/sim_cluster.sh) whose links tc shapes to a
# RATE, R ranks per host, the ml-20m shape with --preset ml-20m-mlperf at a per-rank
# batch where the exchange matters, a few steps per run. Every run records rank 0's step
# time, exchange time and the inter- and intra-node messages and bytes per step (from
# --metrics_json), the exchange ncf_dist chose and the C++ model's predictions from its
# startup line; bench/summarize_cluster.py adds launch/comm_model.py's prediction for the
# same shape and link and writes OUT/cluster_scaling.{md,json,png}.
#
#   sudo bash bench/cluster_scaling.sh [options]
#     --hosts 1,2,4            host counts H (one cluster of max(H) hosts per rate)
#     --ranks_per_host 1,2     ranks per host R
#     --rates 100mbit,1gbit    tc tbf rates of every host's link (sim_cluster.sh --rate)
#     --modes flat,two_hop,node   the exchanges: --exchange flat --dedup on;
#                              --exchange two_hop --dedup on; --exchange two_hop --dedup node;
#                              auto: --exchange auto --dedup on (measured at start-up)
#     --dtypes fp32            --exchange_dtype of every run (fp32,bf16: each run twice)
#     --summary scaling        scaling: bench/summarize_cluster.py (flat, two_hop, node in
#                              fp32); choice: bench/summarize_exchange_choice.py (auto
#                              against the faster route, BF16 against FP32 payloads)
#     --per_rank_batch 16385   training samples per rank per step (whole positives)
#     --steps 5 --epochs 2     steps per epoch; the last epoch is reported
#     --out DIR                default bench/results/cluster_scaling_<date>_<commit>
#     --data DIR               the dataset (made once; default /var/tmp/ncf-bench/ml20m-shape)
#     --cluster_dir DIR        the cluster's shared directory (default /var/tmp/ncf-bench/cluster)
#     --topology KEYS          extra --topology keys for every run, besides the link's
#                              inter_gbps and nics_per_node=1 (default intra_gbps=4: this VM's
#                              shared-memory all-to-all, docs/comm_cost_model.md section 7)
#     --all_modes              also run two_hop and node where they fall back to flat
#                              (one host, or one rank per host)
#     --dry_run                print the runs only
#
# Not a test: timings on a shared 2-core machine move with its load, and H·R ranks share
# its cores. Runs on the harness of tests/cluster/lib.sh (cluster_start, cluster_mpirun_on:
# mpirun through launch/ncf_launch on node1). Needs root (exit 77 with the reason when no
# cluster can be built), Open MPI and a CPU build ($NCF_BUILD_DIR, else build/) of
# ncf_dist and ncf_prep with --exchange.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prog=cluster_scaling.sh
die() { echo "$prog: $*" >&2; exit 1; }

hosts_list=1,2,4
rph_list=1,2
rates=100mbit,1gbit
modes=flat,two_hop,node
dtypes=fp32
summary=scaling
per_rank_batch=16385
steps=5
epochs=2
# The commit the programs are built from (settings.txt lists every changed file).
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
commit=$(bench_commit "$root")
out="$root/bench/results/cluster_scaling_$(date -u +%F)_$commit"
data=/var/tmp/ncf-bench/ml20m-shape
cdir=/var/tmp/ncf-bench/cluster
topo_extra="intra_gbps=4"
all_modes=0
dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts_list="$2"; shift 2 ;;
    --ranks_per_host) rph_list="$2"; shift 2 ;;
    --rates) rates="$2"; shift 2 ;;
    --modes) modes="$2"; shift 2 ;;
    --dtypes) dtypes="$2"; shift 2 ;;
    --summary) summary="$2"; shift 2 ;;
    --per_rank_batch) per_rank_batch="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --cluster_dir) cdir="$2"; shift 2 ;;
    --topology) topo_extra="$2"; shift 2 ;;
    --all_modes) all_modes=1; shift ;;
    --dry_run) dry=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

list_ok() {  # name value pattern
  [[ "$2" =~ ^($3)(,($3))*$ ]] || die "$1 '$2' is not a comma-separated list of $3"
}
list_ok --hosts "$hosts_list" '[1-9][0-9]?'
list_ok --ranks_per_host "$rph_list" '[1-9]'
list_ok --rates "$rates" '[0-9]+[kmg]?bit'
list_ok --modes "$modes" 'flat|two_hop|node|auto'
list_ok --dtypes "$dtypes" 'fp32|bf16'
[[ "$summary" =~ ^(scaling|choice)$ ]] || die "--summary '$summary' is not scaling or choice"
if [ "$summary" = scaling ] && [[ ",$modes,$dtypes," =~ ,(auto|bf16), ]]; then
  die "--modes auto and --dtypes bf16 are summarized by --summary choice"
fi
if ! [[ "$per_rank_batch" =~ ^[1-9][0-9]*$ ]] || [ $((per_rank_batch % 5)) -ne 0 ]; then
  die "--per_rank_batch '$per_rank_batch' must be a positive multiple of 5 (1 + num_neg): whole positives per rank"
fi
bench_positive_ints steps epochs
# Absolute paths: the runs start from inside $out, on other hosts' views of the files.
out=$(realpath -m "$out")
data=$(realpath -m "$data")
cdir=$(realpath -m "$cdir")
for d in "$out" "$data" "$cdir"; do
  case "$(realpath -m "$d")" in /tmp|/tmp/*) die "$d is under /tmp, which every simulated host has its own of" ;; esac
done
IFS=, read -r -a HOSTS <<<"$hosts_list"
IFS=, read -r -a RPH <<<"$rph_list"
IFS=, read -r -a RATES <<<"$rates"
IFS=, read -r -a MODES <<<"$modes"
IFS=, read -r -a DTYPES <<<"$dtypes"
max_hosts=$(printf '%s\n' "${HOSTS[@]}" | sort -n | tail -1)

build="${NCF_BUILD_DIR:-$root/build}"
dist="$build/src/ncf_dist"
prep="$build/src/ncf_prep"
# The harness: cluster_check, cluster_start, cluster_mpirun_on, cluster_stop.
# shellcheck source=tests/cluster/lib.sh
source "$root/tests/cluster/lib.sh"

mode_flags() {  # mode -> ncf_dist flags
  case "$1" in
    flat) echo "--exchange flat --dedup on" ;;
    two_hop) echo "--exchange two_hop --dedup on" ;;
    node) echo "--exchange two_hop --dedup node" ;;
    auto) echo "--exchange auto --dedup on" ;;
  esac
}

rate_gbps() {  # 100mbit -> 0.1
  local r="$1" n u
  [[ "$r" =~ ^([0-9]+)([kmg]?)bit$ ]] || die "rate '$r'"
  n=${BASH_REMATCH[1]} u=${BASH_REMATCH[2]}
  case "$u" in
    k) awk -v n="$n" 'BEGIN{printf "%.9g", n / 1e6}' ;;
    m) awk -v n="$n" 'BEGIN{printf "%.9g", n / 1e3}' ;;
    g) echo "$n" ;;
    *) awk -v n="$n" 'BEGIN{printf "%.9g", n / 1e9}' ;;
  esac
}

# The runs: H x R x mode x dtype, each at every rate. Where two-hop is the flat route
# (one host, or one rank per host) only flat runs, unless --all_modes.
plan=()
for H in "${HOSTS[@]}"; do
  for R in "${RPH[@]}"; do
    for m in "${MODES[@]}"; do
      if [ "$m" != flat ] && [ "$all_modes" = 0 ] && { [ "$H" = 1 ] || [ "$R" = 1 ]; }; then
        continue
      fi
      for dt in "${DTYPES[@]}"; do plan+=("$H $R $m $dt"); done
    done
  done
done

if [ "$dry" = 1 ]; then
  for rate in "${RATES[@]}"; do
    for p in "${plan[@]}"; do
      read -r H R m dt <<<"$p"
      echo "$rate: $H hosts x $R ranks, $m: $(mode_flags "$m") --exchange_dtype $dt"
    done
  done
  exit 0
fi

why=$(cluster_check) || { echo "$prog: no cluster on this machine: $why" >&2; exit 77; }
if [ ! -x "$dist" ] || [ ! -x "$prep" ]; then
  die "no ncf_dist / ncf_prep in $build/src (build first: NCF_CUDA=OFF bash scripts/build.sh, or set NCF_BUILD_DIR)"
fi
help_text=$("$dist" --help 2>&1 || true)
grep -q -- '--exchange' <<<"$help_text" ||
  die "$dist has no --exchange flag: build a tree with the two-hop exchange"
command -v mpirun >/dev/null || die "mpirun is not installed (scripts/setup.sh)"

mkdir -p "$out/runs"
# The dataset: the ml-20m shape (138,493 users, 26,744 items) with fewer interactions
# (3M, enough for steps x epochs at any H x R here) and 1 eval negative, since runs
# skip evaluation; made once, on the shared file system.
if [ ! -f "$data/metadata.json" ]; then
  echo "$prog: making the ml-20m-shape dataset in $data" >&2
  mkdir -p "$(dirname "$data")"
  "$prep" --synthetic ml-20m --interactions 3000000 --eval_negatives 1 --output "$data" \
    --progress off >"$out/prep.log" 2>&1 || { cat "$out/prep.log" >&2; die "ncf_prep failed"; }
fi

manifest="$out/runs.tsv"
printf 'tag\thosts\tranks_per_host\trate\tinter_gbps\tmode\tper_rank_batch\tsteps\tepochs\texit\ttopology\tmetrics\tlog\texchange_dtype\n' >"$manifest"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $commit (ncf_dist, ncf_prep: $build)"
  echo "changed files: $(git -C "$root" status --porcelain --untracked-files=no | awk '{print $2}' | tr '\n' ' ')"
  echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/^Mem:/{print $2}') GiB"
  echo "data: $(realpath "$data")"
  echo "loadavg before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "settings: hosts $hosts_list, ranks/host $rph_list, rates $rates, modes $modes, dtypes $dtypes, per-rank batch $per_rank_batch, $steps steps x $epochs epochs, topology extra '$topo_extra'"
} >"$out/settings.txt"

export CLUSTER_DIR="$cdir"
for rate in "${RATES[@]}"; do
  echo "$prog: cluster of $max_hosts hosts at $rate" >&2
  # cluster_start also stops the cluster when this script exits, however it exits.
  cluster_start "$max_hosts" --rate "$rate" >"$out/cluster-$rate.log" 2>&1 ||
    { cat "$out/cluster-$rate.log" >&2; die "the cluster did not start"; }
  gbps=$(rate_gbps "$rate")
  topo="inter_gbps=$gbps,nics_per_node=1${topo_extra:+,$topo_extra}"
  for p in "${plan[@]}"; do
    read -r H R m dt <<<"$p"
    W=$((H * R))
    tag="$rate-h$H-r$R-$m"
    [ "$dt" = fp32 ] || tag="$tag-$dt"
    hostspec=$(for k in $(seq "$H"); do printf 'node%d:%d,' "$k" "$R"; done)
    hostspec=${hostspec%,}
    metrics="$out/runs/$tag.jsonl"
    log="$out/runs/$tag.log"
    rm -f "$metrics"
    # cluster_mpirun_on: mpirun on node1 reaching the other hosts through the rsh agent,
    # ranks host by host (rank = n·R + l, as the two-hop exchange needs), TCP between
    # hosts and shared memory within one. Paths outside /tmp are the same on every host.
    cmd=("$dist" --device cpu --data_dir "$data" --preset ml-20m-mlperf --batch_size $((W * per_rank_batch))
      --max_steps "$steps" --train_epochs "$epochs" --threads 1 --no_eval --progress off
      --step_log --metrics_json "$metrics" --topology "$topo")
    # shellcheck disable=SC2207
    cmd+=($(mode_flags "$m") --exchange_dtype "$dt")
    echo "$prog: $tag on $hostspec: ${cmd[*]}" >&2
    t0=$(date +%s)
    code=0
    (cd "$out" && cluster_mpirun_on "$hostspec" -- "${cmd[@]}") >"$log" 2>&1 || code=$?
    echo "# exit $code after $(( $(date +%s) - t0 )) s; loadavg $(cut -d' ' -f1-3 /proc/loadavg)" >>"$log"
    [ "$code" -eq 0 ] || echo "$prog: $tag failed (exit $code): see $log" >&2
    printf '%s\t%d\t%d\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\n' "$tag" "$H" "$R" "$rate" "$gbps" \
      "$m" "$per_rank_batch" "$steps" "$epochs" "$code" "$topo" "runs/$tag.jsonl" "runs/$tag.log" "$dt" >>"$manifest"
  done
  cluster_stop >/dev/null
done
echo "loadavg after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/settings.txt"

summ_py=python3
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null && summ_py=/usr/bin/python3
if [ "$summary" = choice ]; then
  python3 "$root/bench/summarize_exchange_choice.py" "$out"
else
  "$summ_py" "$root/bench/summarize_cluster.py" "$out"
fi
