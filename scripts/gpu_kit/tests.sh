# shellcheck shell=bash
# shellcheck disable=SC2317,SC2154
# (shellcheck: functions run through stage and limited; globals are set in gpu_kit.sh,
# common.sh and cmd_run)
#
# Sourced by scripts/gpu_kit.sh: `run tests`: parity, the compute sanitizers, determinism,
# ctest.

# ---- tests ------------------------------------------------------------------------------------------
do_ctest() { ours env NCF_REQUIRE_GPU="$2" ctest --test-dir "$build" -L "$1" --output-on-failure --no-tests=error -j "$3"; }
san_parity="${NCF_KIT_PARITY_FILTER:-Parity.Fill:Parity.GmfForwardBackwardOnStridedRows:Parity.HeadForwardBackward:Parity.SortReduceRowsBitExact:Parity.BucketizeByOwnerExact:Parity.UniqueIdsExact:Parity.ReduceUpdateRowsEveryOptimizer:Parity.BadRowLeavesTablesAloneWithEveryOptimizer:Parity.TopKRefusesExcludedItemsOutsideTheRow}"
# nccl_probe_only LOG: true when every error compute-sanitizer counted in LOG is an API error
# "no kernel image" whose innermost host frame is in libnccl (NCCL's kernel probe).
nccl_probe_only() {
  awk '/ERROR SUMMARY: [0-9]+ error/ {total += $(NF - 1); next}
    /Program hit .* on CUDA API call/ {head = /cudaErrorNoKernelImageForDevice/; frame = 1; next}
    frame && /Host Frame:/ {if (head && / in libnccl\.so/) probe++; frame = 0}
    END {
      if (total > 0 && probe == total) {
        printf "gpu_kit: %d API errors, all NCCL probing its kernel images (libnccl), not counted\n", probe
        exit 0
      }
      exit 1
    }' "$1"
}
do_sanitizer() {
  local tool=$1 rc=0 cs
  cs="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  local sc=("$cs" --tool "$tool" --error-exitcode 99)
  [ "$tool" = memcheck ] && sc+=(--leak-check no --padding 64)
  # NCF_SCRATCH_DEBUG=separate: every array an op takes from the scratch arena is an
  # allocation of its own, so memcheck sees an overrun from one array into the next, and
  # initcheck a read of an array no kernel of this op wrote (the arena would hide both).
  local dbg=(env NCF_SCRATCH_DEBUG=separate)
  if [ "$tool" != initcheck ]; then
    echo "== test_pipeline_gpu"
    # NCCL probes its kernels with cudaFuncGetAttributes at communicator creation and
    # takes "no kernel image" for the architectures its build lacks; memcheck reports those
    # API errors. They are NCCL's own, handled by NCCL: counted apart, not failures. Any
    # other error (an access, a leak, an API error outside libnccl) still fails the stage.
    local logf prc=0
    logf="$(mktemp)"
    ours env NCF_REQUIRE_GPU=1 "${sc[@]}" "$build/tests/test_pipeline_gpu" >"$logf" 2>&1 || prc=$?
    cat "$logf"
    if [ "$prc" -ne 0 ]; then
      # forgiven only when the tests themselves passed and the sanitizer's errors are all
      # NCCL's probe (exit 99 is --error-exitcode's)
      [ "$prc" -eq 99 ] && grep -q '^\[  PASSED  \]' "$logf" && ! grep -q '^\[  FAILED  \]' "$logf" &&
        nccl_probe_only "$logf" || rc=1
    fi
    rm -f "$logf"
  fi
  echo "== test_parity_gpu --gtest_filter=$san_parity (NCF_SCRATCH_DEBUG=separate)"
  ours "${dbg[@]}" NCF_REQUIRE_GPU=1 "${sc[@]}" "$build/tests/test_parity_gpu" \
    --gtest_filter="$san_parity" || rc=1
  echo "== ncf_dist --device cuda --max_steps 20 (NCF_SCRATCH_DEBUG=separate)"
  ours "${dbg[@]}" "${sc[@]}" "$build/src/ncf_dist" --device cuda --data_dir "$data/small" \
    --train_epochs 1 --max_steps 20 --progress off || rc=1
  return "$rc"
}
do_parity() {
  ours env NCF_REQUIRE_GPU=1 "$build/tests/test_parity_gpu" --gtest_brief=1
}
fig_parity() {
  grep -hE '^\[  (PASSED|FAILED|SKIPPED) +\]' "$1" | grep -v ', listed below' | tr '\n' ' ' | cut -c1-160
}
do_small_data() {
  [ -f "$data/small/metadata.json" ] && { echo "have $data/small"; return 0; }
  ours "$build/src/ncf_prep" --synthetic small --output "$data/small"
}
do_determinism() {
  local d="$out/determinism" run
  rm -rf "$d"; mkdir -p "$d"
  # runs 1 and 2 eager, run graph with each step after the first of its size as one CUDA graph
  for run in 1 2 graph; do
    local graph=off
    [ "$run" = graph ] && graph=on
    ours "$build/src/ncf_dist" --device cuda --data_dir "$data/small" --train_epochs 2 \
      --progress off --cuda_graph "$graph" --save_params "$d/params_$run.bin" \
      --metrics_json "$d/metrics_$run.jsonl" || return 1
    # timings differ between runs; everything else must not
    sed -E 's/"[A-Za-z_]*(seconds|per_second|_s)": *[-0-9.eE+]+,? *//g' "$d/metrics_$run.jsonl" >"$d/metrics_$run.cmp"
  done
  cmp "$d/params_1.bin" "$d/params_2.bin" && cmp "$d/metrics_1.cmp" "$d/metrics_2.cmp" &&
    echo "identical: $(stat -c %s "$d/params_1.bin") bytes of parameters, $(wc -l <"$d/metrics_1.cmp") metric lines" ||
    return 1
  cmp "$d/params_1.bin" "$d/params_graph.bin" && cmp "$d/metrics_1.cmp" "$d/metrics_graph.cmp" &&
    echo "--cuda_graph on: identical to the eager runs"
}

# The order gives a short GPU window the most: the parity suite, the sanitizers and one
# profile of ml-20m steps first; the whole GPU label, determinism and the CPU tests (which
# CI runs anyway) after them.
run_tests() {
  built || { record tests FAIL "no build in $build" 0; return 0; }
  local j
  j=$(nproc)
  stage parity 1 180 fig_parity -- do_parity
  stage data_small 0 120 fig_tail -- do_small_data
  local tool
  for tool in memcheck initcheck racecheck synccheck; do
    stage "sanitizer_$tool" 1 150 fig_sanitizer -- do_sanitizer "$tool"
  done
  if [ "$have_gpu" = 1 ]; then
    stage data_ml20m 0 240 fig_tail -- do_m20_data
  else
    record data_ml20m "no GPU" "only the GPU runs read it" 0
  fi
  stage profile_steps 1 120 fig_tail -- do_profile_steps
  stage profile_kernels 1 180 fig_tail -- do_profile_kernels
  stage ctest_gpu 1 300 fig_ctest -- do_ctest gpu 1 1
  stage determinism 1 120 fig_tail -- do_determinism
  stage ctest_cpu 0 420 fig_ctest -- do_ctest cpu 0 "$j"
}
