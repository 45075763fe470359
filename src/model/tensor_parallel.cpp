// Tensor-parallel shares of a model (model/tensor_parallel.h).
#include "model/tensor_parallel.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "model/arch/arch.h"
#include "quant/ggml_blocks.h"

namespace cider::model {

namespace {

constexpr const char* kOp = "tensor_parallel";

size_t sz(int64_t n) { return static_cast<size_t>(n); }

// Bytes of one row of L's weights over k inputs, and the inputs per indivisible unit of a row (1 for dense and
// int8, 2 for int4's byte pairs, the block size for GGUF blocks).
struct RowLayout {
  int64_t unit = 1;        // inputs per unit
  int64_t unit_bytes = 0;  // bytes per unit
};

RowLayout row_layout(const Linear& L) {
  switch (L.kind) {
    case WeightKind::kDense: return {1, static_cast<int64_t>(dtype_size(L.w_dtype))};
    case WeightKind::kInt8: return {1, 1};
    case WeightKind::kInt4: return {2, 1};
    case WeightKind::kGgml: {
      const quant::GgmlBlockFormat* f = quant::ggml_block_format(L.ggml_type);
      check(f != nullptr, ErrorCode::kInternal, kOp, L.name, ": unknown GGUF block type ", L.ggml_type);
      return {f->block_size, f->block_bytes};
    }
  }
  return {};
}

bool has_scales(const Linear& L) { return L.kind == WeightKind::kInt8 || L.kind == WeightKind::kInt4; }

}  // namespace

std::pair<int64_t, int64_t> tp_range(int64_t n, int rank, int size) {
  const int64_t base = n / size, extra = n % size;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

void check_tensor_parallel(const ModelConfig& c, WeightFormat weights, int size) {
  check(size >= 1 && size <= kMaxTensorParallel, ErrorCode::kInvalidArgument, kOp, "--tp must be in [1, ",
        kMaxTensorParallel, "]; got ", size);
  if (size == 1) return;
  auto divisible = [&](const char* what, int64_t n) {
    check(n % size == 0, ErrorCode::kUnsupported, kOp, "--tp ", size, " splits the ", what,
          " evenly over the ranks: it must be a multiple of ", size, "; this model has ", n);
  };
  divisible("KV heads (whole GQA groups per rank)", c.num_kv_heads);
  divisible("query heads", c.num_heads);
  if (c.intermediate_size > 0) divisible("MLP intermediate size", c.intermediate_size);
  if (c.num_experts > 0) divisible("experts' intermediate size", c.expert_intermediate_size);
  if (c.shared_expert_intermediate_size > 0)
    divisible("shared expert's intermediate size", c.shared_expert_intermediate_size);
  check(!c.has_linear_layers(), ErrorCode::kUnsupported, kOp, "--tp does not split ", arch_spec(c.arch).name,
        "'s linear-attention (gated DeltaNet) layers yet; use --tp 1");
  check(!c.qk_norm_full, ErrorCode::kUnsupported, kOp, arch_spec(c.arch).name,
        "'s q/k norms span every head (their statistics cross the ranks): --tp must be 1");
  const WeightFormatInfo& info = weight_format_info(weights);
  const int64_t unit = info.kind == WeightKind::kGgml ? 256 : info.group_size;
  if (unit > 0) {
    const char* what = info.kind == WeightKind::kGgml ? " a whole number of GGUF blocks (256)" : " a whole number of groups";
    const int64_t o_share = c.num_heads * c.head_dim / size;
    check(o_share % unit == 0, ErrorCode::kUnsupported, kOp, "--tp ", size, " with --weights ", info.name,
          ": each rank's share of o_proj's inputs (", o_share, ") must be", what, " of ", unit);
    for (int64_t I : {c.intermediate_size, c.expert_intermediate_size, c.shared_expert_intermediate_size})
      check(I == 0 || (I / size) % unit == 0, ErrorCode::kUnsupported, kOp, "--tp ", size, " with --weights ",
            info.name, ": each rank's share of down_proj's inputs (", I / size, ") must be", what, " of ", unit);
  }
}

ModelConfig tp_shard_config(const ModelConfig& c, int size) {
  ModelConfig s = c;
  s.num_heads = c.num_heads / size;
  s.num_kv_heads = c.num_kv_heads / size;
  s.intermediate_size = c.intermediate_size / size;
  s.expert_intermediate_size = c.expert_intermediate_size / size;
  s.shared_expert_intermediate_size = c.shared_expert_intermediate_size / size;
  return s;
}

LinearShare share_rows(const Linear& L, int64_t r0, int64_t r1) {
  check(0 <= r0 && r0 <= r1 && r1 <= L.N, ErrorCode::kInvalidArgument, kOp, L.name, ": rows [", r0, ", ", r1,
        ") must lie within its ", L.N, " rows");
  LinearShare s;
  s.linear = L;
  if (r0 == 0 && r1 == L.N) return s;  // the whole layer (one rank): nothing to copy
  s.linear.N = r1 - r0;
  const RowLayout rl = row_layout(L);
  const int64_t row_bytes = L.K / rl.unit * rl.unit_bytes;
  s.linear.w = static_cast<const uint8_t*>(L.w) + r0 * row_bytes;
  if (L.bias != nullptr) s.linear.bias = L.bias + r0;
  if (has_scales(L)) {
    if (L.group_size == 0) {
      s.linear.scales = L.scales + r0;
    } else {  // [K/gs, N]: columns r0 … r1 of every group row
      const int64_t groups = L.K / L.group_size, n = r1 - r0;
      s.scales.resize(sz(groups * n));
      for (int64_t g = 0; g < groups && n > 0; ++g)  // (an empty share copies nothing: no null memcpy)
        std::memcpy(s.scales.data() + g * n, L.scales + g * L.N + r0, sz(n) * sizeof(float));
      s.linear.scales = s.scales.data();
    }
  }
  return s;
}

LinearShare share_cols(const Linear& L, int64_t k0, int64_t k1, bool with_bias) {
  check(0 <= k0 && k0 < k1 && k1 <= L.K, ErrorCode::kInvalidArgument, kOp, L.name, ": columns [", k0, ", ", k1,
        ") must be a non-empty range within its ", L.K, " inputs");
  const RowLayout rl = row_layout(L);
  const int64_t unit = has_scales(L) && L.group_size > 0 ? std::max<int64_t>(rl.unit, L.group_size) : rl.unit;
  check(k0 % unit == 0 && k1 % unit == 0, ErrorCode::kInvalidArgument, kOp, L.name, ": columns [", k0, ", ", k1,
        ") must start and end on a multiple of ", unit, " (its weights' ",
        L.kind == WeightKind::kGgml ? "block" : (has_scales(L) && L.group_size > 0 ? "group" : "byte"), " size)");
  LinearShare s;
  s.linear = L;
  if (!with_bias) s.linear.bias = nullptr;
  if (k0 == 0 && k1 == L.K) return s;  // the whole layer (one rank)
  s.linear.K = k1 - k0;
  const int64_t row_bytes = L.K / rl.unit * rl.unit_bytes, share_bytes = (k1 - k0) / rl.unit * rl.unit_bytes,
                at = k0 / rl.unit * rl.unit_bytes;
  s.w.resize(sz(L.N * share_bytes));
  const auto* src = static_cast<const uint8_t*>(L.w);
  for (int64_t n = 0; n < L.N; ++n)
    std::memcpy(s.w.data() + n * share_bytes, src + n * row_bytes + at, sz(share_bytes));
  s.linear.w = s.w.data();
  s.linear.bias = with_bias ? L.bias : nullptr;
  if (has_scales(L) && L.group_size > 0) s.linear.scales = L.scales + (k0 / L.group_size) * L.N;  // group rows
  return s;
}

LinearShare share_rows_of_parts(const Linear& L, int64_t part_rows, int64_t r0, int64_t r1) {
  check(part_rows > 0 && L.N % part_rows == 0 && 0 <= r0 && r0 <= r1 && r1 <= part_rows, ErrorCode::kInvalidArgument,
        kOp, L.name, ": rows [", r0, ", ", r1, ") of each part of ", part_rows, " rows must lie within a part of its ",
        L.N, " rows");
  const int64_t parts = L.N / part_rows, n = r1 - r0;
  if (parts == 1) return share_rows(L, r0, r1);
  LinearShare s;
  s.linear = L;
  s.linear.N = parts * n;
  const RowLayout rl = row_layout(L);
  const int64_t row_bytes = L.K / rl.unit * rl.unit_bytes;
  const auto* src = static_cast<const uint8_t*>(L.w);
  s.w.resize(sz(parts * n * row_bytes));
  std::vector<int64_t> rows;  // the source rows, in order
  for (int64_t p = 0; p < parts; ++p)
    for (int64_t r = r0; r < r1; ++r) rows.push_back(p * part_rows + r);
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(s.w.data() + sz(static_cast<int64_t>(i) * row_bytes), src + rows[i] * row_bytes, sz(row_bytes));
  s.linear.w = s.w.data();
  // Biases and scales follow the rows: kept in `scales` (bias first, then the scales).
  const int64_t N = s.linear.N;
  const bool bias = L.bias != nullptr, scaled = has_scales(L);
  const int64_t groups = scaled ? (L.group_size == 0 ? 1 : L.K / L.group_size) : 0;
  s.scales.resize(sz((bias ? N : 0) + groups * N));
  float* b = s.scales.data();
  float* sc = b + (bias ? N : 0);
  for (int64_t i = 0; i < N; ++i) {
    if (bias) b[i] = L.bias[rows[sz(i)]];
    for (int64_t g = 0; g < groups; ++g) sc[g * N + i] = L.scales[g * L.N + rows[sz(i)]];
  }
  s.linear.bias = bias ? b : nullptr;
  if (scaled) s.linear.scales = sc;
  return s;
}

}  // namespace cider::model
