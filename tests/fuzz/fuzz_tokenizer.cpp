// Fuzz harness: tokenizer.json parsing, encoding and decoding.
//
// Input: <tokenizer.json text> 0x00 <text bytes>, split at the first 0x00.
//   * A first part of 0 or 1 bytes selects one of the repository's fixture tokenizers instead (loaded once; the byte,
//     if any, picks which), so that most executions fuzz encode/decode at full speed.
//   * Otherwise the first part is parsed with Tokenizer::from_json (a cider::Error is the expected outcome).
// With a tokenizer, the second part is encoded with and without special tokens (ids must lie in the vocabulary), the
// ids decoded in both modes and through StreamDecoder (whose total text must equal decode()'s), then read as
// little-endian int32 ids: decoded raw (out-of-range ids must be a cider::Error) and folded into the vocabulary (must
// decode without error).
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "model/tokenizer.h"

namespace {

using cider::model::Tokenizer;

using cider::fuzz::require;

const std::vector<std::unique_ptr<Tokenizer>>& fixtures() {
  static const std::vector<std::unique_ptr<Tokenizer>> tokenizers = [] {
    std::vector<std::unique_ptr<Tokenizer>> v;
    for (const char* f : {"tests/data/tokenizers/gpt2.json", "tests/data/tokenizers/llama3.json",
                          "tests/data/tokenizers/qwen2.json", "tests/data/tokenizers/llama2.json",
                          "tests/data/tokenizers/gemma.json", "tests/data/tokenizers/mistral_metaspace.json",
                          "tests/data/tokenizers/metaspace_split.json", "tests/data/tokenizers/bytelevel_prefix.json",
                          "models/cider-tiny/tokenizer.json"})
      v.push_back(std::make_unique<Tokenizer>(Tokenizer::from_json(cider::fuzz::read_fixture(f))));
    return v;
  }();
  return tokenizers;
}

// The streamed text of `ids` (push each, then flush) must be decode(ids, skip_special).
void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special) {
  Tokenizer::StreamDecoder sd(tok, skip_special);
  std::string streamed;
  for (int32_t id : ids) streamed += sd.push(id);
  streamed += sd.flush();
  const std::string whole = tok.decode(ids, skip_special);
  if (streamed != whole) {
    auto show = [](const std::string& t) {
      std::string o;
      for (unsigned char c : t) {
        char b[8];
        std::snprintf(b, sizeof b, (c >= 0x20 && c < 0x7f && c != '\\') ? "%c" : "\\x%02x", c);
        o += b;
      }
      return o;
    };
    std::fprintf(stderr, "fuzz_tokenizer: skip_special=%d ids:", skip_special ? 1 : 0);
    for (int32_t id : ids) std::fprintf(stderr, " %d", id);
    std::fprintf(stderr, "\n  decode():        \"%s\"\n  StreamDecoder:   \"%s\"\n", show(whole).c_str(),
                 show(streamed).c_str());
  }
  require(streamed == whole, "StreamDecoder's total text == decode()");
}

void exercise(const Tokenizer& tok, std::string_view text, bool fixture) {
  const int64_t vocab = tok.vocab_size();
  require(vocab >= 1, "vocab_size >= 1");
  for (bool add_special : {true, false}) {
    std::vector<int32_t> ids;
    bool threw = false;
    try {
      ids = tok.encode(text, add_special);
    } catch (const cider::Error&) {
      threw = true;
    }
    // encode refuses the texts that are not valid UTF-8. With a fuzzed tokenizer.json it may also refuse valid text
    // (a split regex that hits PCRE2's match limit); the repository's tokenizers must encode every valid text.
    const bool valid = cider::fuzz::is_valid_utf8(text);
    if (!valid) require(threw, "encode refuses text that is not valid UTF-8");
    if (valid && fixture) require(!threw, "a fixture tokenizer encodes every valid UTF-8 text");
    for (int32_t id : ids) require(id >= 0 && id < vocab, "encode returns ids inside the vocabulary");
    cider::fuzz::expect_success("decode of encoded ids", [&] {
      (void)tok.decode(ids, false);
      (void)tok.decode(ids, true);
      check_stream(tok, ids, true);
      check_stream(tok, ids, false);
    });
  }

  // The text's bytes as ids.
  cider::fuzz::Bytes b(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  std::vector<int32_t> raw, folded;
  while (b.left() >= 4 && raw.size() < 512) {
    const uint32_t u = b.u32();
    raw.push_back(static_cast<int32_t>(u));
    folded.push_back(static_cast<int32_t>(u % static_cast<uint64_t>(vocab)));
  }
  cider::fuzz::expect_errors([&] { (void)tok.decode(raw, false); });
  cider::fuzz::expect_errors([&] { (void)tok.decode(raw, true); });
  for (int32_t id : raw) {
    bool threw = false;
    try {
      (void)tok.id_to_token(id);
    } catch (const cider::Error&) {
      threw = true;
    }
    if (id < 0 || id >= vocab) require(threw, "id_to_token refuses ids outside [0, vocab_size)");
    (void)tok.is_special(id);
  }
  // Ids folded into [0, vocab_size), keeping those the vocabulary has (a tokenizer.json may leave holes).
  std::vector<int32_t> present;
  for (int32_t id : folded) {
    try {
      (void)tok.id_to_token(id);
      present.push_back(id);
    } catch (const cider::Error&) {
    }
  }
  folded.swap(present);
  cider::fuzz::expect_success("decode of ids inside the vocabulary", [&] {
    (void)tok.decode(folded, false);
    (void)tok.decode(folded, true);
    check_stream(tok, folded, true);
    check_stream(tok, folded, false);
  });
  (void)tok.token_to_id(text);
  (void)tok.bos_id();
  (void)tok.eos_ids();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const cider::fuzz::Parts p = cider::fuzz::split_nul(data, size, 2);
  const std::string_view json = p.parts[0], text = p.parts[1];
  if (json.size() <= 1) {
    const auto& fx = fixtures();
    const size_t pick = json.empty() ? 0 : static_cast<uint8_t>(json[0]) % fx.size();
    exercise(*fx[pick], text, true);
    return 0;
  }
  std::unique_ptr<Tokenizer> tok;
  cider::fuzz::expect_errors([&] { tok = std::make_unique<Tokenizer>(Tokenizer::from_json(json)); });
  if (tok) exercise(*tok, text, false);
  return 0;
}
