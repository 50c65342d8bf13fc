#!/usr/bin/env bash
# Self-check of launch/: ncf_launch's composed command lines (with a stand-in nvidia-smi
# and a stand-in mpirun, so it runs on machines with neither a GPU nor a cluster), its
# error messages, one real 2-rank mpirun, and the shell syntax of the sbatch scripts.
#   bash launch/check_launch.sh
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
L="$here/ncf_launch"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 checks=0

# expect NAME WANT_RC REGEX -- launcher args...: the command line (or error) printed
# on stderr must match REGEX and the exit code must be WANT_RC.
expect() {
  local name="$1" want_rc="$2" re="$3"
  shift 4
  local out rc
  out=$(env -u SLURM_JOB_NUM_NODES "$L" "$@" 2>&1)
  rc=$?
  checks=$((checks + 1))
  if [ "$rc" != "$want_rc" ] || ! grep -Eq -- "$re" <<<"$out"; then
    fails=$((fails + 1))
    printf 'FAIL %s: rc %s (want %s), output:\n%s\n' "$name" "$rc" "$want_rc" "$out"
  else
    printf 'ok   %s\n' "$name"
  fi
}

# A stand-in nvidia-smi listing 4 GPUs, first on PATH for the auto-detection checks.
mkdir -p "$tmp/gpu4"
cat >"$tmp/gpu4/nvidia-smi" <<'EOF'
#!/bin/sh
for k in 0 1 2 3; do echo "GPU $k: NVIDIA H100 80GB HBM3 (UUID: GPU-0000000$k)"; done
EOF
chmod +x "$tmp/gpu4/nvidia-smi"
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)

expect "np required without GPU" 2 "-np is required" -- --dry-run --gpus-per-node 0 -- prog
expect "non-numeric np" 2 "-np must be a positive integer, got 'x8'" -- -np x8 -- prog
expect "zero np" 2 "-np must be a positive integer, got '0'" -- -np 0 -- prog
expect "missing --" 2 "missing '--' before the program 'prog'" -- -np 2 prog --flag
expect "unknown option" 2 "unknown option '--frob'" -- --frob -- prog
expect "nothing after --" 2 "no program after '--'" -- -np 2 --
expect "bad bind" 2 "--bind must be core, socket or none, got 'numa'" -- --bind numa -np 1 -- prog
expect "bad hosts slots" 2 "--hosts entry 'b:0'" -- --hosts a:2,b:0 -- prog
expect "bad gpus" 2 "--gpus-per-node must be a non-negative integer, got 'two'" -- --gpus-per-node two -- prog
expect "np over GPUs" 2 "-np 9 is more than --gpus-per-node 8" -- -np 9 --gpus-per-node 8 -- prog
expect "flag without value" 2 "flag -np needs a value" -- -np
expect "bad env name" 2 "--env needs VAR or VAR=VALUE, got '1X'" -- --env 1X -np 1 -- prog
expect "help" 0 "Usage:" -- --help

expect "one rank per GPU from --gpus-per-node" 0 \
  "mpirun -np 8 .*--map-by ppr:8:node.* prog --device cuda$" -- --dry-run --gpus-per-node 8 -- prog --device cuda
PATH="$tmp/gpu4:$PATH" expect "np from nvidia-smi -L" 0 "mpirun -np 4 .*--map-by ppr:4:node" -- --dry-run -- prog
if [ "$cores" -ge 4 ]; then
  PATH="$tmp/gpu4:$PATH" expect "cores shared among GPU ranks" 0 \
    "ppr:4:node:PE=$((cores / 4)) --bind-to core" -- --dry-run -- prog
fi
expect "two nodes x 8 GPUs" 0 \
  "mpirun -np 16 --host n1:8,n2:8 --map-by ppr:8:node.* -x PATH .*prog$" -- \
  --dry-run --hosts n1:8,n2:8 --gpus-per-node 8 -- prog
expect "CPU ranks over hosts fill their slots" 0 "mpirun -np 6 --host a:4,b:2 --map-by slot .*-x PATH" -- \
  --dry-run --gpus-per-node 0 --hosts a:4,b:2 -- prog
expect "oversubscribe past the cores" 0 "-np $((cores + 1)) --oversubscribe --map-by slot --bind-to none" -- \
  --dry-run --gpus-per-node 0 -np $((cores + 1)) -- prog
expect "no oversubscribe within the cores" 0 "-np 1 --map-by slot:PE=$cores --bind-to core" -- \
  --dry-run --gpus-per-node 0 -np 1 -- prog
