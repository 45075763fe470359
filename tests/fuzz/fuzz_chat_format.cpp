// Fuzz harness: chat formats (model/chat_format.h) and the tokenization of what they render.
//
// Input: byte 0 = format (low 3 bits, mod 6) and flags, byte 1 = architecture and flags, then 0x00-separated texts:
// system, user 1, assistant 1, user 2, ... Every input is also given whole (and each text) to parse_chat_format.
// Renders each turn (chat_user_turn, chat_reply_end, chat_end_tokens) and the whole conversation (render_chat, with
// roles scrambled when a flag says so), checks the documented relations between the pieces, then encodes the text
// with the embedded model's tokenizer (models/cider-tiny, loaded once) or the fixture tokenizer of the format's own
// model family (which has the format's special tokens).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "model/chat_format.h"
#include "model/tokenizer.h"

namespace {

using cider::model::ChatFormat;
using cider::model::ChatMessage;
using cider::model::Tokenizer;

using cider::fuzz::require;

constexpr ChatFormat kFormats[] = {ChatFormat::kChatML, ChatFormat::kLlama3,  ChatFormat::kGemma,
                                   ChatFormat::kMistral, ChatFormat::kLlama2, ChatFormat::kRaw};
constexpr cider::model::Architecture kArchs[] = {cider::model::Architecture::kLlama, cider::model::Architecture::kMistral,
                                                 cider::model::Architecture::kQwen2, cider::model::Architecture::kQwen3,
                                                 cider::model::Architecture::kGemma3};

const Tokenizer& tiny_tokenizer() {
  static const Tokenizer t = Tokenizer::from_json(cider::fuzz::read_fixture("models/cider-tiny/tokenizer.json"));
  return t;
}

// The fixture tokenizer of a format's model family (tests/data/tokenizers), loaded on first use.
const Tokenizer& family_tokenizer(ChatFormat f) {
  static const Tokenizer chatml = Tokenizer::from_json(cider::fuzz::read_fixture("tests/data/tokenizers/qwen2.json"));
  static const Tokenizer llama3 = Tokenizer::from_json(cider::fuzz::read_fixture("tests/data/tokenizers/llama3.json"));
  static const Tokenizer gemma = Tokenizer::from_json(cider::fuzz::read_fixture("tests/data/tokenizers/gemma.json"));
  static const Tokenizer mistral =
      Tokenizer::from_json(cider::fuzz::read_fixture("tests/data/tokenizers/mistral_metaspace.json"));
  static const Tokenizer llama2 = Tokenizer::from_json(cider::fuzz::read_fixture("tests/data/tokenizers/llama2.json"));
  switch (f) {
    case ChatFormat::kChatML: return chatml;
    case ChatFormat::kLlama3: return llama3;
    case ChatFormat::kGemma: return gemma;
    case ChatFormat::kMistral: return mistral;
    case ChatFormat::kLlama2:
    case ChatFormat::kPhi3: return llama2;  // Phi-3's vocabulary is Llama 2's SentencePiece one
    case ChatFormat::kRaw: break;
  }
  return tiny_tokenizer();
}

void encode_all(const Tokenizer& tok, const std::string& text, bool first) {
  const int64_t v = tok.vocab_size();
  std::vector<int32_t> ids;
  if (!cider::fuzz::is_valid_utf8(text)) {  // encode's documented refusal
    bool threw = false;
    try {
      ids = tok.encode(text, first);
    } catch (const cider::Error&) {
      threw = true;
    }
    require(threw, "encode refuses text that is not valid UTF-8");
    return;
  }
  cider::fuzz::expect_success("encoding rendered (valid UTF-8) chat text", [&] { ids = tok.encode(text, first); });
  for (int32_t id : ids) require(id >= 0 && id < v, "encode returns ids inside the vocabulary");
  cider::fuzz::expect_success("decoding encoded chat text", [&] { (void)tok.decode(ids, true); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view whole(reinterpret_cast<const char*>(data), size);
  cider::fuzz::expect_errors([&] { (void)cider::model::parse_chat_format(whole); });
  if (size < 2) return 0;

  const ChatFormat f = kFormats[(data[0] & 7) % 6];
  const bool with_system = (data[0] & 0x08) != 0;
  const bool family_tok = (data[0] & 0x10) != 0;
  const bool scramble_roles = (data[0] & 0x20) != 0;
  const auto arch = kArchs[(data[1] & 7) % 5];

  require(cider::model::parse_chat_format(cider::model::chat_format_name(f)) == f, "parse(name(f)) == f");

  const cider::fuzz::Parts p = cider::fuzz::split_nul(data + 2, size - 2, 16);
  std::vector<std::string_view> texts(p.parts.begin(), p.parts.begin() + static_cast<std::ptrdiff_t>(p.present));
  for (std::string_view t : texts) cider::fuzz::expect_errors([&] { (void)cider::model::parse_chat_format(t); });

  const Tokenizer& tok = family_tok ? family_tokenizer(f) : tiny_tokenizer();
  // default_chat_format with the tokenizer's vocabulary and with a vocabulary given by the input's flag bits.
  (void)cider::model::default_chat_format(arch, [&](std::string_view s) { return tok.token_to_id(s) >= 0; });
  (void)cider::model::default_chat_format(arch, [&](std::string_view s) { return (s.size() + data[1]) % 3 == 0; });

  const std::string_view system = with_system && !texts.empty() ? texts[0] : std::string_view();
  const size_t first_user = with_system ? 1 : 0;
  const std::string_view user = first_user < texts.size() ? texts[first_user] : std::string_view();

  // One turn: render_chat of {system?, user} is exactly the first user turn.
  const std::string turn = cider::model::chat_user_turn(f, user, system, true);
  std::vector<ChatMessage> one;
  if (!system.empty()) one.push_back({"system", std::string(system)});
  one.push_back({"user", std::string(user)});
  cider::fuzz::expect_success("render_chat of {system, user}", [&] {
    require(cider::model::render_chat(f, one) == turn, "render_chat({system, user}) == chat_user_turn(first)");
  });
  encode_all(tok, turn, true);

  // Later turns and reply ends, piece by piece as `cider chat` appends them.
  const std::string end = cider::model::chat_reply_end(f);
  for (const std::string& t : cider::model::chat_end_tokens(f)) {
    require(!t.empty(), "end tokens are non-empty");
    require(end.find(t) != std::string::npos, "chat_reply_end contains the format's end token");
    const int32_t id = tok.token_to_id(t);
    if (id >= 0 && tok.is_special(id)) {
      std::vector<int32_t> ids;
      cider::fuzz::expect_success("encoding a reply end", [&] { ids = tok.encode(end, false); });
      bool found = false;
      for (int32_t x : ids) found = found || x == id;
      require(found, "a special end token is encoded as its id");
    }
  }
  for (size_t i = first_user + 1; i < texts.size(); ++i) {
    encode_all(tok, std::string(texts[i]) + end, false);
    encode_all(tok, cider::model::chat_user_turn(f, texts[i], system, false), false);
  }

  // The whole conversation: system?, then user/assistant alternating; the roles possibly scrambled (then render_chat
  // may refuse it, but only with a cider::Error).
  std::vector<ChatMessage> conv;
  if (with_system && !texts.empty()) conv.push_back({"system", std::string(texts[0])});
  for (size_t i = first_user; i < texts.size(); ++i)
    conv.push_back({(i - first_user) % 2 == 0 ? "user" : "assistant", std::string(texts[i])});
  if (conv.empty() || conv.back().role != "user") conv.push_back({"user", ""});
  if (scramble_roles && conv.size() > 1) {
    const size_t k = data[1] % conv.size();
    static const char* roles[] = {"system", "user", "assistant", "tool", ""};
    conv[k].role = roles[(data[1] >> 3) % 5];
  }
  std::string rendered;
  if (scramble_roles) {
    cider::fuzz::expect_errors([&] { rendered = cider::model::render_chat(f, conv); });
  } else {
    cider::fuzz::expect_success("render_chat of a well-formed conversation",
                                [&] { rendered = cider::model::render_chat(f, conv); });
  }
  if (!rendered.empty()) encode_all(tok, rendered, true);
  return 0;
}
