// cider/model/tokenizer.h — text <-> token ids, loaded from a Hugging Face tokenizer.json or from GGUF metadata.
//
// Supported models (anything else is a cider::Error naming what is unsupported):
//   * byte-level BPE (GPT-2 / Llama 3 / Qwen2 style): ByteLevel pre-tokenizer with its split regex (Unicode
//     properties through PCRE2), merges by rank, the byte-to-unicode alphabet;
//   * SentencePiece-style BPE (Llama 2 / Mistral / Gemma): "▁" for spaces (Metaspace or the Replace/Prepend
//     normalizers), merges by rank (or by score for GGUF "llama" vocabularies), byte fallback <0xNN>;
//   * normalizers NFC/NFKC only if needed by a supported model, Prepend, Replace, Sequence;
//   * added/special tokens matched before the model (longest match, special tokens never split);
//   * post-processor BOS/EOS insertion (TemplateProcessing for a single sequence).
// Encoding must equal Hugging Face `tokenizers` on the same tokenizer.json for any text.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace cider::model {

class GGUFFile;

class Tokenizer {
 public:
  static Tokenizer from_json_file(const std::string& path);  // tokenizer.json
  static Tokenizer from_json(std::string_view json_text);
  static Tokenizer from_gguf(const GGUFFile& gguf);          // tokenizer.ggml.* metadata
  // The tokenizer.ggml.pre values from_gguf accepts for byte-level ("gpt2") vocabularies.
  static std::vector<std::string> gguf_pre_types();

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // add_special: apply the post-processor (e.g. prepend BOS) as HF's encode(add_special_tokens=True) does.
  std::vector<int32_t> encode(std::string_view text, bool add_special = true) const;
  // Concatenated text of the ids (skip_special: drop special/control tokens), as HF's decode does.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  int64_t vocab_size() const;
  int32_t bos_id() const;                 // -1 if none
  std::vector<int32_t> eos_ids() const;   // may be empty
  bool is_special(int32_t id) const;
  int32_t token_to_id(std::string_view token) const;  // -1 if absent
  std::string id_to_token(int32_t id) const;           // the raw vocabulary string

  // Incremental decoding for streaming: push ids one at a time, get back only complete UTF-8 text (bytes of a
  // character split over several tokens are held until it is complete), with the same total text as decode().
  class StreamDecoder {
   public:
    explicit StreamDecoder(const Tokenizer& tok, bool skip_special = true);
    std::string push(int32_t id);
    std::string flush();  // whatever is left (invalid UTF-8 tails as U+FFFD)
   private:
    const Tokenizer* tok_;
    bool skip_special_;
    std::vector<int32_t> ids_;
    size_t emitted_bytes_ = 0;
  };

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cider::model
