// cider/model/cuda/collective.h — the all-reduce between tensor-parallel ranks (model/tensor_parallel.h), behind one
// interface: NCCL in the product (nccl_collectives; cider writes no collective of its own), a host-staged stand-in in
// the tests that run several ranks on one GPU (NCCL refuses two ranks on one device).
//
// Plain C++ (no CUDA or NCCL headers). Built only with -DCIDER_CUDA=ON.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace cider::model::gpu {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // buf (count float32 in this rank's device memory) ← the sum of every rank's buf, in place, enqueued on `stream`
  // (cudaStream_t of this rank's device). Every rank calls it with the same count, in the same order.
  virtual void all_reduce_sum(float* buf, int64_t count, void* stream) = 0;
  // Whether a CUDA graph can hold all_reduce_sum (NCCL's can): else the sessions decode without graphs.
  virtual bool graph_capturable() const = 0;
};

// One NCCL communicator per device of `devices` (rank i on devices[i]), made together (ncclCommInitAll) for one
// process that drives every rank from its own thread. NCCL is loaded at run time (libnccl.so.2 from the library
// path, or $CIDER_NCCL_LIBRARY): a cider without it runs everything but --tp > 1, which fails with cider::Error
// (kUnsupported) naming the library. NCCL's errors become cider::Error (kInternal) naming the call and NCCL's message.
std::vector<std::shared_ptr<Collective>> nccl_collectives(std::span<const int> devices);

// The NCCL version loaded ("2.28.9"), loading it if needed; cider::Error (kUnsupported) when it cannot be.
std::string nccl_version();

}  // namespace cider::model::gpu