expect "socket binding" 0 "--bind-to socket" -- --dry-run -np 1 --bind socket -- prog
NCCL_IB_HCA=mlx5_0 OMP_NUM_THREADS=4 NCF_X=1 OMPI_MCA_foo=1 expect "environment pass-through" 0 \
  "-x NCCL_IB_HCA -x NCF_X -x OMP_NUM_THREADS" -- --dry-run -np 1 -- prog
out=$(OMPI_MCA_foo=1 "$L" --dry-run -np 1 -- prog 2>&1)
checks=$((checks + 1))
if grep -q -- "-x OMPI_" <<<"$out"; then fails=$((fails + 1)); echo "FAIL OMPI_ passed: $out"; else
  echo "ok   OMPI_ variables stay with mpirun"; fi
NCCL_DEBUG=WARN expect "explicit --env wins" 0 "-x NCCL_DEBUG=INFO .*-x FOO=a b|-x NCCL_DEBUG=INFO -x 'FOO=a b'" -- \
  --dry-run -np 1 --env NCCL_DEBUG=INFO --env "FOO=a b" -- prog
expect "mca and raw args" 0 "--mca btl self,vader --report-bindings prog" -- \
  --dry-run -np 1 --mca btl self,vader --mpirun-arg --report-bindings -- prog
expect "keepalive on several nodes" 0 \
  "--mca oob_tcp_keepalive_time 15 --mca oob_tcp_keepalive_intvl 5 --mca oob_tcp_keepalive_probes 3 prog$" -- \
  --dry-run --gpus-per-node 0 --hosts a:2,b:2 -- prog
expect "keepalive from --node-timeout" 0 "oob_tcp_keepalive_time 6 --mca oob_tcp_keepalive_intvl 2 " -- \
  --dry-run --gpus-per-node 0 --hosts a:2,b:2 --node-timeout 12 -- prog
expect "an explicit keepalive --mca wins" 0 \
  "keepalive_intvl 5 --mca oob_tcp_keepalive_probes 3 --mca oob_tcp_keepalive_time 99 prog$" -- \
  --dry-run --gpus-per-node 0 --hosts a:2,b:2 --mca oob_tcp_keepalive_time 99 -- prog
OMPI_MCA_oob_tcp_keepalive_probes=7 expect "an OMPI_MCA_ keepalive wins" 0 "keepalive_intvl 5 prog$" -- \
  --dry-run --gpus-per-node 0 --hosts a:2,b:2 -- prog
out=$("$L" --dry-run --gpus-per-node 0 --hosts a:2 -- prog 2>&1; "$L" --dry-run --gpus-per-node 0 --node-timeout 0 \
      --hosts a:2,b:2 -- prog 2>&1)
checks=$((checks + 1))
if grep -q keepalive <<<"$out"; then fails=$((fails + 1)); echo "FAIL keepalive on one node or with --node-timeout 0: $out"; else
  echo "ok   no keepalive on one node or with --node-timeout 0"; fi
expect "bad node timeout" 2 "--node-timeout must be a non-negative integer \(seconds\), got '1m'" -- \
  --node-timeout 1m -np 1 -- prog
expect "quoting of program args" 0 "prog --data_dir 'a b'" -- --dry-run -np 1 -- prog --data_dir "a b"
if [ "$(id -u)" = 0 ]; then
  expect "root flags" 0 "^ncf_launch: env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun" -- \
    --dry-run -np 1 -- prog
fi

# Inside a Slurm allocation the node count comes from SLURM_JOB_NUM_NODES.
out=$(SLURM_JOB_NUM_NODES=2 "$L" --dry-run --gpus-per-node 2 --bind none -- prog 2>&1)
checks=$((checks + 1))
if grep -q "mpirun -np 4 --map-by ppr:2:node" <<<"$out"; then echo "ok   SLURM_JOB_NUM_NODES=2"; else
  fails=$((fails + 1)); echo "FAIL SLURM_JOB_NUM_NODES=2: $out"; fi

# The exit code is mpirun's: a stand-in mpirun that reports Open MPI and exits 7.
cat >"$tmp/mpirun" <<'EOF'
#!/bin/sh
[ "$1" = --version ] && { echo "mpirun (Open MPI) 4.1.4"; exit 0; }
exit 7
EOF
chmod +x "$tmp/mpirun"
expect "exit code passes through" 7 "mpirun -np 1" -- --mpirun "$tmp/mpirun" -np 1 -- true

