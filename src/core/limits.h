// cider/core/limits.h — the resource limits on everything that comes from a file, a command line or the C API, in
// one place (docs/engine.md, "Resource limits", says why each is what it is), and checked size arithmetic.
//
// Rule: a size read from input is checked against its limit BEFORE anything is allocated or multiplied with it, and
// every product of such sizes goes through checked_mul / checked_add (never a wrap past a later check).
#pragma once

#include <cstdint>
#include <limits>

#include "core/error.h"

namespace cider::limits {

// One model dimension (hidden, intermediate, vocabulary, heads × head_dim): 2^24. The kernels index rows and
// columns with int32 and multiply two dimensions in int64; 2^24 is 64× the largest vocabulary in use (Gemma's
// 262 144) and 300× the largest hidden size (Llama 3.1 405B's 53 248 intermediate size).
constexpr int64_t kMaxDim = int64_t{1} << 24;
// Transformer layers: 1024 (the largest released models have 126–128). Per-layer state is allocated from it.
constexpr int64_t kMaxLayers = 1024;
// Experts of a mixture-of-experts layer (the largest released models have 256–512).
constexpr int64_t kMaxExperts = 4096;
// Attention heads per layer (query or key/value): 4096; head dimension: 4096 (real models: 64–256).
constexpr int64_t kMaxHeads = 4096;
constexpr int64_t kMaxHeadDim = 4096;
// Token ids of a tokenizer (model vocabulary and added tokens): below 2^24, so a corrupt id cannot make the id table
// larger than ~0.6 GB.
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;
// JSON nesting (config.json, tokenizer.json, safetensors headers, index files): 128 levels. Real files nest < 10
// deep (tokenizer.json's normalizer sequences: 4); the parsers' recursive walks and error messages stay far from the
// stack limit.
constexpr int kMaxJsonDepth = 128;
// Text read from a file or stdin (perplexity -f, config.json, tokenizer.json, index files): 256 MiB. The largest
// real tokenizer.json files are ~35 MB; a perplexity text of 256 MiB is ~60M tokens, days of CPU time.
constexpr int64_t kMaxTextBytes = int64_t{1} << 28;
// Worker threads: at most 4 × the CPUs this process may run on, and never above 1024 (the pool spins; more threads
// than cores only slow every kernel down).
constexpr int kMaxThreadsAbsolute = 1024;
constexpr int kThreadsPerCpu = 4;

}  // namespace cider::limits

namespace cider {

// a * b for non-negative int64 sizes; Error(kOutOfRange) naming `op` and `what` when the product passes 2^63 - 1.
inline int64_t checked_mul(int64_t a, int64_t b, const char* op, const char* what) {
  check(a >= 0 && b >= 0, ErrorCode::kOutOfRange, op, what, " must be computed from non-negative sizes; got ", a,
        " and ", b);
  int64_t r = 0;
  check(!__builtin_mul_overflow(a, b, &r), ErrorCode::kOutOfRange, op, what, " = ", a, " × ", b,
        " overflows 64-bit arithmetic");
  return r;
}

inline int64_t checked_add(int64_t a, int64_t b, const char* op, const char* what) {
  int64_t r = 0;
  check(!__builtin_add_overflow(a, b, &r), ErrorCode::kOutOfRange, op, what, " = ", a, " + ", b,
        " overflows 64-bit arithmetic");
  return r;
}

// The deepest nesting of arrays and objects in a JSON text (strings and escapes skipped; a text that is not JSON
// still gets a number, the parser reports the error). Linear, no recursion.
int json_nesting_depth(const char* begin, const char* end, int stop_above);

// Error(kCorrupt) "[op] <source> must nest JSON at most 128 levels deep; got more" when the text nests deeper than
// limits::kMaxJsonDepth. Call before parsing any JSON that comes from input.
void check_json_nesting(const char* begin, const char* end, const char* op, const std::string& source);

}  // namespace cider
