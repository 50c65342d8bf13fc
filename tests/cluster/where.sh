#!/bin/sh
# where.sh PROGRAM ARGS...: prints where this rank runs, as its launcher placed it, then
# becomes PROGRAM. Open MPI's mpirun and Slurm's srun each say which rank this is and
# how many share its node (the node-local group MPI_COMM_TYPE_SHARED is built from).
#   where: rank R of W on HOST (local L of N)
rank=${OMPI_COMM_WORLD_RANK:-${SLURM_PROCID:-?}}
world=${OMPI_COMM_WORLD_SIZE:-${SLURM_NTASKS:-?}}
local_rank=${OMPI_COMM_WORLD_LOCAL_RANK:-${SLURM_LOCALID:-?}}
local_size=${OMPI_COMM_WORLD_LOCAL_SIZE:-${SLURM_TASKS_PER_NODE:-?}}
echo "where: rank $rank of $world on $(hostname) (local $local_rank of $local_size)" >&2
exec "$@"
