// Fuzz harness: the input as a .safetensors file -> SafetensorsFile::open / SafetensorsSet::open_file, every tensor's
// metadata and data bytes touched and checked against the documented invariants. An input that starts with '{' is
// also tried as a model.safetensors.index.json next to two valid shards (SafetensorsSet::open_dir).
#include <cstdint>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz_common.h"
#include "model/safetensors.h"

namespace {

using cider::model::SafetensorsFile;
using cider::model::SafetensorsSet;
using cider::model::StTensor;

using cider::fuzz::require;

volatile uint8_t g_sink;

void touch(const StTensor& t) {
  uint64_t numel = 1;  // unsigned: a zero dimension after huge ones makes int64 partial products overflow
  for (int64_t d : t.shape) {
    require(d >= 0, "shape entries are non-negative");
    numel *= static_cast<uint64_t>(d);
  }
  require(numel * static_cast<uint64_t>(cider::dtype_size(t.dtype)) == t.nbytes, "nbytes == numel * dtype size");
  require(t.nbytes == 0 || t.data != nullptr, "non-empty tensors have data");
  // Every byte must be readable (inside the mapping): a tensor pointing past the file faults here.
  uint8_t acc = 0;
  for (size_t i = 0; i < t.nbytes; ++i) acc = static_cast<uint8_t>(acc ^ t.data[i]);
  g_sink = acc;
  const cider::TensorView v = t.view();
  require(static_cast<uint64_t>(v.numel()) == numel, "view numel");
  (void)cider::model::safetensors_dtype_name(t.dtype);
}

// A directory with small shards for the fuzzed index: every tensor the llama HF fixture's index lists, as F32 [1] in
// the shard the index names (so the fixture's index is a valid seed), written once.
const std::string& shard_dir() {
  static const std::string dir = [] {
    const std::string d = cider::fuzz::scratch_dir() + "/sharded";
    std::filesystem::create_directories(d);
    const nlohmann::json index =
        nlohmann::json::parse(cider::fuzz::read_fixture("tests/data/hf_fixtures/llama/model.safetensors.index.json"));
    std::map<std::string, cider::model::SafetensorsWriter> shards;
    static const float kOne = 1.0f;
    for (const auto& [name, shard] : index.at("weight_map").items())
      shards[shard.get<std::string>()].add(name, cider::DType::kF32, {1}, &kOne);
    for (const auto& [shard, writer] : shards) writer.write(d + "/" + shard);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static cider::fuzz::InputFile file("fuzz.safetensors");
  const std::string& path = file.set(data, size);

  cider::fuzz::expect_errors([&] {
    auto st = SafetensorsFile::open(path);
    for (const StTensor& t : st->tensors()) {
      touch(t);
      require(st->find(t.name) == &t, "find(name) returns the tensor");
    }
    require(st->find("__metadata__") == nullptr, "__metadata__ is not a tensor");
    size_t meta_bytes = 0;
    for (const auto& [k, v] : st->metadata()) meta_bytes += k.size() + v.size();
    g_sink = static_cast<uint8_t>(meta_bytes);
  });

  cider::fuzz::expect_errors([&] {
    const SafetensorsSet set = SafetensorsSet::open_file(path);
    for (const std::string& n : set.names()) {
      const StTensor* t = set.find(n);
      require(t != nullptr, "names() are findable");
    }
    (void)set.metadata();
  });

  if (size > 0 && data[0] == '{') {
    const std::string& dir = shard_dir();
    cider::fuzz::write_file(dir + "/model.safetensors.index.json",
                            std::string_view(reinterpret_cast<const char*>(data), size));
    cider::fuzz::expect_errors([&] {
      const SafetensorsSet set = SafetensorsSet::open_dir(dir);
      for (const std::string& n : set.names()) {
        const StTensor* t = set.find(n);
        require(t != nullptr, "names() are findable");
        touch(*t);
      }
      (void)set.metadata();
    });
  }
  return 0;
}
