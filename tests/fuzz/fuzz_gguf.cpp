// Fuzz harness: the input as a .gguf file -> GGUFFile::open, every metadata value read through the typed getters,
// every tensor's bytes touched and (when small) dequantized; then config_from_gguf and Tokenizer::from_gguf, each in
// its own try (a file can be a valid GGUF with an unusable config and a usable vocabulary, or the reverse).
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "kernels/kernel_table.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "quant/ggml_blocks.h"

namespace {

using cider::model::GGUFFile;
using cider::model::GGUFTensor;

using cider::fuzz::require;

volatile uint8_t g_sink;

// Dequantizing a tensor allocates numel floats: only small ones (the fixtures' are a few thousand elements).
constexpr uint64_t kMaxDequantElements = 1 << 16;

void exercise_file(const GGUFFile& g) {
  (void)g.version();
  for (const auto& kv : g.metadata()) {
    const std::string& key = kv.first;  // (clang 14 cannot capture structured bindings in lambdas)
    const cider::model::GGUFValue& value = kv.second;
    require(g.has(key), "has(key) for every metadata key");
    require(value.is_array || value.values.size() == 1, "a scalar holds one value");
    // Every getter on every key: a type mismatch must be a cider::Error, never anything else.
    cider::fuzz::expect_errors([&] { g_sink = static_cast<uint8_t>(g.get_string(key).size()); });
    cider::fuzz::expect_errors([&] { g_sink = static_cast<uint8_t>(g.get_int(key)); });
    cider::fuzz::expect_errors([&] { g_sink = static_cast<uint8_t>(g.get_float(key) != 0.0); });
    cider::fuzz::expect_errors([&] { g_sink = static_cast<uint8_t>(g.get_string_array(key).size()); });
    cider::fuzz::expect_errors([&] { g_sink = static_cast<uint8_t>(g.get_int_array(key).size()); });
    cider::fuzz::expect_errors([&] { g_sink = static_cast<uint8_t>(g.get_float_array(key).size()); });
  }
  cider::fuzz::expect_errors([&] { (void)g.get_string("no.such.key"); });

  for (const GGUFTensor& t : g.tensors()) {
    require(g.find(t.name) == &t, "find(name) returns the tensor");
    (void)cider::model::ggml_type_name(t.type);
    uint64_t numel = 1;  // unsigned: dimensions after a zero may multiply past int64
    for (int64_t d : t.shape) {
      require(d >= 0, "dimensions are non-negative");
      numel *= static_cast<uint64_t>(d);
    }
    require(t.nbytes == 0 || t.data != nullptr, "a sized tensor has data");
    uint8_t acc = 0;
    for (size_t i = 0; i < t.nbytes; ++i) acc = static_cast<uint8_t>(acc ^ t.data[i]);  // inside the mapping
    g_sink = acc;
    if (numel <= kMaxDequantElements) {
      (void)t.numel();
      std::vector<float> out(static_cast<size_t>(numel) + 1);
      cider::fuzz::expect_errors([&] { cider::model::dequantize_gguf_tensor(t, out.data()); });
      // --weights native: a 2-D tensor of a block format with kernels, multiplied as it is (M = 1: the int8 block
      // kernel of the active level) when its geometry is whole blocks. Not an empty one: [0, K] has no rows, and K
      // alone is unbounded (tests/fuzz/regressions/gguf/empty_tensor_with_a_huge_row_length).
      const cider::quant::GgmlBlockFormat* f = cider::quant::ggml_block_format(t.type);
      if (f != nullptr && f->integer_form && t.shape.size() == 2 && numel > 0 &&
          t.shape[1] % f->block_size == 0 &&
          t.nbytes == static_cast<uint64_t>(t.shape[0]) * static_cast<uint64_t>(cider::quant::ggml_row_bytes(*f, t.shape[1]))) {
        std::vector<float> x(static_cast<size_t>(t.shape[1]), 0.5f), y(static_cast<size_t>(t.shape[0]));
        cider::kernels::GgmlLinearArgs a{x.data(), t.data, t.type, cider::quant::ggml_row_bytes(*f, t.shape[1]),
                                         nullptr, y.data(), 1, t.shape[0], t.shape[1]};
        cider::kernels::active_kernels().ggml_linear(a);
        for (float v : y) g_sink = static_cast<uint8_t>(g_sink ^ static_cast<uint8_t>(v != v));
      }
    }
  }
}

void exercise_tokenizer(const cider::model::Tokenizer& tok) {
  const int64_t v = tok.vocab_size();
  require(v >= 1, "vocab_size >= 1");
  for (const char* text : {"Hello, world! 123", " \xc3\xa9t\xc3\xa9\n\tx", ""}) {
    cider::fuzz::expect_errors([&] {
      const std::vector<int32_t> ids = tok.encode(text, true);
      for (int32_t id : ids) require(id >= 0 && id < v, "encode returns ids inside the vocabulary");
      (void)tok.decode(ids, false);
      (void)tok.decode(ids, true);
    });
  }
  // The first and last ids of the vocabulary, and a few outside it.
  for (int64_t id : {int64_t{0}, v / 2, v - 1, v, int64_t{-1}}) {
    cider::fuzz::expect_errors([&] {
      (void)tok.id_to_token(static_cast<int32_t>(id));
      (void)tok.decode({static_cast<int32_t>(id)}, false);
      (void)tok.is_special(static_cast<int32_t>(id));
    });
  }
  (void)tok.bos_id();
  (void)tok.eos_ids();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static cider::fuzz::InputFile file("fuzz.gguf");
  const std::string& path = file.set(data, size);

  std::shared_ptr<const GGUFFile> g;
  cider::fuzz::expect_errors([&] { g = GGUFFile::open(path); });
  if (!g) return 0;
  exercise_file(*g);
  std::optional<cider::model::ModelConfig> config;
  cider::fuzz::expect_errors([&] { config = cider::model::config_from_gguf(*g); });
  if (config) {
    // A config read from GGUF must round-trip through cider's own JSON form (what `cider convert` stores).
    cider::fuzz::expect_success("config_from_json(config_to_json(config_from_gguf(...)))", [&] {
      const std::string j = cider::model::config_to_json(*config);
      const std::string j2 = cider::model::config_to_json(cider::model::config_from_json(j, "round trip"));
      require(j == j2, "config_to_json(config_from_json(config_to_json(c))) == config_to_json(c)");
    });
  }
  cider::fuzz::expect_errors([&] { exercise_tokenizer(cider::model::Tokenizer::from_gguf(*g)); });
  return 0;
}
