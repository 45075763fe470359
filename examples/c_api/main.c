/* generate_c MODEL [PROMPT] [MAX_TOKENS]: loads a model, then decodes and samples token by token through the C API
 * (<cider/cider.h> only) and prints the continuation. */
#include <cider/cider.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                              \
  do {                                                                           \
    cider_status st_ = (call);                                                   \
    if (st_ != CIDER_OK) {                                                       \
      fprintf(stderr, "error %d: %s\n", (int)st_, cider_last_error());           \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

static int run(const char* path, const char* prompt, int64_t max_tokens) {
  cider_model* model = NULL;
  cider_session* session = NULL;
  cider_sampler* sampler = NULL;
  cider_model_info info;
  CHECK(cider_model_load(path, NULL, &model)); /* NULL options: bf16 weights, k8v4 cache, CPU */
  CHECK(cider_model_info_get(model, &info));
  fprintf(stderr, "%s: %s, vocab %lld, context %lld\n", path, info.architecture, (long long)info.vocab_size,
          (long long)info.context_length);

  int64_t n_prompt = 0;
  cider_tokenize(model, prompt, strlen(prompt), 1, NULL, 0, &n_prompt); /* asks the count */
  int32_t* tokens = malloc(sizeof(int32_t) * (size_t)(n_prompt + max_tokens));
  float* logits = malloc(sizeof(float) * (size_t)info.vocab_size);
  if (!tokens || !logits) return 1;
  CHECK(cider_tokenize(model, prompt, strlen(prompt), 1, tokens, n_prompt, &n_prompt));

  cider_sampler_params params = cider_sampler_params_default();
  params.temperature = 0.0; /* greedy */
  CHECK(cider_sampler_create(&params, &sampler));
  CHECK(cider_session_create(model, &session));

  int64_t n = n_prompt, fed = 0, generated = 0;
  while (generated < max_tokens && n < info.context_length) {
    CHECK(cider_decode(session, tokens + fed, n - fed, logits, (size_t)info.vocab_size, 0));
    fed = n;
    int32_t next = -1;
    CHECK(cider_sample(sampler, logits, info.vocab_size, tokens, n, &next));
    int is_eos = 0;
    for (int i = 0; i < info.num_eos; ++i) is_eos |= next == info.eos_ids[i];
    if (is_eos) break;
    tokens[n++] = next;
    ++generated;
  }

  size_t len = 0;
  cider_detokenize(model, tokens, n, 1, NULL, 0, &len); /* asks the length */
  char* text = malloc(len + 1);
  if (!text) return 1;
  CHECK(cider_detokenize(model, tokens, n, 1, text, len + 1, &len));
  printf("%s\n", text);
  fprintf(stderr, "%lld tokens generated\n", (long long)generated);

  free(text);
  free(logits);
  free(tokens);
  cider_sampler_free(sampler);
  cider_session_free(session);
  cider_model_free(model);
  return generated > 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL [PROMPT] [MAX_TOKENS]\n", argv[0]);
    return 2;
  }
  return run(argv[1], argc > 2 ? argv[2] : "Once upon a time", argc > 3 ? atoll(argv[3]) : 24);
}
