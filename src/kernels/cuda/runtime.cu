// cider/kernels/cuda/runtime.cu — device discovery, device memory and streams (cuda_api.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.cuh"

namespace cider::cuda {

namespace {
struct Probe {
  bool ok = false;
  std::string why;
  DeviceInfo info;
};
const Probe& probe() {
  static Probe p;
  static std::once_flag once;
  std::call_once(once, [] {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      p.why = std::string("no usable CUDA driver (") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e) + ")";
      cudaGetLastError();
      return;
    }
    if (n == 0) {
      p.why = "no CUDA device";
      return;
    }
    cudaDeviceProp prop{};
    e = cudaGetDeviceProperties(&prop, 0);
    if (e != cudaSuccess) {
      p.why = std::string("cudaGetDeviceProperties failed: ") + cudaGetErrorString(e);
      cudaGetLastError();
      return;
    }
    p.info.name = prop.name;
    p.info.cc_major = prop.major;
    p.info.cc_minor = prop.minor;
    p.info.sm_count = prop.multiProcessorCount;
    p.info.total_memory = prop.totalGlobalMem;
    p.info.l2_bytes = prop.l2CacheSize;
    p.info.max_shared_per_block_optin = static_cast<int>(prop.sharedMemPerBlockOptin);
    if (prop.major != 9) {
      p.why = std::string(prop.name) + " has compute capability " + std::to_string(prop.major) + "." +
              std::to_string(prop.minor) + "; cider's kernels are built for sm_90a (Hopper) only";
      return;
    }
    p.ok = true;
  });
  return p;
}
}  // namespace

bool device_available(std::string* why) {
  const Probe& p = probe();
  if (!p.ok && why) *why = p.why;
  return p.ok;
}

void require_device(const char* op) {
  const Probe& p = probe();
  check(p.ok, ErrorCode::kUnsupported, op, "needs an NVIDIA GPU of compute capability 9.0 (sm_90a); ", p.why);
}

const DeviceInfo& device_info() {
  require_device("cuda.device_info");
  return probe().info;
}

void allow_dynamic_smem(const void* kernel, size_t bytes, const char* op) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, size_t> limits;  // (device, kernel) -> the limit set
  int dev = 0;
  CIDER_CUDA_CHECK(op, cudaGetDevice(&dev));
  size_t limit = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = limits.find({dev, kernel});
    if (it == limits.end()) {
      cudaFuncAttributes attr{};
      CIDER_CUDA_CHECK(op, cudaFuncGetAttributes(&attr, kernel));
      int optin = 0;
      CIDER_CUDA_CHECK(op, cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
      const int most = std::max(0, optin - static_cast<int>(attr.sharedSizeBytes));
      CIDER_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
      it = limits.emplace(std::make_pair(dev, kernel), static_cast<size_t>(most)).first;
    }
    limit = it->second;
  }
  check(bytes <= limit, ErrorCode::kUnsupported, op, "needs ", bytes, " bytes of dynamic shared memory per block; GPU ",
        dev, " allows ", limit, " beside this kernel's static shared memory");
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  CIDER_CUDA_CHECK("cuda.DeviceBuffer", cudaMalloc(&ptr_, bytes));
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) {
  check(offset <= bytes_ && bytes <= bytes_ - offset, ErrorCode::kOutOfRange, "cuda.DeviceBuffer.upload",
        "offset + bytes must be <= the allocation (", bytes_, "); got ", offset, " + ", bytes);
  if (bytes == 0) return;
  CIDER_CUDA_CHECK("cuda.DeviceBuffer.upload",
                   cudaMemcpy(static_cast<char*>(ptr_) + offset, host, bytes, cudaMemcpyHostToDevice));
  // From pageable memory cudaMemcpy may return once the bytes are staged, before the DMA into device memory is done,
  // and our kernels run on non-blocking streams that do not wait for the legacy stream: wait here (measured: a
  // kernel launched right after a 1 MiB upload read the last chunk's old bytes).
  CIDER_CUDA_CHECK("cuda.DeviceBuffer.upload", cudaStreamSynchronize(nullptr));
}

void DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  check(offset <= bytes_ && bytes <= bytes_ - offset, ErrorCode::kOutOfRange, "cuda.DeviceBuffer.download",
        "offset + bytes must be <= the allocation (", bytes_, "); got ", offset, " + ", bytes);
  if (bytes == 0) return;
  CIDER_CUDA_CHECK("cuda.DeviceBuffer.download",
                   cudaMemcpy(host, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost));
}

void DeviceBuffer::fill(uint8_t byte) {
  if (bytes_ == 0) return;
  CIDER_CUDA_CHECK("cuda.DeviceBuffer.fill", cudaMemset(ptr_, byte, bytes_));
  // cudaMemset is asynchronous with respect to the host and the non-blocking streams: complete it before returning.
  CIDER_CUDA_CHECK("cuda.DeviceBuffer.fill", cudaStreamSynchronize(nullptr));
}

DeviceBuffer to_device(const void* host, size_t bytes) {
  DeviceBuffer b(bytes);
  b.upload(host, bytes);
  return b;
}

Stream::Stream() {
  cudaStream_t s = nullptr;
  CIDER_CUDA_CHECK("cuda.Stream", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  s_ = s;
}

Stream::~Stream() {
  if (s_) cudaStreamDestroy(static_cast<cudaStream_t>(s_));
}

void Stream::synchronize() const {
  CIDER_CUDA_CHECK("cuda.Stream.synchronize", cudaStreamSynchronize(static_cast<cudaStream_t>(s_)));
}

void check_last_launch(const char* op) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) detail::fail_cuda(op, "kernel launch", e);
}

void device_synchronize(const char* op) { CIDER_CUDA_CHECK(op, cudaDeviceSynchronize()); }

}  // namespace cider::cuda
