#!/usr/bin/env bash
# The CUDA backend's GPU job, run from the repository root on a GPU host, in phases that each fit one 10-minute
# command:
#   tools/gpu/run_gpu_job.sh PHASE...        (no phase = tests)
# Phases:
#   build           scripts/setup.sh, then tools/gpu/pack.sh on this host (only where .gpu/ was not packed elsewhere)
#   tests           every CUDA test program (.gpu/bin/test_cuda_*)
#   sanitize        compute-sanitizer memcheck on every test program, racecheck on the attention / GEMM / GEMV ones,
#                   all at once (GPU_JOB_SANITIZE_FILTER: a --gtest_filter for all of them)
#   bench           cuda_bench, kernel areas (attention, gemm, linear, ops), default paths only
#   variants        cuda_bench, the same areas' "v:" rows (the other value of each environment switch)
#   model           cuda_bench, area model: decode at L1024 / L20000 / L32768, prefill n512 … n16384, Llama-3-8B
#                   shapes with random weights, default paths only
#   model-variants  cuda_bench, area model, the "v:" rows
#   peers           the PyTorch peers (tools/gpu/peers.py: bf16 / int8 / fp8 GEMM, bf16 GEMV, SDPA decode and prefill)
#   all             every phase above but build, in that order (needs GPU_JOB_DEADLINE=0 or a host without a limit)
# GPU_BENCH_FILTER narrows the cuda_bench phases (cuda_bench --filter). Where cuda_bench JSON and peers.json are both
# present, compare.txt puts them side by side (tools/gpu/compare.py; run it yourself on two jobs' archives otherwise).
#
# Outputs: everything under $OUT (default gpu-out) as one archive, $OUT/gpu-job.tar.gz, and one short
# $OUT/summary.txt. A deadline (GPU_JOB_DEADLINE seconds after the start, default 570; 0 = none) bounds every step,
# so that the archive is written even when a phase runs long. The exit status is 0 only when every phase passed.
#
# The programs come from .gpu/ (tools/gpu/pack.sh: the lent H200 has no gtest/CLI11 packages, so they are built
# elsewhere and carried); their test data (models/cider-tiny, tests/data) comes with the working tree, found by walking up from the
# executables (tests/support/test_support.h; $CIDER_TEST_ROOT overrides).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
T0=$(date +%s)
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
W=$OUT/gpu-job   # the staging folder; archived and removed at exit
rm -rf "$W" && mkdir -p "$W"
DEADLINE=${GPU_JOB_DEADLINE:-570}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}
ALL_PHASES=(tests sanitize bench variants model model-variants peers)
KERNEL_AREAS=attention,gemm,linear,ops

phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(tests)
expanded=()
for p in "${phases[@]}"; do
  if [ "$p" = all ]; then expanded+=("${ALL_PHASES[@]}"); else expanded+=("$p"); fi
done
phases=("${expanded[@]}")
for p in "${phases[@]}"; do
  case " build ${ALL_PHASES[*]} " in
    *" $p "*) ;;
    *) echo "run_gpu_job.sh: unknown phase '$p' (phases: build ${ALL_PHASES[*]} all)" >&2; exit 2 ;;
  esac
done

summary=()   # lines of summary.txt
status=0
note() { echo "$*"; summary+=("$*"); }

# Seconds left for one step (15 s kept for the archive), at least 1 (timeout 0 would mean none). No deadline: 86400.
left() {
  if [ "$DEADLINE" = 0 ]; then echo 86400; return; fi
  local l=$((DEADLINE - ($(date +%s) - T0) - 15))
  [ $l -gt 1 ] && echo $l || echo 1
}
late() { [ "$(left)" -le 1 ]; }

