#!/usr/bin/env bash
# ncf_recommend's speed: users per second for top-10 recommendations over the
# whole item table of the synthetic ml-20m shape (138,493 users x 26,744
# items), NeuMF with the default tower (factors 8, layers 64,32,16,8), on CPU
# ranks at W = 1 (2 threads) and W = 2 (1 thread each), and on a GPU when
# this machine has one.
#   bash bench/recommend_speed.sh [OUT]   (default bench/results/recommend_<date>_<commit>.txt)
# Env: USERS (all, or how many of the first users; default all), NCF_BENCH_DATA
# (default /tmp/ncf-ckpt-bench), BUILD (default build-bench).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
commit=$(git -C "$root" rev-parse --short HEAD)
out="${1:-$root/bench/results/recommend_$(date -u +%F)_$commit.txt}"
work="${NCF_BENCH_DATA:-/tmp/ncf-ckpt-bench}"
build="$root/${BUILD:-build-bench}"
users="${USERS:-all}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bash "$root/scripts/setup.sh"
mkdir -p "$work"
if [ ! -x "$build/src/ncf_dist" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$build" -j "$(nproc)" --target ncf_dist ncf_prep ncf_recommend >/dev/null
bin="$build/src"
[ -f "$work/ml20m/metadata.json" ] ||
  "$bin/ncf_prep" --synthetic ml-20m --output "$work/ml20m" --progress off >/dev/null
ck="$work/ck-recommend"
if [ ! -d "$ck" ]; then
  "$bin/ncf_dist" --data_dir "$work/ml20m" --batch_size 65536 --max_steps 20 --train_epochs 1 \
    --no_eval --progress off --checkpoint_dir "$ck" >/dev/null
fi
list="all"
if [ "$users" != all ]; then
  list="$work/users-$users.txt"
  seq 0 $((users - 1)) >"$list"
fi
gpu=""
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && gpu=1
{
  echo "# ncf_recommend --topk 10 at $commit: synthetic ml-20m (138493 users x 26744 items),"
  echo "# factors 8, layers 64,32,16,8; users: $users"
  echo "# date: $(date -u +%FT%TZ)"
  echo "# machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
  runs=("1 cpu" "2 cpu")
  [ -n "$gpu" ] && runs+=("1 cuda")
  for run in "${runs[@]}"; do
    read -r W dev <<<"$run"
    launch=""
    [ "$W" -gt 1 ] && launch="mpirun -np $W --oversubscribe"
    threads=$((2 / W))
    [ "$dev" = cuda ] && threads=1
    cmd="$launch $bin/ncf_recommend --checkpoint $ck --data_dir $work/ml20m --users $list \
--topk 10 --device $dev --threads $threads --output $work/top10-$W-$dev.csv"
    echo "## W=$W $dev: $cmd"
    $cmd 2>&1 | grep -E "users in" || true
  done
} | tee "$out"
