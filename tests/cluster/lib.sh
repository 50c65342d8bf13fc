# shellcheck shell=bash
# Functions for tests that run ranks on several simulated hosts of this machine
# (tests/cluster/sim_cluster.sh). Source it from a bash test that runs under
# `set -euo pipefail`:
#
#   source "$root/tests/cluster/lib.sh"
#   cluster_start 3                       # node1..node3, 2 hosts if no count
#   out=$(cluster_mpirun 2 -- "$build/src/ncf_dist" --data_dir "$CLUSTER_SHARED/data" ...)
#
# cluster_check
#     Returns 0 when a cluster can be built here; otherwise prints the reason on stdout
#     and returns 77 (no root, no namespaces). A test then reports itself skipped.
# cluster_start H [--slurm] [--rate RATE]
#     Starts hosts node1..nodeH (sim_cluster.sh start) and stops them when the shell
#     exits (trap EXIT; define cluster_user_cleanup() for more cleanup, it runs first).
#     Sets CLUSTER_DIR (the cluster's directory, under /var/tmp unless CLUSTER_DIR was
#     set), CLUSTER_SHARED (an empty directory in it that every host sees: put data and
#     checkpoints there, never under /tmp, which each host has its own of),
#     CLUSTER_HOSTS (H), CLUSTER_SUBNET (10.213.ID.0/24) and, with --slurm, SLURM_CONF.
#     The hosts see the repository and $build (when the test set it) at their paths,
#     also when these are under /tmp (sim_cluster.sh --share).
#     RATE shapes each host's link both ways (default $RATE, else 1gbit; none: unshaped).
# cluster_stop
#     Stops the cluster (idempotent) and removes CLUSTER_DIR when cluster_start made it,
#     unless CLUSTER_KEEP=1 (a later cluster_start makes it again; unset CLUSTER_DIR
#     first for a new one).
# cluster_exec HOST CMD...
#     Runs CMD on HOST (node1..nodeH), in the current directory (when the host sees it).
# cluster_mpirun R [LAUNCH_OPTION...] [--] CMD...
#     R ranks on each of the H hosts (W = H x R, ranks numbered host by host) through
#     launch/ncf_launch and Open MPI's mpirun on node1, with the rsh agent of this
#     directory, TCP on the cluster subnet only, shared memory within a host, and
#     mpi_yield_when_idle (every host shares this machine's cores; a spinning rank
#     would starve the others). Options before `--` go to ncf_launch (--env,
#     --node-timeout, --mca). Output and exit code are mpirun's. Ends after
#     CLUSTER_TIMEOUT seconds (default 600).
# cluster_mpirun_on HOSTLIST [LAUNCH_OPTION...] [--] CMD...
#     The same on the hosts of HOSTLIST, e.g. node1:4 (W = 4 on one host, the
#     reference for a multi-host run) or node1:2,node3:2; mpirun runs on its first host.
# cluster_kill HOST          every process of HOST dies at once (SIGKILL): a crashed node
# cluster_link HOST up|down  HOST's link to the bridge down or up: a partitioned node
# cluster_procs HOST NAME    pids of the live (not zombie) processes called NAME on HOST
# cluster_hold_output BIN WRAPPER PREFIX REGEX
#     Writes WRAPPER, a script that runs BIN with its standard output into the FIFO
#     PREFIX.fifo and its standard error appended to PREFIX.err, and starts
#     hold_output.py on the FIFO: it copies the ranks' output to PREFIX.out up to the
#     first line matching REGEX, creates PREFIX.held, and reads no more, so a rank that
#     goes on printing blocks in a write (its threads run on) and the run cannot end.
#     Start the ranks as WRAPPER; cluster_hold_end (and the exit trap) ends the reader.
#                            (also on a host that was killed or cut off)
# cluster_logs               prints the tails of the cluster's daemon logs (on failure)
# cluster_slurm_field JOB FIELD   one field of `scontrol show job JOB` (JobState, Reason, ...)
# cluster_slurm_wait JOB SECONDS
#     waits until JOB is COMPLETED (returns 0) or has ended otherwise (a failed state
#     that stays 60 s) or not within SECONDS (prints why, returns 1). A requeued job
#     that Slurm holds for two minutes (BeginTime) is started 2 s after its requeue,
#     as an administrator could.
# cluster_where              the CMD prefix that makes each rank print, before it starts,
#                            "where: rank R of W on HOST (local L of N)" on stderr:
#                            cluster_mpirun 2 -- $(cluster_where) ncf_dist ...
# cluster_rank_hosts TEXT    from output with those lines: "R HOST" per rank, sorted
# cluster_epoch_lines FILE   ncf_dist's epoch lines of FILE as "epoch loss HR NDCG"
# cluster_small_data BUILD DIR
#     writes the small synthetic set (2,000 users, 1,000 items, 99 eval negatives, 2
#     shards; ncf_prep from BUILD/src) to DIR: an epoch of batch 2560 takes about half a
#     second at W = 4 on two cores
# cluster_final_metrics FILE.jsonl   "epoch loss hr ndcg" of the last line of a
#                            --metrics_json file, at full precision

