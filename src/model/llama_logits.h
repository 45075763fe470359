// cider/model/llama_logits.h — llama.cpp's saved log-probabilities (`llama-perplexity --kl-divergence-base FILE`),
// read as the baseline of `cider perplexity --llama-windows --llama-logits FILE`: the divergence of cider's logits
// from llama.cpp's on the same windows of the same file.
//
// The file (little-endian, as llama-perplexity writes it):
//   "_logits_" (8 bytes), int32 n_ctx, int32 n_vocab, int32 n_chunk,
//   int32 tokens[n_chunk · n_ctx]        the text's tokens (each window's first one before BOS replaced it),
//   then for every chunk, for its rows j = n_ctx/2 … n_ctx − 2 (row j predicts token j + 1, llama-perplexity's
//   scored half), nv = 2·⌈n_vocab/2⌉ + 4 uint16: float32 scale, float32 min_log_prob, then per vocabulary entry
//   v a code q_v with log p_v = scale·q_v + min_log_prob. llama.cpp clamps the range to 16 nats below the top
//   (q = 0: at or below that), and its KL skips entries at or below −16 nats; so does cider's reading of it
//   (evaluate_perplexity with PerplexityOptions::baseline_log_probs).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace cider::model {

class LlamaLogitsFile {
 public:
  // Opens `path` and reads its header and tokens. Throws cider::Error (op "llama_logits"): kIo for a file that
  // cannot be read; kCorrupt for a wrong magic, sizes outside [2, 2^20] (n_ctx), [1, 2^24] (n_vocab), [1, 2^20]
  // (n_chunk), a token id outside [0, n_vocab), or a length that is not exactly what the header implies.
  explicit LlamaLogitsFile(const std::string& path);

  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_vocab() const { return n_vocab_; }
  int64_t n_chunk() const { return n_chunk_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }  // [n_chunk · n_ctx]

  // The log-probabilities of chunk `chunk` (chunks are read in order: 0, 1, …) into out[n_ctx, n_vocab]: rows
  // n_ctx/2 … n_ctx − 2 decoded, the others 0 (llama.cpp saved none). Throws for a chunk out of order or a
  // non-finite scale / min_log_prob (kCorrupt).
  void read_chunk(int64_t chunk, float* out);

 private:
  std::string path_;
  std::ifstream in_;
  int64_t n_ctx_ = 0, n_vocab_ = 0, n_chunk_ = 0, next_chunk_ = 0;
  std::vector<int32_t> tokens_;
  std::vector<uint16_t> row_;
};

}  // namespace cider::model
