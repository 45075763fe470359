#include "model/llama_logits.h"

#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace cider::model {

namespace {

int64_t values_per_row(int64_t n_vocab) { return 2 * ((n_vocab + 1) / 2) + 4; }  // uint16 per saved row

}  // namespace

LlamaLogitsFile::LlamaLogitsFile(const std::string& path) : path_(path) {
  in_.open(path, std::ios::binary);
  check(in_.is_open(), ErrorCode::kIo, "llama_logits", "cannot open \"", path, "\" for reading");
  char magic[8];
  int32_t head[3];
  in_.read(magic, 8);
  in_.read(reinterpret_cast<char*>(head), sizeof head);
  check(static_cast<bool>(in_) && std::memcmp(magic, "_logits_", 8) == 0, ErrorCode::kCorrupt, "llama_logits",
        "\"", path, "\" must start with \"_logits_\" and three int32 sizes (llama-perplexity --kl-divergence-base)");
  n_ctx_ = head[0];
  n_vocab_ = head[1];
  n_chunk_ = head[2];
  check(n_ctx_ >= 2 && n_ctx_ <= (int64_t{1} << 20), ErrorCode::kCorrupt, "llama_logits",
        "n_ctx must be in [2, 2^20]; got ", n_ctx_, " in \"", path, "\"");
  check(n_vocab_ >= 1 && n_vocab_ <= (int64_t{1} << 24), ErrorCode::kCorrupt, "llama_logits",
        "n_vocab must be in [1, 2^24]; got ", n_vocab_, " in \"", path, "\"");
  check(n_chunk_ >= 1 && n_chunk_ <= (int64_t{1} << 20), ErrorCode::kCorrupt, "llama_logits",
        "n_chunk must be in [1, 2^20]; got ", n_chunk_, " in \"", path, "\"");
  // Every factor is bounded above, so these products fit in int64.
  const int64_t rows = n_ctx_ - 1 - n_ctx_ / 2;
  const int64_t expected = 8 + 12 + n_chunk_ * n_ctx_ * 4 + n_chunk_ * rows * values_per_row(n_vocab_) * 2;
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  check(!ec && static_cast<int64_t>(size) == expected, ErrorCode::kCorrupt, "llama_logits", "\"", path,
        "\" must be ", expected, " bytes for n_ctx ", n_ctx_, ", n_vocab ", n_vocab_, ", n_chunk ", n_chunk_, "; got ",
        ec ? -1 : static_cast<int64_t>(size));
  tokens_.resize(static_cast<size_t>(n_chunk_ * n_ctx_));
  in_.read(reinterpret_cast<char*>(tokens_.data()), static_cast<std::streamsize>(tokens_.size() * 4));
  check(static_cast<bool>(in_), ErrorCode::kIo, "llama_logits", "cannot read the tokens of \"", path, "\"");
  for (size_t i = 0; i < tokens_.size(); ++i)
    check(tokens_[i] >= 0 && tokens_[i] < n_vocab_, ErrorCode::kCorrupt, "llama_logits",
          "token ids must be in [0, ", n_vocab_, "); got ", tokens_[i], " at ", i, " in \"", path, "\"");
  row_.resize(static_cast<size_t>(values_per_row(n_vocab_)));
}

void LlamaLogitsFile::read_chunk(int64_t chunk, float* out) {
  check(chunk == next_chunk_ && chunk < n_chunk_, ErrorCode::kInvalidArgument, "llama_logits",
        "chunks are read in order: expected chunk ", next_chunk_, " of ", n_chunk_, "; got ", chunk);
  ++next_chunk_;
  const int64_t first = n_ctx_ / 2;
  const size_t vocab = static_cast<size_t>(n_vocab_);
  for (int64_t j = 0; j < n_ctx_; ++j) {
    float* o = out + static_cast<size_t>(j) * vocab;
    if (j < first || j > n_ctx_ - 2) {
      std::memset(o, 0, vocab * sizeof(float));
      continue;
    }
    in_.read(reinterpret_cast<char*>(row_.data()), static_cast<std::streamsize>(row_.size() * 2));
    check(static_cast<bool>(in_), ErrorCode::kIo, "llama_logits", "cannot read row ", j, " of chunk ", chunk,
          " of \"", path_, "\"");
    float scale, min_log_prob;
    std::memcpy(&scale, row_.data(), 4);
    std::memcpy(&min_log_prob, row_.data() + 2, 4);
    check(std::isfinite(scale) && scale >= 0.0f && std::isfinite(min_log_prob), ErrorCode::kCorrupt,
          "llama_logits", "row ", j, " of chunk ", chunk, " must have a finite scale >= 0 and min_log_prob; got ",
          scale, " and ", min_log_prob);
    const uint16_t* q = row_.data() + 4;
    for (size_t v = 0; v < vocab; ++v) o[v] = scale * static_cast<float>(q[v]) + min_log_prob;
  }
}

}  // namespace cider::model
