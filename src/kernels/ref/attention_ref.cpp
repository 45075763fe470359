// Reference attention over a KV cache (quantized or plain). See AttentionArgs in kernels/kernel_table.h.
//
// Work is organised per (batch b, KV head g): the R = (Hq/Hkv)·L query rows that share KV head g are processed
// together, so each cached row is read — and its codes unpacked — once per KV head, not once per query head
// (the loop order a SIMD/CUDA decode kernel uses too). For each query row r and key position j:
//
//   quantized keys:  score[r, j] = scale · Σ_g ( s_jg · Σ_{k∈g} q_rk·c_jk  +  b_jg · Σ_{k∈g} q_rk )
//   plain keys:      score[r, j] = scale · Σ_k q_rk·k_jk
//   per-channel keys (layout 1): k_jk = c_jk·s_bk + b_bk (b = j's block; the row is expanded to float32, one row
//                    at a time), plus (|s_bk|/15)·(r_jk − 7.5) on the block's outlier channels k (refinement codes r),
//                    or the bfloat16 residual row for positions past the last complete block
//
// with c the codes, s/b the stored scale/bias of group g — i.e. exactly q·(c·s + b), computed on the codes; the cache
// is never dequantized into a float copy (only one row of codes is unpacked at a time). A softcap > 0 then maps each
// score to softcap·tanh(score / softcap) (before the mask, as HF's Gemma 2). Masks then drop or offset scores, and
// the softmax is done in float32 with the row maximum subtracted:
//   p[r, j] = exp(score[r, j] − max_j score[r, j]),   out[r, :] = Σ_j p[r, j]·v_j / Σ_j p[r, j]
// where, for quantized values, Σ_j p·v_jd = Σ_j (p·s_jg)·c_jd + Σ_j p·b_jg  (g the group of d), accumulated per group.
// A row that sees no key (all masked, or every score −inf) is written as zeros. With exact_block > 0 a row sees only
// the keys before its recent block (AttentionArgs::exact_block); lse, when given, gets each row's m + log Σ.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/ref/ref_kernels.h"
#include "quant/affine.h"

namespace cider::kernels::ref {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One cached row (keys or values at position j of (b, g)), unpacked for the inner loops: codes as small integers
// plus per-group scale/bias (quantized), or the values as float32 (plain).
class RowReader {
 public:
  explicit RowReader(const KVTensorView& v)
      : v_(v),
        groups_(v.bits ? v.dim / v.group_size : 0),
        codes_(static_cast<size_t>(v.dim)),
        floats_(static_cast<size_t>(v.dim)),
        scales_(static_cast<size_t>(groups_)),
        biases_(scales_.size()) {}

  void load(int64_t b, int64_t g, int64_t j) {
    const int64_t row = (b * v_.H + g) * v_.capacity + j;
    as_floats_ = v_.bits == 0;
    if (v_.layout == 1) {  // per-channel keys: expanded to float32
      as_floats_ = true;
      const int64_t gs = v_.group_size, nq = v_.length / gs * gs;
      if (j >= nq) {
        const int64_t rrow = (b * v_.H + g) * gs + (j - nq);
        for (int64_t d = 0; d < v_.dim; ++d)
          floats_[static_cast<size_t>(d)] = load_float(v_.residual, DType::kBF16, rrow * v_.dim + d);
        return;
      }
      const uint32_t* words = static_cast<const uint32_t*>(v_.data) + row * quant::packed_words(v_.dim, v_.bits);
      const int64_t srow = (b * v_.H + g) * v_.blocks + j / gs;
      for (int64_t d = 0; d < v_.dim; ++d)
        floats_[static_cast<size_t>(d)] =
            static_cast<float>(quant::unpack_code(words, d, v_.bits)) *
                load_float(v_.scales, v_.scale_dtype, srow * v_.dim + d) +
            load_float(v_.biases, v_.scale_dtype, srow * v_.dim + d);
      if (const int64_t n = v_.outliers; n > 0) {
        const auto* index = static_cast<const uint16_t*>(v_.outlier_index) + srow * n;
        const uint8_t* oc = static_cast<const uint8_t*>(v_.outlier_codes) + srow * n * gs / 2;
        const int64_t t = j % gs;
        for (int64_t o = 0; o < n; ++o) {
          const int64_t d = index[o];
          const uint32_t r = (oc[o * gs / 2 + t / 2] >> (4 * (t % 2))) & 15u;
          floats_[static_cast<size_t>(d)] +=
              quant::outlier_refinement(r, load_float(v_.scales, v_.scale_dtype, srow * v_.dim + d));
        }
      }
      return;
    }
    if (v_.bits == 0) {
      for (int64_t d = 0; d < v_.dim; ++d)
        floats_[static_cast<size_t>(d)] = load_float(v_.data, v_.dtype, row * v_.dim + d);
      return;
    }
    const uint32_t* words = static_cast<const uint32_t*>(v_.data) + row * quant::packed_words(v_.dim, v_.bits);
    quant::unpack_codes(words, v_.dim, v_.bits, codes_.data());
    for (int64_t gi = 0; gi < groups_; ++gi) {
      scales_[static_cast<size_t>(gi)] = load_float(v_.scales, v_.scale_dtype, row * groups_ + gi);
      biases_[static_cast<size_t>(gi)] = v_.symmetric ? quant::symmetric_bias(scales_[static_cast<size_t>(gi)], v_.bits)
                                                      : load_float(v_.biases, v_.scale_dtype, row * groups_ + gi);
    }
  }

