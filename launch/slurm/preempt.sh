# Sourced by the sbatch scripts: run_preemptible CMD... runs the job step so
# that a preemption notice reaches the ncf_dist ranks, and requeues the job
# when they report that they stopped with a checkpoint.
#
# Slurm signals the batch shell (#SBATCH --signal=B:USR1@<seconds> before the
# time limit, or `scancel --signal=USR1 --batch JOB` at any time); the shell
# passes SIGUSR1 or SIGTERM on to srun (or mpirun), which forwards it to every
# rank. ncf_dist then stops all ranks after the same step, writes a checkpoint
# to --checkpoint_dir and exits with 75; this function asks Slurm to requeue
# the job (#SBATCH --requeue), whose next start resumes with --resume auto.
run_preemptible() {
  "$@" &
  local pid=$! rc=0
  trap 'echo "job ${SLURM_JOB_ID:-?}: SIGUSR1: the ranks checkpoint and stop"; kill -USR1 "$pid" 2>/dev/null || true' USR1
  trap 'echo "job ${SLURM_JOB_ID:-?}: SIGTERM: passed on to the ranks"; kill -TERM "$pid" 2>/dev/null || true' TERM
  while :; do
    rc=0
    wait "$pid" || rc=$?
    # A trapped signal ends `wait` early; wait again until the step has ended.
    kill -0 "$pid" 2>/dev/null || break
  done
  trap - USR1 TERM
  if [ "$rc" -eq 75 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    echo "job $SLURM_JOB_ID: ncf_dist wrote a checkpoint and stopped (exit 75): requeueing"
    scontrol requeue "$SLURM_JOB_ID"
    exit 0
  fi
  return "$rc"
}
