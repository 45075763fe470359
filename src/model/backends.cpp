// The devices a build has (model/backend.h): the CPU always, the GPU in a CUDA build (model/cuda/cuda_backend.cpp
// defines make_cuda_backend and require_cuda_device there; a build without CUDA gets the errors below).
#include "core/error.h"
#include "model/backend.h"
#include "model/transformer.h"

namespace cider::model {

#ifndef CIDER_HAVE_CUDA
namespace {
[[noreturn]] void no_cuda(const char* op) {
  fail(ErrorCode::kUnsupported, op,
       "--device cuda needs a cider built with -DCIDER_CUDA=ON; this one was built without CUDA");
}
}  // namespace
void require_cuda_device(const char* op) { no_cuda(op); }
std::unique_ptr<BackendModel> make_cuda_backend(const Model::Impl&) { no_cuda("model.device"); }
#endif

void require_device(Device device) {
  if (device == Device::kCUDA) require_cuda_device("model.device");
}

std::unique_ptr<BackendModel> make_backend(const Model::Impl& model) {
  require_device(model.options.device);
  return model.options.device == Device::kCUDA ? make_cuda_backend(model) : make_cpu_backend(model);
}

}  // namespace cider::model