cluster_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cluster_root="$(cd "$cluster_here/../.." && pwd)"
cluster_sim="$cluster_here/sim_cluster.sh"
cluster_made_dir=0
# The helpers' Python: Debian's where there is one (a python3 earlier on PATH may be a
# version manager's shim, 0.35 s to start here against 0.03 s), else python3 on PATH.
cluster_python3=python3
if [ -x /usr/bin/python3 ]; then cluster_python3=/usr/bin/python3; fi

cluster_check() {
  local why rc=0
  why=$("$cluster_sim" check 2>&1) || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "${why#sim_cluster.sh: no cluster on this machine: }"
    return 77
  fi
}

cluster_start() {
  local h="${1:-2}"
  [ $# -eq 0 ] || shift
  if [ -z "${CLUSTER_DIR:-}" ]; then
    CLUSTER_DIR=$(mktemp -d /var/tmp/ncf-cluster-XXXXXX)
    cluster_made_dir=1
  fi
  export CLUSTER_DIR
  trap cluster_cleanup EXIT
  trap 'exit 130' INT TERM
  local out
  # The hosts see the repository and the build (the test's $build) where they are, also
  # under /tmp, which each host has its own of.
  local share=(--share "$cluster_root")
  [ -z "${build:-}" ] || share+=(--share "$build")
  out=$("$cluster_sim" --dir "$CLUSTER_DIR" --hosts "$h" --rate "${RATE:-1gbit}" "${share[@]}" "$@" start) ||
    { echo "cluster_start: could not start $h hosts in $CLUSTER_DIR" >&2; return 1; }
  CLUSTER_HOSTS=$(sed -n 's/^CLUSTER_HOSTS=//p' <<<"$out")
  CLUSTER_SUBNET=$(sed -n 's/^CLUSTER_SUBNET=//p' <<<"$out")
  if grep -q '^SLURM_CONF=' <<<"$out"; then
    SLURM_CONF=$(sed -n 's/^SLURM_CONF=//p' <<<"$out")
    export SLURM_CONF
  fi
  CLUSTER_SHARED="$CLUSTER_DIR/shared"
  mkdir -p "$CLUSTER_SHARED"
  export CLUSTER_HOSTS CLUSTER_SUBNET CLUSTER_SHARED
}

cluster_stop() {
  [ -n "${CLUSTER_DIR:-}" ] || return 0
  "$cluster_sim" --dir "$CLUSTER_DIR" stop || return 1
  if [ "$cluster_made_dir" = 1 ] && [ "${CLUSTER_KEEP:-0}" != 1 ]; then rm -rf "$CLUSTER_DIR"; fi
}

cluster_hold_output() {
  local bin=$1 wrapper=$2 prefix=$3 regex=$4
  mkfifo "$prefix.fifo"
  : >"$prefix.err"
  rm -f "$prefix.held"
  "$cluster_python3" "$(dirname "${BASH_SOURCE[0]}")/hold_output.py" "$prefix.fifo" "$prefix.out" "$regex" \
    "$prefix.held" &
  cluster_holder=$!
  printf '#!/bin/sh\nexec %q "$@" >%q 2>>%q\n' "$bin" "$prefix.fifo" "$prefix.err" >"$wrapper"
  chmod +x "$wrapper"
}

cluster_hold_end() {
  [ -n "${cluster_holder:-}" ] || return 0
  kill "$cluster_holder" 2>/dev/null || true
  wait "$cluster_holder" 2>/dev/null || true
  cluster_holder=""
}

cluster_cleanup() {
  local rc=$?
  cluster_hold_end
  if declare -F cluster_user_cleanup >/dev/null; then cluster_user_cleanup || true; fi
  cluster_stop || { echo "cluster_cleanup: the cluster in $CLUSTER_DIR did not stop cleanly" >&2; rc=1; }
  exit "$rc"
}

cluster_exec() {
  "$cluster_sim" --dir "$CLUSTER_DIR" exec "$@"
}

cluster_kill() { "$cluster_sim" --dir "$CLUSTER_DIR" kill "$1"; }
cluster_link() { "$cluster_sim" --dir "$CLUSTER_DIR" link "$1" "$2"; }

cluster_mpirun() {
  local r="$1" list="" k
  shift
  for k in $(seq "$CLUSTER_HOSTS"); do list+="${list:+,}node$k:$r"; done
  cluster_mpirun_on "$list" "$@"
}

cluster_mpirun_on() {
  local list="$1" np=0 e first opts=()
  shift
  for e in ${list//,/ }; do np=$((np + ${e#*:})); done
  first="${list%%,*}"
  first="${first%%:*}"
  # Launcher options (they start with -) up to --; a program never starts with -.
  if [ $# -gt 0 ] && [[ "$1" == -* ]]; then
    while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
    [ $# -gt 0 ] || { echo "cluster_mpirun: no -- before the program" >&2; return 2; }
    shift
  fi
  timeout -k 10 "${CLUSTER_TIMEOUT:-600}" "$cluster_sim" --dir "$CLUSTER_DIR" exec "$first" \
    "$cluster_root/launch/ncf_launch" --hosts "$list" -np "$np" --gpus-per-node 0 --bind none \
    --mca plm_rsh_agent "$cluster_here/rsh_agent.sh $CLUSTER_DIR" \
    --mca btl self,vader,tcp --mca btl_tcp_if_include "$CLUSTER_SUBNET" \
    --mca oob_tcp_if_include "$CLUSTER_SUBNET" --mca mpi_yield_when_idle 1 --mca pml ob1 \
    ${opts[@]+"${opts[@]}"} -- "$@"
}

cluster_logs() {
  local f
  for f in "$CLUSTER_DIR"/logs/*.log; do
    [ -s "$f" ] || continue
    echo "---- $f (last 15 lines)"
    tail -n 15 "$f"
  done
}

cluster_where() { echo "$cluster_here/where.sh"; }

cluster_rank_hosts() {
  sed -n 's/^where: rank \([0-9]*\) of [0-9]* on \([^ ]*\) .*/\1 \2/p' <<<"$1" | sort -n
}

cluster_epoch_lines() {
  grep -E '^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ ' "$1" | awk '{print $1, $2, $3, $4}'
}

cluster_small_data() {
  "$1/src/ncf_prep" --synthetic small --eval_negatives 99 --record_rows 4096 --num_shards 2 \
    --output "$2" --progress off >/dev/null
}

cluster_final_metrics() {
  "$cluster_python3" -c 'import json, sys
lines = [l for l in open(sys.argv[1]) if l.strip()]
m = json.loads(lines[-1])
print(m["epoch"], repr(m["loss"]), repr(m["hr"]), repr(m["ndcg"]))' "$1"
}

cluster_procs() {
  local prefix pids
  prefix=$("$cluster_sim" --dir "$CLUSTER_DIR" info | sed -n 's/^CLUSTER_PREFIX=//p')
  pids=$(ip netns pids "$prefix-$1" 2>/dev/null | tr '\n' ',' || true)
  [ -n "$pids" ] || return 0
  ps -o pid=,stat=,comm= -p "${pids%,}" | awk -v n="$2" '$2 !~ /^Z/ && $3 == n {print $1}'
}

cluster_slurm_field() {
  cluster_exec node1 scontrol show job "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1
}

cluster_slurm_wait() {
  local ended="" state held="" t0=$SECONDS
  while [ $((SECONDS - t0)) -lt "$2" ]; do
    state=$(cluster_slurm_field "$1" JobState)
    # A job that requeues itself can show FAILED or CANCELLED for a moment while its
    # batch shell is taken down, for longer on a loaded machine; a state that stays
    # 60 s has ended it (the limit is a safety net: the test waits for COMPLETED).
    case "$state" in
      COMPLETED) return 0 ;;
      # Slurm holds a requeued batch job for two minutes (BeginTime). It is started
      # 2 s after the requeue, not sooner: a node refuses a job credential issued in the
      # second (Slurm counts whole seconds) in which it revoked the job's previous one
      # ("Job credential revoked").
      PENDING)
        ended=""
        if [ "$(cluster_slurm_field "$1" Reason)" = BeginTime ]; then
          [ -n "$held" ] || held=$SECONDS
          if [ $((SECONDS - held)) -ge 2 ]; then
            cluster_exec node1 scontrol update JobId="$1" StartTime=now || true
          fi
        fi
        ;;
      FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE)
        [ -n "$ended" ] || ended=$SECONDS
        if [ $((SECONDS - ended)) -ge 60 ]; then echo "job $1 ended $state" >&2; return 1; fi
        ;;
      *) ended="" ;;
    esac
    sleep 0.2
  done
  echo "job $1 did not finish in $2 s (state $(cluster_slurm_field "$1" JobState))" >&2
  return 1
}
