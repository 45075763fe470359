// NCCL behind model/cuda/collective.h, loaded at run time (dlopen) so that a CUDA build of cider needs NCCL only
// where --tp > 1 is asked for. The declarations come from NCCL's own header (the CUDA toolkit's include/nccl.h).
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "core/error.h"
#include "model/cuda/collective.h"

#if __has_include(<nccl.h>)
#include <nccl.h>
#define CIDER_NCCL_HEADER 1
#endif

namespace cider::model::gpu {

namespace {

constexpr const char* kOp = "tensor_parallel.nccl";

#ifdef CIDER_NCCL_HEADER

struct NcclApi {
  decltype(&::ncclGetVersion) get_version = nullptr;
  decltype(&::ncclCommInitAll) comm_init_all = nullptr;
  decltype(&::ncclCommDestroy) comm_destroy = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclGetErrorString) error_string = nullptr;
  std::string error;  // why it could not be loaded
};

const NcclApi& api() {
  static NcclApi a;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("CIDER_NCCL_LIBRARY");
    const std::string name = env && *env ? env : "libnccl.so.2";
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* why = dlerror();
      a.error = "cannot load " + name + " (" + (why ? why : "unknown") +
                "): install NCCL (the CUDA toolkit's, Debian's libnccl2 or PyPI's nvidia-nccl-cu13) and put it on the "
                "library path, or name the file in $CIDER_NCCL_LIBRARY";
      return;
    }
    auto sym = [&](const char* s) {
      void* p = dlsym(h, s);
      if (p == nullptr && a.error.empty()) a.error = name + " lacks " + s;
      return p;
    };
    a.get_version = reinterpret_cast<decltype(a.get_version)>(sym("ncclGetVersion"));
    a.comm_init_all = reinterpret_cast<decltype(a.comm_init_all)>(sym("ncclCommInitAll"));
    a.comm_destroy = reinterpret_cast<decltype(a.comm_destroy)>(sym("ncclCommDestroy"));
    a.all_reduce = reinterpret_cast<decltype(a.all_reduce)>(sym("ncclAllReduce"));
    a.error_string = reinterpret_cast<decltype(a.error_string)>(sym("ncclGetErrorString"));
  });
  check(a.error.empty(), ErrorCode::kUnsupported, kOp, "--tp > 1 needs NCCL: ", a.error);
  return a;
}

void nccl_check(ncclResult_t r, const char* call) {
  if (r == ncclSuccess) return;
  fail(ErrorCode::kInternal, kOp, call, " failed: ", api().error_string(r), " (NCCL error ", static_cast<int>(r), ")");
}

class NcclCollective final : public Collective {
 public:
  NcclCollective(ncclComm_t comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  ~NcclCollective() override { api().comm_destroy(comm_); }
  NcclCollective(const NcclCollective&) = delete;
  NcclCollective& operator=(const NcclCollective&) = delete;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(float* buf, int64_t count, void* stream) override {
    nccl_check(api().all_reduce(buf, buf, static_cast<size_t>(count), ncclFloat32, ncclSum, comm_,
                                static_cast<cudaStream_t>(stream)),
               "ncclAllReduce");
  }
  bool graph_capturable() const override { return true; }

 private:
  ncclComm_t comm_;
  int rank_, size_;
};

#endif  // CIDER_NCCL_HEADER

}  // namespace

std::vector<std::shared_ptr<Collective>> nccl_collectives(std::span<const int> devices) {
  check(!devices.empty(), ErrorCode::kInvalidArgument, kOp, "a communicator needs at least one device");
#ifdef CIDER_NCCL_HEADER
  const NcclApi& a = api();
  const int n = static_cast<int>(devices.size());
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  nccl_check(a.comm_init_all(comms.data(), n, devices.data()), "ncclCommInitAll");
  std::vector<std::shared_ptr<Collective>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_shared<NcclCollective>(comms[static_cast<size_t>(r)], r, n));
  return out;
#else
  fail(ErrorCode::kUnsupported, kOp, "--tp > 1 needs NCCL, and this cider was built without NCCL's header (nccl.h)");
#endif
}

std::string nccl_version() {
#ifdef CIDER_NCCL_HEADER
  int v = 0;
  nccl_check(api().get_version(&v), "ncclGetVersion");
  // NCCL_VERSION(X, Y, Z) = X·10000 + Y·100 + Z since 2.9
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
#else
  fail(ErrorCode::kUnsupported, kOp, "this cider was built without NCCL's header (nccl.h)");
#endif
}

}  // namespace cider::model::gpu
