// C API: the KV cache (quantized IsoQuant or plain), snapshots, and attention over a cache.
#include <cmath>
#include <memory>

#include "capi/capi_internal.h"
#include "nn/attention.h"
#include "nn/kv_cache.h"

struct cider_kv_cache {
  std::unique_ptr<cider::nn::KVCache> cache;
};

struct cider_kv_snapshot {
  cider::nn::KVCacheSnapshot snapshot;
};

namespace {

using cider::DType;
using cider::ErrorCode;
using cider::TensorView;
using cider::capi::guarded;
using cider::capi::to_view;

DType float_dtype(int v, const char* op, const char* what) {
  cider::check(v == CIDER_F32 || v == CIDER_F16 || v == CIDER_BF16, ErrorCode::kInvalidArgument, op, what,
               " must be CIDER_F32 (0), CIDER_F16 (1) or CIDER_BF16 (2); got ", v);
  return static_cast<DType>(v);
}

cider::nn::RotationKind rotation_kind(int v, const char* op) {
  cider::check(v >= CIDER_ROTATION_NONE && v <= CIDER_ROTATION_HADAMARD, ErrorCode::kInvalidArgument, op,
               "rotation must be CIDER_ROTATION_NONE (0), _SO4_FAST (1), _SO4_FULL (2) or _HADAMARD (3); got ", v);
  return static_cast<cider::nn::RotationKind>(v);
}

void check_cache(const cider_kv_cache* cache, const char* op) {
  cider::check(cache != nullptr && cache->cache != nullptr, ErrorCode::kInvalidArgument, op,
               "cache must not be NULL");
}

}  // namespace

extern "C" {

cider_kv_config cider_kv_config_default(void) {
  cider_kv_config c{};
  c.quantized = 1;
  c.k_bits = 8;
  c.v_bits = 4;
  c.group_size = 64;
  c.rotation = CIDER_ROTATION_HADAMARD;
  c.seed = 0;
  c.scale_dtype = CIDER_F16;
  c.plain_dtype = CIDER_F16;
  return c;
}

cider_status cider_kv_cache_create(const cider_kv_config* config, cider_kv_cache** out) {
  return guarded([&] {
    const char* op = "cider_kv_cache_create";
    cider::capi::check_out_ptr(out, op, "out");
    cider::check(config != nullptr, ErrorCode::kInvalidArgument, op, "config must not be NULL");
    auto handle = std::make_unique<cider_kv_cache>();
    cider::check(config->quantized == 0 || config->quantized == 1, ErrorCode::kInvalidArgument, op,
                 "config->quantized must be 0 (plain) or 1 (quantized); got ", config->quantized);
    if (config->quantized) {
      cider::nn::QuantizedKVCacheConfig qc;
      qc.k_bits = config->k_bits;
      qc.v_bits = config->v_bits;
      qc.group_size = config->group_size;
      qc.rotation = rotation_kind(config->rotation, op);
      qc.seed = config->seed;
      qc.scale_dtype = float_dtype(config->scale_dtype, op, "scale_dtype");
      handle->cache = std::make_unique<cider::nn::QuantizedKVCache>(qc);
    } else {
      cider::nn::PlainKVCacheConfig pc;
      pc.dtype = float_dtype(config->plain_dtype, op, "plain_dtype");
      pc.rotation = rotation_kind(config->rotation, op);
      pc.seed = config->seed;
      handle->cache = std::make_unique<cider::nn::PlainKVCache>(pc);
    }
    *out = handle.release();
  });
}

cider_status cider_kv_cache_append(cider_kv_cache* cache, const cider_tensor* keys, const cider_tensor* values) {
  return guarded([&] {
    const char* op = "cider_kv_cache_append";
    check_cache(cache, op);
    cache->cache->update_and_fetch(to_view(keys, op, "keys"), to_view(values, op, "values"));
  });
}

cider_status cider_kv_cache_offset(const cider_kv_cache* cache, int64_t* offset) {
  return guarded([&] {
    check_cache(cache, "cider_kv_cache_offset");
    cider::capi::check_out_ptr(offset, "cider_kv_cache_offset", "offset");
    *offset = cache->cache->offset();
  });
}

cider_status cider_kv_cache_trim(cider_kv_cache* cache, int64_t n, int64_t* removed) {
  return guarded([&] {
    const char* op = "cider_kv_cache_trim";
    check_cache(cache, op);
    cider::check(n >= 0, ErrorCode::kInvalidArgument, op, "n must be >= 0; got ", n);
    const int64_t r = cache->cache->trim(n);
    if (removed) *removed = r;
  });
}

cider_status cider_kv_cache_nbytes(const cider_kv_cache* cache, size_t* nbytes) {
  return guarded([&] {
    check_cache(cache, "cider_kv_cache_nbytes");
    cider::capi::check_out_ptr(nbytes, "cider_kv_cache_nbytes", "nbytes");
    *nbytes = static_cast<size_t>(cache->cache->nbytes());
  });
}

cider_status cider_kv_cache_snapshot(const cider_kv_cache* cache, cider_kv_snapshot** out) {
  return guarded([&] {
    check_cache(cache, "cider_kv_cache_snapshot");
    cider::capi::check_out_ptr(out, "cider_kv_cache_snapshot", "out");
    *out = new cider_kv_snapshot{cache->cache->snapshot()};
  });
}

cider_status cider_kv_cache_restore(cider_kv_cache* cache, const cider_kv_snapshot* snapshot) {
  return guarded([&] {
    const char* op = "cider_kv_cache_restore";
    check_cache(cache, op);
    cider::check(snapshot != nullptr, ErrorCode::kInvalidArgument, op, "snapshot must not be NULL");
    cache->cache->restore(snapshot->snapshot);
  });
}

void cider_kv_snapshot_free(cider_kv_snapshot* snapshot) { delete snapshot; }

void cider_kv_cache_free(cider_kv_cache* cache) { delete cache; }

cider_status cider_attention(const cider_tensor* queries, const cider_kv_cache* cache, float scale, int mask_kind,
                             int64_t window, const cider_tensor* mask, const cider_tensor* out) {
  return guarded([&] {
    const char* op = "cider_attention";
    check_cache(cache, op);
    cider::check(mask_kind >= 0 && mask_kind <= 3, ErrorCode::kInvalidArgument, op,
                 "mask_kind must be 0 (none), 1 (causal), 2 (boolean) or 3 (additive); got ", mask_kind);
    cider::nn::AttentionMask m;
    m.kind = static_cast<cider::kernels::MaskKind>(mask_kind);
    m.window = window;
    const bool needs_mask = mask_kind == 2 || mask_kind == 3;
    cider::check(needs_mask == (mask != nullptr), ErrorCode::kInvalidArgument, op,
                 "mask must be given exactly when mask_kind is 2 or 3; got mask_kind ", mask_kind, " and mask ",
                 mask ? "non-NULL" : "NULL");
    if (mask) m.mask = cider::capi::to_input_view(mask, op, "mask", /*allow_neg_inf=*/mask_kind == 3);
    cider::check(std::isfinite(scale), ErrorCode::kInvalidArgument, op, "scale must be finite; got ", scale);
    cider::nn::attention(cider::capi::to_input_view(queries, op, "queries"), *cache->cache, scale, m, to_view(out, op, "out"));
  });
}

}  // extern "C"
