#!/usr/bin/env bash
# GPU job 9 (2026-11-30, session 2, the last device minutes): compute-sanitizer on the 12 long test cases that did not
# finish in job 5 (300 s each with 24 processes at once), now 12 at once for at most LIMIT seconds each.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
LIMIT=${LIMIT:-200}
for spec in "memcheck test_cuda_model CudaModel.GemmaLikeVariantMatchesCpu" "memcheck test_cuda_model CudaModel.GraphReplayEqualsDirectLaunches" \
  "memcheck test_cuda_model CudaModel.PdlOnAndOffGiveTheSameLogits" "memcheck test_cuda_model CudaModel.PrefillThenDecodeEqualsAllAtOnce" \
  "memcheck test_cuda_model CudaModel.QuantizedLogitsMatchCpu" "racecheck test_cuda_gemv CudaGemv.EveryModeWithoutEpiloguePrefetch" \
  "racecheck test_cuda_model CudaModel.GemmaLikeVariantMatchesCpu" "racecheck test_cuda_model CudaModel.GraphReplayEqualsDirectLaunches" \
  "racecheck test_cuda_model CudaModel.PdlOnAndOffGiveTheSameLogits" "racecheck test_cuda_model CudaModel.QuantizedLogitsMatchCpu" \
  "racecheck test_cuda_model CudaModel.TrimAndKvBytes" "racecheck test_cuda_ops CudaOps.ArgmaxMatchesCpuWithTiesNaNAndInfinities"; do
  set -- $spec
  ( timeout $LIMIT compute-sanitizer --tool $1 --error-exitcode 9 $B/$2 --gtest_filter="$3" --gtest_brief=1 > /tmp/s_$1_$3.log 2>&1
    echo "$1 $2 $3 rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/s_$1_$3.log | tail -1 | sed 's/=* //') $(grep -E '^\[  (PASSED|FAILED) ' /tmp/s_$1_$3.log | tr '\n' ' ')" > /tmp/s_$1_$3.rc ) &
done
wait
cat /tmp/s_*.rc | sort | tee "$OUT/sanitize_summary.txt"
for f in /tmp/s_*.log; do grep -qE "ERROR SUMMARY: [1-9]|RACECHECK SUMMARY: [1-9]" "$f" && { echo "---- $f"; grep -E "Error|Hazard|Invalid|at 0x" "$f" | head -12; }; done
