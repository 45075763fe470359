// Shared plumbing of the C API: exception-to-status translation and cider_tensor -> TensorView conversion.
#pragma once

#include <new>
#include <string>

#include "cider/cider.h"
#include "core/error.h"
#include "core/tensor.h"

namespace cider::capi {

void set_last_error(const std::string& message);
void clear_last_error();

// Runs f(); turns any exception into a status and the thread's last-error message. Never lets one escape to C.
template <typename F>
cider_status guarded(F&& f) {
  try {
    clear_last_error();
    f();
    return CIDER_OK;
  } catch (const Error& e) {
    set_last_error(e.what());
    return static_cast<cider_status>(static_cast<int>(e.code()));
  } catch (const std::bad_alloc&) {
    set_last_error("[cider] out of memory");
    return CIDER_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error(std::string("[cider] internal error: ") + e.what());
    return CIDER_ERR_INTERNAL;
  } catch (...) {
    set_last_error("[cider] internal error: unknown exception");
    return CIDER_ERR_INTERNAL;
  }
}

// Validates a C tensor descriptor (non-null, rank 0..8, known dtype, non-negative dims) and views it.
TensorView to_view(const cider_tensor* t, const char* op, const char* what);
// Same, for an input: float tensors must hold finite values (NaN and ±inf are Error(kInvalidArgument) naming the
// index), -inf allowed where `allow_neg_inf` (additive masks).
TensorView to_input_view(const cider_tensor* t, const char* op, const char* what, bool allow_neg_inf = false);
// Same, but a null descriptor gives an empty view (data == nullptr, rank 0) for optional arguments.
TensorView to_optional_view(const cider_tensor* t, const char* op, const char* what);
// Checks an output handle pointer.
void check_out_ptr(const void* p, const char* op, const char* what);

}  // namespace cider::capi