finish() {
  {
    echo "cider GPU job: phases ${phases[*]}, $(( $(date +%s) - T0 )) s, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    [ -f .gpu/REVISION ] && echo "programs: $(cat .gpu/REVISION)"
    [ -f "$W/gpu.txt" ] && tail -n +2 "$W/gpu.txt" | sed 's/^/gpu: /'
    printf '%s\n' "${summary[@]}"
    echo "result: $([ $status = 0 ] && echo PASS || echo FAIL) (details in gpu-job.tar.gz)"
  } > "$W/summary.txt"
  cp "$W/summary.txt" "$OUT/summary.txt"
  tar -C "$OUT" -czf "$OUT/gpu-job.tar.gz" gpu-job && rm -rf "$W"
  echo "== $OUT/summary.txt =="
  cat "$OUT/summary.txt"
}
trap finish EXIT

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv > "$W/gpu.txt" 2>&1 \
  || echo "nvidia-smi failed" >> "$W/gpu.txt"
cat "$W/gpu.txt"

unpack() {
  [ -d .gpu/bin ] && return 0
  if [ -f .gpu/pack.tar.xz ]; then
    tar -C .gpu -xJf .gpu/pack.tar.xz && return 0
  fi
  note "NO PROGRAMS: .gpu/pack.tar.xz is missing: run tools/gpu/pack.sh on a build machine (or the build phase here)"
  status=1
  return 1
}

phase_build() {
  if [ -d .gpu/bin ] || [ -f .gpu/pack.tar.xz ]; then note "build: skipped (.gpu/ already holds programs)"; return; fi
  if ! timeout "$(left)" bash scripts/setup.sh > "$W/setup.log" 2>&1; then
    note "build: FAIL (scripts/setup.sh; see setup.log)"; status=1; return
  fi
  if timeout "$(left)" bash tools/gpu/pack.sh > "$W/build.log" 2>&1; then
    note "build: ok ($(du -sh .gpu | cut -f1) in .gpu/)"
  else
    note "build: FAIL (tools/gpu/pack.sh; see build.log)"; tail -30 "$W/build.log"; status=1
  fi
}

# "[  PASSED  ] N tests." and its FAILED / SKIPPED siblings: gtest prints them with --gtest_brief=1 too.
gtest_count() { sed -nE "s/^\[  $1 *\] ([0-9]+) tests?.*/\1/p" "$2" | tail -1; }

phase_tests() {
  unpack || return
  mkdir -p "$W/tests"
  local t n log s rc passed skipped failed
  for t in .gpu/bin/test_cuda_*; do
    n=$(basename "$t"); log=$W/tests/$n.log; s=$(date +%s)
    if late; then note "tests: $n NOT RUN (deadline)"; status=1; continue; fi
    timeout "$(left)" "$t" --gtest_brief=1 > "$log" 2>&1; rc=$?
    passed=$(gtest_count PASSED "$log"); skipped=$(gtest_count SKIPPED "$log"); failed=$(gtest_count FAILED "$log")
    local counts="${passed:-0} passed, ${skipped:-0} skipped, ${failed:-0} failed, $(( $(date +%s) - s )) s"
    if [ $rc = 0 ] && grep -qE "no GPU( for the CUDA backend)?:" "$log"; then
      status=1  # the GPU tests skipped themselves: a pass here would mean nothing
      note "tests: NO GPU $n ($counts; $(grep -m1 -oE 'no GPU( for the CUDA backend)?:.*' "$log"))"
    elif [ $rc = 0 ]; then
      note "tests: PASS $n ($counts)"
    else
      status=1
      note "tests: FAIL $n (rc $rc$([ $rc = 124 ] && echo ', deadline'); $counts)"
      grep -E "^\[  FAILED  \] [A-Za-z]|Failure|error:|exception" "$log" | head -20
    fi
  done
}

