#!/usr/bin/env bash
# GPU job 62 (2026-11-30, session 8 review): the tensor-core attention kernels' parameter blocks now derive from one
# TcCallParams (attention_tc.h). Decode kernels' SASS is identical; the prefill kernels' parameter offsets moved
# (qblocks after the shared fields), so: the prefill and decode attention tests, and the two L4096 prefill rows
# beside job 49's figures (651 / 1233 µs). Carry .gpu62 (bin: test_cuda_attention, cuda_bench).
set -u
cd "$(dirname "$0")/../../../.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
[ -d .gpu62/bin ] || tar -C .gpu62 -xJf .gpu62/bin.tar.xz
B=.gpu62/bin
timeout 150 $B/test_cuda_attention --gtest_brief=1 --gtest_filter='CudaAttention.*Prefill*:CudaAttention.TensorCoreDecodePath' 2>&1 | grep -E '^\[  (PASSED|FAILED)|Failure' | head
for c in "K4V3 B1 Hq32 Hkv8 D128 L4096" "K4V3 B1 Hq32 Hkv8 D128 L4096 v:exact"; do
  timeout 30 $B/cuda_bench --filter "=attention prefill $c" 2>&1 | grep -E '^attention' | cut -c1-100
done
echo "total $(( $(date +%s) - T0 )) s"
