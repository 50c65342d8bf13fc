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
#
# verify_checkpoints DIR CMD... runs before a start resumes from DIR: CMD is
# ncf_export (with what runs it, e.g. srun in a container), given --verify DIR.
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

# verify_checkpoints DIR CMD...: checks the checkpoints a start is about to
# resume from with `CMD --verify DIR` (ncf_export: every file read whole against
# the CRC-32Cs of its manifest). Returns 0 when DIR holds no sealed checkpoint
# (a first start) or at least one whole one (ncf_dist --resume auto takes the
# newest whole one and names the damaged ones it skips). When every sealed
# checkpoint is damaged it prints ncf_export's findings and returns 1: resuming
# would throw their training away (ncf_dist --resume auto stops the same way);
# the job should end there instead of training from step 0.
verify_checkpoints() {
  local dir=$1 out rc=0
  shift
  compgen -G "$dir/step-*/manifest.json" >/dev/null || return 0
  out=$("$@" --verify "$dir" 2>&1) || rc=$?
  printf '%s\n' "$out"
  if [ "$rc" -eq 0 ]; then return 0; fi
  if [ "$rc" -eq 126 ] || [ "$rc" -eq 127 ]; then
    echo "job ${SLURM_JOB_ID:-?}: warning: cannot run $* (set NCF_EXPORT): $dir not checked" \
      "before resuming; ncf_dist --resume auto applies the same rule itself" >&2
    return 0
  fi
  if grep -q ': whole: ' <<<"$out"; then
    echo "job ${SLURM_JOB_ID:-?}: checkpoints in $dir are damaged (above); resuming from the" \
      "newest whole one"
    return 0
  fi
  echo "job ${SLURM_JOB_ID:-?}: no sealed checkpoint in $dir loads (above), so the job stops" \
    "here instead of training from step 0 and losing them: restore an intact copy into $dir," \
    "or submit with RESUME=auto_or_restart to start from step 0 on purpose" >&2
  return 1
}