# One real launch when Open MPI is here: every rank must run and see the passed variable.
if command -v mpirun >/dev/null 2>&1; then
  # shellcheck disable=SC2016  # the ranks expand these, not this shell
  out=$(NCF_CHECK_VAR=hello "$L" -np 2 -- sh -c 'echo "rank $OMPI_COMM_WORLD_RANK of $OMPI_COMM_WORLD_SIZE $NCF_CHECK_VAR"' 2>&1)
  checks=$((checks + 1))
  if grep -q "rank 0 of 2 hello" <<<"$out" && grep -q "rank 1 of 2 hello" <<<"$out"; then
    echo "ok   real mpirun, 2 ranks"
  else
    fails=$((fails + 1)); printf 'FAIL real mpirun:\n%s\n' "$out"
  fi
fi

# The sbatch scripts run as plain bash with a stand-in srun/mpirun that prints its
# arguments, and SLURM_* variables as an allocation of 2 nodes x 8 GPUs would set them.
mkdir -p "$tmp/slurm"
cat >"$tmp/slurm/srun" <<'EOF'
#!/bin/sh
echo "STUB srun $*"
EOF
cat >"$tmp/slurm/mpirun" <<'EOF'
#!/bin/sh
[ "$1" = --version ] && { echo "mpirun (Open MPI) 4.1"; exit 0; }
echo "STUB mpirun $*"
EOF
chmod +x "$tmp/slurm/srun" "$tmp/slurm/mpirun"
sb() {  # name, regex, then VAR=VALUE... script
  local name="$1" re="$2" out
  shift 2
  out=$(cd "$tmp" && env PATH="$tmp/slurm:$PATH" MPIRUN="$tmp/slurm/mpirun" SLURM_JOB_ID=42 \
        SLURM_JOB_NODELIST="n[1-2]" SLURM_JOB_NUM_NODES=2 SLURM_CPUS_PER_TASK=6 \
        SLURM_SUBMIT_DIR=/repo NCF_ROOT="$here/.." "$@" 2>&1)
  checks=$((checks + 1))
  if grep -Eq -- "$re" <<<"$out"; then echo "ok   $name"; else
    fails=$((fails + 1)); printf 'FAIL %s:\n%s\n' "$name" "$out"; fi
}
sb "1node sbatch: srun command" \
  "^STUB srun --mpi=pmix --cpu-bind=cores .*/build/src/ncf_dist --data_dir /d --preset ml-20m-mlperf --device cuda --threads 6 --progress off --dedup --max_steps 5$" \
  DATA_DIR=/d EXTRA_ARGS="--dedup --max_steps 5" bash "$here/slurm/ncf_dist_1node.sbatch"
sb "1node sbatch: pyxis container" \
  "^STUB srun --mpi=pmix --cpu-bind=cores --container-image=nvcr.io#x/ncf:1 --container-mounts=/d:/d ncf_dist --data_dir /d" \
  DATA_DIR=/d CONTAINER_IMAGE="nvcr.io#x/ncf:1" bash "$here/slurm/ncf_dist_1node.sbatch"
sb "multinode sbatch: srun" "^STUB srun --mpi=pmix --ntasks-per-node=8 --cpu-bind=cores .*ncf_dist --data_dir /d" \
  DATA_DIR=/d bash "$here/slurm/ncf_dist_multinode.sbatch"
sb "multinode sbatch: mpirun through ncf_launch" \
  "^STUB mpirun -np 16 --map-by ppr:8:node(:PE=6 --bind-to core| --bind-to none) .*-x NCCL_IB_HCA .*ncf_dist --data_dir /d --preset p" \
  DATA_DIR=/d PRESET=p LAUNCHER=mpirun NCCL_IB_HCA=mlx5_0 bash "$here/slurm/ncf_dist_multinode.sbatch"
sb "multinode sbatch: bad launcher" "LAUNCHER must be srun or mpirun, got 'ssh'" \
  LAUNCHER=ssh bash "$here/slurm/ncf_dist_multinode.sbatch"

for f in "$here"/slurm/*.sbatch "$here"/*.sh "$L"; do
  checks=$((checks + 1))
  if bash -n "$f"; then echo "ok   bash -n ${f#"$here"/}"; else fails=$((fails + 1)); echo "FAIL bash -n $f"; fi
done
if command -v shellcheck >/dev/null 2>&1; then
  checks=$((checks + 1))
  if shellcheck -x "$L" "$here"/slurm/*.sbatch "$here"/*.sh; then echo "ok   shellcheck"; else
    fails=$((fails + 1)); echo "FAIL shellcheck"; fi
fi

echo "check_launch: $((checks - fails)) of $checks checks passed"
[ "$fails" = 0 ]
