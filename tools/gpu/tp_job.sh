#!/usr/bin/env bash
# On a GPU host (device tool, carry [".gpu"] after tools/gpu/pack.sh): the CUDA hybrid, tensor-parallel and MoE tests, a
# memcheck of the gated-delta kernels, and `cuda_bench --area tp`; JSON results under $OUT. NCCL is taken from the
# host's PyPI nvidia-nccl wheel (beside PyTorch) when the library path lacks it. NVLink multicast stays off.
set +e
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/tp_job}; mkdir -p "$OUT"
tar -C .gpu -xJf .gpu/pack.tar.xz
NCCL_DIR=$(python3 -c "import nvidia.nccl,os;print(os.path.join(list(nvidia.nccl.__path__)[0],'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/.gpu/lib:$NCCL_DIR
export NCCL_NVLS_ENABLE=0
cat .gpu/REVISION; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
.gpu/bin/test_cuda_gated_delta 2>&1 | tail -4
.gpu/bin/test_cuda_ops --gtest_filter='*DenseBf16*:*Prepare*' 2>&1 | tail -3
timeout 240 .gpu/bin/test_cuda_model --gtest_filter='CudaFamilies.*:CudaHybrid.*' --gtest_output=json:$OUT/hybrid.json 2>&1 \
  | grep -v '^\[ RUN\|^\[       OK' | tail -30
timeout 200 .gpu/bin/test_cuda_tp --gtest_output=json:$OUT/tp.json 2>&1 | grep -v '^\[ RUN' | tail -40
timeout 120 .gpu/bin/test_cuda_moe --gtest_output=json:$OUT/moe.json 2>&1 | grep -v '^\[ RUN' | tail -30
timeout 200 .gpu/bin/test_cuda_model --gtest_filter='-CudaFamilies.*:CudaHybrid.*' --gtest_output=json:$OUT/model.json 2>&1 \
  | grep -v '^\[ RUN\|^\[       OK' | tail -12
timeout 60 compute-sanitizer --tool memcheck .gpu/bin/test_cuda_gated_delta 2>&1 | tail -3
timeout 150 .gpu/bin/cuda_bench --area tp --filter llama3-8b --json $OUT/tp_bench.json 2>&1 | tail -24
