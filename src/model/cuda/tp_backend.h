// cider/model/cuda/tp_backend.h — the tensor-parallel CUDA backend (`--tp N`, model/tensor_parallel.h): one rank per
// device, each a GpuModel share and GpuSession driven by a thread of its own (the device current there), all running
// the one forward at once and meeting in the all-reduces of their Collective; the host puts the ranks' vocabulary
// slices of the logits side by side.
//
// Plain C++ (no CUDA headers). Built only with -DCIDER_CUDA=ON.
#pragma once

#include <memory>
#include <vector>

#include "model/backend.h"
#include "model/cuda/collective.h"

namespace cider::model::gpu {

// Rank i on devices[i] with comms[i] (comms[i]->rank() == i, size() == devices.size()). make_cuda_backend uses it
// with devices 0 … tp − 1 and NCCL; the tests also with several ranks on one device and a host-staged Collective.
std::unique_ptr<BackendModel> make_tp_backend(const Model::Impl& model, std::vector<int> devices,
                                              std::vector<std::shared_ptr<Collective>> comms);

// The rank sessions behind a session of a tensor-parallel model (tests: graphs on/off); empty for another session.
class GpuSession;
std::vector<GpuSession*> tp_rank_sessions(BackendSession& s);

}  // namespace cider::model::gpu
