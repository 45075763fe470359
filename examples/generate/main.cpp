// generate MODEL [PROMPT] [MAX_TOKENS]: loads a model and continues the prompt greedily, streaming the text.
// Uses only the public C++ interface, <cider/cider.hpp>.
#include <cider/cider.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL [PROMPT] [MAX_TOKENS]\n", argv[0]);
    return 2;
  }
  try {
    cider::ModelOptions options;  // bf16 weights, k8v4 KV cache, CPU
    const cider::Model model = cider::Model::load(argv[1], options);
    const cider::ModelInfo info = model.info();
    std::fprintf(stderr, "%s: %s, vocab %lld, context %lld, weights %s, kv %s\n", argv[1], info.architecture.c_str(),
                 static_cast<long long>(info.vocab_size), static_cast<long long>(info.context_length),
                 info.weights.c_str(), info.kv.c_str());

    cider::Session session = model.new_session();
    cider::GenerateConfig config;
    config.max_tokens = argc > 3 ? std::atoll(argv[3]) : 24;
    config.sampler.temperature = 0.0;  // greedy: the same text every run
    const std::string prompt = argc > 2 ? argv[2] : "Once upon a time";
    std::printf("%s", prompt.c_str());
    const cider::Generation g = session.generate(prompt, config, [](std::string_view piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    });
    std::printf("\n");
    std::fprintf(stderr, "%zu tokens (stop: %s), %lld positions in the session, KV %zu bytes\n", g.tokens.size(),
                 cider::stop_reason_name(g.reason), static_cast<long long>(session.position()), session.kv_bytes());
    return g.tokens.empty() ? 1 : 0;
  } catch (const cider::Error& e) {
    std::fprintf(stderr, "error (%s): %s\n", cider::error_code_name(e.code()), e.what());
    return 1;
  }
}