phase_sanitize() {
  unpack || return
  if ! command -v compute-sanitizer > /dev/null; then
    note "sanitize: NOT RUN: compute-sanitizer is not on PATH"; status=1; return
  fi
  if late; then note "sanitize: NOT RUN (deadline)"; status=1; return; fi
  mkdir -p "$W/sanitize"
  local t n tool tools pids=() limit
  limit=$(left)
  for t in .gpu/bin/test_cuda_*; do
    n=$(basename "$t")
    tools="memcheck"; case "$n" in *attention*|*gemm*|*gemv*) tools="memcheck racecheck" ;; esac
    for tool in $tools; do
      ( timeout "$limit" compute-sanitizer --tool "$tool" --error-exitcode 9 "$t" --gtest_brief=1 \
          ${GPU_JOB_SANITIZE_FILTER:+--gtest_filter=$GPU_JOB_SANITIZE_FILTER} > "$W/sanitize/$tool-$n.log" 2>&1
        echo $? > "$W/sanitize/$tool-$n.rc" ) &
      pids+=($!)
    done
  done
  wait "${pids[@]}"
  local f rc what
  for f in "$W"/sanitize/*.rc; do
    rc=$(cat "$f"); what=$(basename "$f" .rc)
    if [ "$rc" = 0 ]; then
      note "sanitize: clean $what ($(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "${f%.rc}.log" | tail -1))"
    else
      status=1
      note "sanitize: DIRTY $what (rc $rc$([ "$rc" = 124 ] && echo ', deadline'))"
      grep -E "Error|Hazard|Invalid|at 0x|by thread|Failure" "${f%.rc}.log" | head -12
    fi
  done
}

# cuda_bench NAME ARGS...: one part of the benchmark cases, its table and JSON under $W.
run_bench() {
  unpack || return
  local name=$1; shift
  if late; then note "$name: NOT RUN (deadline)"; status=1; return; fi
  timeout "$(left)" .gpu/bin/cuda_bench "$@" ${GPU_BENCH_FILTER:+--filter "$GPU_BENCH_FILTER"} \
    --json "$W/cuda_bench-$name.json" 2>&1 | tee "$W/cuda_bench-$name.txt"
  local rc=${PIPESTATUS[0]} rows failed
  rows=$(grep -c '"area":' "$W/cuda_bench-$name.json" 2>/dev/null || true)
  failed=$(grep -c ' FAILED: ' "$W/cuda_bench-$name.txt" || true)
  if [ "$rc" = 0 ]; then
    note "$name: ok ($rows cases)"
  else
    status=1; note "$name: FAIL (rc $rc$([ "$rc" = 124 ] && echo ', deadline: the JSON is missing, the table is partial'); $rows cases, $failed failed)"
  fi
}

phase_peers() {
  local why
  if late; then note "peers: NOT RUN (deadline)"; status=1; return; fi
  if ! why=$(python3 -c 'import torch, sys; sys.exit(0) if torch.cuda.is_available() else sys.exit("PyTorch " + torch.__version__ + " sees no CUDA device")' 2>&1); then
    note "peers: NOT RUN: python3 cannot use PyTorch with CUDA ($(echo "$why" | tail -1)). Install a CUDA build of torch (pip install torch) and run the peers phase again."
    status=1; return
  fi
  PYTHONUNBUFFERED=1 timeout "$(left)" python3 tools/gpu/peers.py --json "$W/peers.json" 2>&1 | tee "$W/peers.txt"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" = 0 ]; then note "peers: ok ($(grep -c '"s":' "$W/peers.json") rows)"; else status=1; note "peers: FAIL (rc $rc)"; fi
}

for p in "${phases[@]}"; do
  echo "== $p ($(( $(date +%s) - T0 )) s) =="
  case "$p" in
    build) phase_build ;;
    tests) phase_tests ;;
    sanitize) phase_sanitize ;;
    bench) run_bench bench --area "$KERNEL_AREAS" --variants skip ;;
    variants) run_bench variants --area "$KERNEL_AREAS" --variants only ;;
    model) run_bench model --area model --variants skip ;;
    model-variants) run_bench model-variants --area model --variants only ;;
    peers) phase_peers ;;
  esac
done

if [ -f "$W/peers.json" ] && ls "$W"/cuda_bench-*.json > /dev/null 2>&1; then
  python3 tools/gpu/compare.py "$W"/cuda_bench-*.json "$W/peers.json" > "$W/compare.txt" 2>&1
  cat "$W/compare.txt"
  summary+=("" "cider against the peers (compare.txt):" "$(cat "$W/compare.txt")")
fi
exit $status
