#!/usr/bin/env bash
# Preemption under a real Slurm: a one-node cluster (cluster.sh), the real
# launch/slurm/ncf_dist_1node.sbatch in CPU mode with 2 ranks (srun
# --mpi=pmix) on the small synthetic set.
#   A: the job, never interrupted.
#   B: the same job (30 epochs of about 0.15 s: long enough for the signal to
#      arrive mid-run) with CHECKPOINT_DIR; once it has finished epoch 2, it gets
#      `scancel --signal=USR1 --batch` (what --signal=B:USR1@... does before a
#      time limit). Its ranks must checkpoint and exit 75, the script must
#      requeue it, and the second start must resume from the checkpoint and
#      finish with the same final epoch metrics as A, to the last digit.
#   bash tests/slurm/test_preempt.sh BUILD_DIR
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:?usage: $0 BUILD_DIR}" && pwd)"
[ "$(id -u)" -eq 0 ] || { echo "test_preempt: needs root (slurmd as root)" >&2; exit 1; }
bash "$root/tests/slurm/setup.sh"
work=$(mktemp -d /tmp/ncf-slurm-XXXXXX)
cleanup() { bash "$root/tests/slurm/cluster.sh" stop "$work/cluster" || true; }
trap cleanup EXIT
fail() {
  echo "test_preempt: FAIL: $*" >&2
  for f in "$work"/*.out; do echo "---- $f" >&2; cat "$f" >&2; done
  exit 1
}
eval "$(bash "$root/tests/slurm/cluster.sh" start "$work/cluster" | grep '^SLURM_CONF=')"
export SLURM_CONF

"$build/src/ncf_prep" --synthetic small --eval_negatives 99 --record_rows 4096 --num_shards 2 \
  --output "$work/data" --progress off >/dev/null
export NCF_ROOT="$root" NCF_DIST="$build/src/ncf_dist" DATA_DIR="$work/data" PRESET=ncf-paper
export DEVICE=cpu OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# PMIx's shared-memory store (gds ds21) of Debian's PMIx 4.2 / Open MPI 4.1 now and
# then crashes ranks at start under srun --mpi=pmix (segfault at address nil; known
# upstream, e.g. openpmix issues 1114 and 2210); the ranks use PMIx's hash store instead.
export PMIX_MCA_gds=hash
submit() {  # submit NAME [CHECKPOINT_DIR]: prints the job id
  CHECKPOINT_DIR="${2:-}" EXTRA_ARGS="--batch_size 2560 --train_epochs 30 --seed 3" \
    sbatch --parsable --gpus-per-node=0 --ntasks-per-node=2 --cpus-per-task=1 \
    --job-name="$1" --output="$work/$1.out" --chdir="$work" \
    "$root/launch/slurm/ncf_dist_1node.sbatch"
}
field() { scontrol show job "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }
wait_done() {  # wait_done JOB SECONDS
  local ended=0 held=""
  for _ in $(seq $(($2 * 5))); do
    local state
    state=$(field "$1" JobState)
    # A job that requeues itself can show FAILED or CANCELLED for a moment while
    # its batch shell is taken down; only a state that stays (3 s) has ended it.
    case "$state" in
      FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) ended=$((ended + 1)) ;;
      *) ended=0 ;;
    esac
    case "$state" in
      COMPLETED) return 0 ;;
      # Slurm holds a requeued batch job for two minutes (its BeginTime); the
      # test lets it start now, as an administrator could, but not within 2 s of
      # the requeue: a node refuses a credential issued in the second (Slurm counts
      # whole seconds) in which it revoked the job's previous one ("Job credential
      # revoked").
      PENDING)
        if [ "$(field "$1" Reason)" = BeginTime ]; then
          [ -n "$held" ] || held=$SECONDS
          if [ $((SECONDS - held)) -ge 2 ]; then scontrol update JobId="$1" StartTime=now || true; fi
        fi
        ;;
      FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY)
        [ "$ended" -lt 15 ] || fail "job $1 ended $state" ;;
    esac
    sleep 0.2
  done
  fail "job $1 did not finish in $2 s (state $(field "$1" JobState))"
}
epoch_lines() { grep -E '^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ ' "$1" | awk '{print $1, $2, $3, $4}'; }

a=$(submit A)
wait_done "$a" 120
[ "$(epoch_lines "$work/A.out" | wc -l)" -eq 30 ] || fail "job A did not print 30 epochs"

b=$(submit B "$work/ckpt")
for _ in $(seq 600); do
  epoch_lines "$work/B.out" 2>/dev/null | grep -q '^2 ' && break
  sleep 0.1
done
epoch_lines "$work/B.out" | grep -q '^2 ' || fail "job B did not reach epoch 2"
scancel --signal=USR1 --batch "$b"
wait_done "$b" 180

out="$work/B.out"
grep -q "SIGUSR1: the ranks checkpoint and stop" "$out" || fail "the batch shell did not pass SIGUSR1 on"
grep -q "stopped by SIGUSR1" "$out" || fail "ncf_dist did not stop on SIGUSR1"
grep -q "ncf_dist: checkpoint " "$out" || fail "no checkpoint was written"
grep -q "exit 75): requeueing" "$out" || fail "the job did not requeue itself"
grep -q "(start 2)" "$out" || fail "the job did not start a second time"
grep -q "ncf_dist: resuming from $work/ckpt/step-" "$out" || fail "the second start did not resume"
restarts=$(field "$b" Restarts)
[ "${restarts:-0}" -ge 1 ] || fail "Slurm reports Restarts=$restarts"
want=$(epoch_lines "$work/A.out" | tail -1)
got=$(epoch_lines "$out" | tail -1)
[ "$want" = "$got" ] || fail "final epoch: uninterrupted '$want', preempted and resumed '$got'"
stop=$(grep -o "in epoch [0-9]*" "$out" | head -1)
echo "test_preempt: ok: job $b checkpointed on SIGUSR1 $stop, requeued (Restarts=$restarts)," \
  "resumed, and ended with '$got' like the uninterrupted job $a"
