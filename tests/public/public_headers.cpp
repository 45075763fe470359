// The public headers compiled with include/ as the only include root (CMake target cider_public_headers): a public
// header that includes anything from src/ fails to build here.
#include "cider/cider.h"
#include "cider/cider.hpp"
#include "cider/dtype.hpp"
#include "cider/error.hpp"

namespace {
[[maybe_unused]] const char* probe() { return cider_version(); }
}  // namespace