  bool quantized() const { return !as_floats_; }  // codes with per-group scales (else floats())
  int64_t groups() const { return groups_; }
  int group_size() const { return v_.group_size; }
  const uint8_t* codes() const { return codes_.data(); }
  const float* floats() const { return floats_.data(); }
  float scale(int64_t gi) const { return scales_[static_cast<size_t>(gi)]; }
  float bias(int64_t gi) const { return biases_[static_cast<size_t>(gi)]; }

 private:
  const KVTensorView& v_;
  bool as_floats_ = false;
  int64_t groups_;
  std::vector<uint8_t> codes_;  // [dim]
  std::vector<float> floats_;   // [dim]
  std::vector<float> scales_;   // [groups]
  std::vector<float> biases_;   // [groups]
};

}  // namespace

void attention(const AttentionArgs& a) {
  const KVTensorView& K = a.keys;
  const KVTensorView& V = a.values;
  const int64_t Hkv = K.H, rep = a.Hq / Hkv, L = a.L, kL = K.length, Dk = K.dim, Dv = V.dim;
  const int64_t R = rep * L;  // query rows sharing one KV head: r = rr·L + i  <->  query head g·rep + rr, row i
  const int64_t kGroups = K.bits && K.layout == 0 ? Dk / K.group_size : 0;

  RowReader key(K), value(V);
  std::vector<float> scores(static_cast<size_t>(R * kL));     // [R, kL], then the unnormalised p
  std::vector<float> qsum(static_cast<size_t>(R * kGroups));  // [R, Dk/gs]: Σ_{k∈g} q_k
  std::vector<float> acc(static_cast<size_t>(R * Dv));        // [R, Dv]: Σ_j p·(s·c) or Σ_j p·v
  std::vector<float> bias_acc(static_cast<size_t>(R * (V.bits ? Dv / V.group_size : 0)));  // [R, Dv/gs]: Σ_j p·b
  std::vector<float> denom(static_cast<size_t>(R));

  for (int64_t b = 0; b < a.B; ++b) {
    for (int64_t g = 0; g < Hkv; ++g) {
      auto q_row = [&](int64_t r) { return a.q + ((b * a.Hq + g * rep + r / L) * L + r % L) * Dk; };
      for (int64_t r = 0; r < R; ++r)
        for (int64_t gi = 0; gi < kGroups; ++gi) {
          float s = 0.0f;
          for (int64_t k = gi * K.group_size; k < (gi + 1) * K.group_size; ++k) s += q_row(r)[k];
          qsum[static_cast<size_t>(r * kGroups + gi)] = s;
        }

      // ---- scores ----
      for (int64_t j = 0; j < kL; ++j) {
        key.load(b, g, j);
        for (int64_t r = 0; r < R; ++r) {
          const int64_t hq = g * rep + r / L, i = r % L;
          float& out_score = scores[static_cast<size_t>(r * kL + j)];
          const int64_t moff =
              b * a.mask_stride[0] + hq * a.mask_stride[1] + i * a.mask_stride[2] + j * a.mask_stride[3];
          if (a.exact_block > 0) {  // the recent block and the sink are read elsewhere (AttentionArgs::exact_block)
            const int64_t pos = kL - L + i;
            if (j < a.exact_sink || j >= recent_block_start(pos, a.exact_block, a.exact_lo)) {
              out_score = kNegInf;
              continue;
            }
          }
          if (a.mask_kind == MaskKind::kCausal) {
            const int64_t pos = kL - L + i;  // absolute position of query row i
            if (j > pos || (a.window > 0 && j <= pos - a.window)) {
              out_score = kNegInf;
              continue;
            }
          } else if (a.mask_kind == MaskKind::kBool) {
            if (static_cast<const uint8_t*>(a.mask)[moff] == 0) {
              out_score = kNegInf;
              continue;
            }
          }
          const float* q = q_row(r);
          float dot = 0.0f;
          if (key.quantized()) {
            const uint8_t* c = key.codes();
            for (int64_t gi = 0; gi < kGroups; ++gi) {
              float qc = 0.0f;
              for (int64_t k = gi * K.group_size; k < (gi + 1) * K.group_size; ++k)
                qc += q[k] * static_cast<float>(c[k]);
              dot += key.scale(gi) * qc + key.bias(gi) * qsum[static_cast<size_t>(r * kGroups + gi)];
            }
          } else {
            const float* kv = key.floats();
            for (int64_t k = 0; k < Dk; ++k) dot += q[k] * kv[k];
          }
          float s = a.scale * dot;
          if (a.softcap > 0.0f) s = a.softcap * std::tanh(s / a.softcap);
          if (a.mask_kind == MaskKind::kAdditive) s += load_float(a.mask, a.mask_dtype, moff);
          out_score = s;
        }
      }

      // ---- softmax numerators (float32, max subtracted); a row whose maximum is −inf sees nothing ----
      for (int64_t r = 0; r < R; ++r) {
        float* s = &scores[static_cast<size_t>(r * kL)];
        float m = kNegInf;
        for (int64_t j = 0; j < kL; ++j) m = s[j] > m ? s[j] : m;
        float sum = 0.0f;
        if (m == kNegInf) {
          for (int64_t j = 0; j < kL; ++j) s[j] = 0.0f;
        } else {
          for (int64_t j = 0; j < kL; ++j) {
            s[j] = std::exp(s[j] - m);  // exp(−inf) = 0 for masked keys
            sum += s[j];
          }
        }
        denom[static_cast<size_t>(r)] = sum;
        if (a.lse != nullptr)
          a.lse[(b * a.Hq + g * rep + r / L) * L + r % L] = m == kNegInf || sum == 0.0f ? kNegInf : m + std::log(sum);
      }

      // ---- weighted value sum, on the codes ----
      std::fill(acc.begin(), acc.end(), 0.0f);
      std::fill(bias_acc.begin(), bias_acc.end(), 0.0f);
      const int64_t vGroups = V.bits ? Dv / V.group_size : 0;
      for (int64_t j = 0; j < kL; ++j) {
        bool needed = false;
        for (int64_t r = 0; r < R && !needed; ++r) needed = scores[static_cast<size_t>(r * kL + j)] != 0.0f;
        if (!needed) continue;  // masked for every row: skip reading it
        value.load(b, g, j);
        for (int64_t r = 0; r < R; ++r) {
          const float p = scores[static_cast<size_t>(r * kL + j)];
          if (p == 0.0f) continue;
          float* o = &acc[static_cast<size_t>(r * Dv)];
          if (value.quantized()) {
            const uint8_t* c = value.codes();
            for (int64_t gi = 0; gi < vGroups; ++gi) {
              const float ps = p * value.scale(gi);
              for (int64_t d = gi * V.group_size; d < (gi + 1) * V.group_size; ++d)
                o[d] += ps * static_cast<float>(c[d]);
              bias_acc[static_cast<size_t>(r * vGroups + gi)] += p * value.bias(gi);
            }
          } else {
            const float* vv = value.floats();
            for (int64_t d = 0; d < Dv; ++d) o[d] += p * vv[d];
          }
        }
      }

      for (int64_t r = 0; r < R; ++r) {
        float* dst = a.out + ((b * a.Hq + g * rep + r / L) * L + r % L) * Dv;
        const float den = denom[static_cast<size_t>(r)];
        const float* o = &acc[static_cast<size_t>(r * Dv)];
        for (int64_t d = 0; d < Dv; ++d) {
          if (den == 0.0f) {
            dst[d] = 0.0f;
            continue;
          }
          const float bias_part = vGroups ? bias_acc[static_cast<size_t>(r * vGroups + d / V.group_size)] : 0.0f;
          dst[d] = (o[d] + bias_part) / den;
        }
      }
    }
  }
}

}  // namespace cider::kernels::ref
