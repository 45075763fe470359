#!/usr/bin/env bash
# GPU job 17 (2026-11-30, session 3): why compute-sanitizer racecheck ended with an error and no test output on the
# bf16 model tests in session 2 (job 5): one case, its whole sanitizer log kept.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -d .gpu/bin ] || tar -C .gpu -xJf .gpu/bin.tar.xz
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
$SAN --version | tail -1
T0=$(date +%s)
timeout 200 $SAN --tool racecheck --print-limit 20 .gpu/bin/test_cuda_model --gtest_brief=1 \
  --gtest_filter='CudaModel.Bf16LogitsMatchCpu' > "$OUT/racecheck_bf16_logits.log" 2>&1
echo "rc=$? after $(( $(date +%s) - T0 )) s"
grep -vE "^\s*$" "$OUT/racecheck_bf16_logits.log" | head -40
echo "..."; tail -15 "$OUT/racecheck_bf16_logits.log"
