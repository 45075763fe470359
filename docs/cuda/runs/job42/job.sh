#!/usr/bin/env bash
# GPU job 42 (2026-11-30, session 6): compute-sanitizer memcheck over every test of test_cuda_model — the whole
# program under one sanitizer did not finish within a job's limit before (sessions 3–4), so each test runs in its own
# memcheck process, all at once on the one GPU. (Carry .gpu, packed from 13195d2.)
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
[ -d .gpu/bin ] || tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
tests=$($B/test_cuda_model --gtest_list_tests | awk '/^[^ ]/{s=$1} /^  /{print s $1}')
echo "$(echo "$tests" | wc -l) tests"
for t in $tests; do
  ( timeout 450 $SAN --tool memcheck --leak-check no $B/test_cuda_model --gtest_brief=1 --gtest_filter="$t" > "$OUT/mc_$t.log" 2>&1
    echo "$t rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/mc_$t.log" | tr '\n' ' ') $(( $(date +%s) - T0 ))s" > "/tmp/mc_$t.rc" ) &
done
wait
cat /tmp/mc_*.rc
(cd "$OUT" && tar -czf logs.tgz mc_*.log && rm -f mc_*.log)
echo "total $(( $(date +%s) - T0 )) s"
