// The forward pass, written once for every architecture and device (model/backend.h; the computation in
// model/transformer.h).
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "model/backend.h"

namespace cider::model {

void run_layers(const ModelConfig& c, Backend& b) {
  const NormSlot post_attn = c.sandwich_norms ? NormSlot::kPostAttn : NormSlot::kNone;
  const NormSlot post_mlp = c.sandwich_norms ? NormSlot::kPostMlp : NormSlot::kNone;
  b.residual_norm(/*add=*/false, 0, NormSlot::kNone, 0, NormSlot::kAttn);  // h = attn_norm(x) of the first layer
  for (int64_t l = 0; l < c.num_layers; ++l) {
    // ---- attention block (or a hybrid model's linear-attention layer) ----
    if (c.is_linear_layer(l)) {
      b.linear_attention(l);
    } else {
      b.linear(l, LinearSlot::kQKV);
      b.prepare_heads(l);
      b.kv_append(l);
      b.attention(l);
      b.finish_heads(l);
      b.linear(l, LinearSlot::kO);
    }
    b.residual_norm(/*add=*/true, l, post_attn, l, NormSlot::kMlp);
    // ---- MLP block (or the experts of a mixture-of-experts layer) ----
    if (c.is_moe_layer(l)) {
      b.moe(l);
    } else {
      b.linear(l, LinearSlot::kGateUp);
      b.glu();
      b.linear(l, LinearSlot::kDown);
    }
    const bool last = l + 1 == c.num_layers;
    b.residual_norm(/*add=*/true, l, post_mlp, last ? l : l + 1, last ? NormSlot::kFinal : NormSlot::kAttn);
  }
}

bool BackendModel::candidates(BackendSession&, const CandidateRequest&, Candidates&) const { return false; }

void run_forward(const ModelConfig& c, PassBackend& b, std::span<const SequenceStep> steps) {
  const int64_t cap = b.max_pass_rows();
  check(cap >= 1, ErrorCode::kInternal, "forward", "a backend must take at least one row per pass; got ", cap);
  const int64_t V = c.vocab_size;
  std::vector<PassSegment> segments;
  std::vector<int32_t> tokens;
  std::vector<float> staged;  // logits of several sequences' last rows
  std::vector<int64_t> last_rows;
  std::vector<float*> last_dst;
  // Greedy: each pass takes the next rows of the sequences in order until it holds `cap` rows.
  size_t seq = 0;
  int64_t done_in_seq = 0;
  while (seq < steps.size()) {
    segments.clear();
    tokens.clear();
    int64_t rows = 0;
    size_t s = seq;
    int64_t d = done_in_seq;
    while (s < steps.size() && rows < cap) {
      const SequenceStep& st = steps[s];
      const int64_t n = std::min(cap - rows, st.n - d);
      segments.push_back({static_cast<int64_t>(s), rows, n, st.start + d});
      rows += n;
      d += n;
      if (d == st.n) {
        ++s;
        d = 0;
      }
    }
    // The pass's tokens: a pointer into the one sequence's, or gathered for several.
    const SequenceStep& first = steps[static_cast<size_t>(segments[0].seq)];
    const int32_t* pass_tokens = first.tokens + (segments[0].pos0 - first.start);
    if (segments.size() > 1) {
      for (const PassSegment& g : segments) {
        const SequenceStep& st = steps[static_cast<size_t>(g.seq)];
        tokens.insert(tokens.end(), st.tokens + (g.pos0 - st.start), st.tokens + (g.pos0 - st.start) + g.n);
      }
      pass_tokens = tokens.data();
    }
    b.begin_pass(segments, pass_tokens);
    b.embed();
    run_layers(c, b);
    // ---- head: every row of a sequence that wants them all, else only a sequence's last row. The last rows of
    // several sequences (a decode batch's, or prompts ending in this pass) go through the head in one call — one pass
    // over W_head for all of them instead of one per sequence — gathered side by side (after the all-rows sequences
    // have read theirs), staged, then copied to each sequence's output. A last row kept on the device (logits null:
    // one sequence) goes alone.
    last_rows.clear();
    last_dst.clear();
    for (const PassSegment& g : segments) {
      const SequenceStep& st = steps[static_cast<size_t>(g.seq)];
      const int64_t offset = g.pos0 - st.start;  // rows of this sequence before this segment
      if (st.all_logits) {
        b.logits(g.row0, g.n, st.logits + offset * V);
      } else if (offset + g.n == st.n) {  // else the sequence goes on in the next pass
        last_rows.push_back(g.row0 + g.n - 1);
        last_dst.push_back(st.logits);
      }
    }
    const bool on_device = std::find(last_dst.begin(), last_dst.end(), nullptr) != last_dst.end();
    if (last_rows.size() == 1 || on_device) {
      for (size_t k = 0; k < last_rows.size(); ++k) b.logits(last_rows[k], 1, last_dst[k]);
    } else if (last_rows.size() > 1) {
      bool side_by_side = true;
      for (size_t k = 1; k < last_rows.size(); ++k) side_by_side = side_by_side && last_rows[k] == last_rows[0] + static_cast<int64_t>(k);
      int64_t row0 = last_rows[0];
      if (!side_by_side) {
        b.gather_rows(last_rows);
        row0 = 0;
      }
      staged.resize(last_rows.size() * static_cast<size_t>(V));
      b.logits(row0, static_cast<int64_t>(last_rows.size()), staged.data());
      for (size_t k = 0; k < last_rows.size(); ++k)
        std::memcpy(last_dst[k], staged.data() + k * static_cast<size_t>(V), static_cast<size_t>(V) * sizeof(float));
    }
    seq = s;
    done_in_seq = d;
  }
  b.end_forward();
}

}  // namespace cider::model
