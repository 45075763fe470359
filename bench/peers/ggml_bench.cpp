// llama.cpp-kernel peer harness (the ggml library, built from a snapshot outside the repository by
// tools/bench_peers.sh): mul_mat with q8_0, q4_0 (in the CPU_REPACK buffer, llama.cpp's load-time x86 layout) and
// bf16/f32 weights on the CPU backend. ggml quantizes the f32 activations to q8_0 inside the call, as cider's kernels
// quantize theirs. GEMV weights rotate over distinct random copies (--pool-mb). Case names match `cider bench`.
#include <cstring>
#include <string>
#include <vector>

#include "common.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

namespace {

ggml_backend_buffer_type_t find_buft(ggml_backend_t backend, const char* name) {
  ggml_backend_dev_t dev = ggml_backend_get_device(backend);
  if (std::strcmp(name, "CPU") == 0) return ggml_backend_dev_buffer_type(dev);
  ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
  auto get_extra = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
      ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts"));
  if (!get_extra) return nullptr;
  for (ggml_backend_buffer_type_t* b = get_extra(dev); b && *b; ++b)
    if (std::strcmp(ggml_backend_buft_name(*b), name) == 0) return *b;
  return nullptr;
}

// Random weights of `type`: block scales set to small normal halves, quants random.
void fill_weights(std::vector<uint8_t>& host, ggml_type type, uint64_t seed) {
  peers::fill_random(host.data(), host.size(), seed);
  const uint16_t d = 0x1400;  // f16 ≈ 0.00098
  if (type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q5_0) {
    const size_t bs = ggml_type_size(type);
    for (size_t i = 0; i + bs <= host.size(); i += bs) std::memcpy(host.data() + i, &d, 2);
  } else if (type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K) {  // d (and dmin) finite: at 0/2, or 208 for Q6_K
    const size_t bs = ggml_type_size(type);
    for (size_t i = 0; i + bs <= host.size(); i += bs) {
      if (type == GGML_TYPE_Q4_K) {
        std::memcpy(host.data() + i, &d, 2);
        std::memcpy(host.data() + i + 2, &d, 2);
      } else {
        std::memcpy(host.data() + i + 208, &d, 2);
      }
    }
  } else if (type == GGML_TYPE_BF16) {
    for (size_t i = 0; i + 2 <= host.size(); i += 2) host[i + 1] = static_cast<uint8_t>(0x3c | (host[i + 1] & 0x80));
  } else if (type == GGML_TYPE_F32) {
    for (size_t i = 0; i + 4 <= host.size(); i += 4) host[i + 3] = static_cast<uint8_t>(0x3c | (host[i + 3] & 0x80));
  }
}

void run(const peers::Options& o, ggml_backend_t backend, const std::string& name, ggml_type type, const char* buft_name,
         long M, long N, long K) {
  if (!o.wants(name)) return;
  ggml_backend_buffer_type_t buft = find_buft(backend, buft_name);
  if (!buft) {
    std::fprintf(stderr, "ggml_bench: no buffer type %s\n", buft_name);
    return;
  }
  const size_t wbytes = ggml_row_size(type, K) * static_cast<size_t>(N);
  const size_t copies = M == 1 ? peers::copies_for(wbytes, o.pool_mb) : 1;
  ggml_init_params wp = {ggml_tensor_overhead() * (copies + 1), nullptr, true};
  ggml_context* wctx = ggml_init(wp);
  std::vector<ggml_tensor*> w;
  for (size_t c = 0; c < copies; ++c) w.push_back(ggml_new_tensor_2d(wctx, type, K, N));
  ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, buft);
  std::vector<uint8_t> host(wbytes);
  for (size_t c = 0; c < copies; ++c) {
    fill_weights(host, type, 200 + c);
    ggml_backend_tensor_set(w[c], host.data(), 0, wbytes);
  }
  ggml_init_params gp = {ggml_tensor_overhead() * (2 * copies + 4) + ggml_graph_overhead() * copies, nullptr, true};
  ggml_context* gctx = ggml_init(gp);
  ggml_tensor* x = ggml_new_tensor_2d(gctx, GGML_TYPE_F32, K, M);
  std::vector<ggml_cgraph*> graphs;
  for (size_t c = 0; c < copies; ++c) {
    ggml_cgraph* g = ggml_new_graph(gctx);
    ggml_build_forward_expand(g, ggml_mul_mat(gctx, w[c], x));
    graphs.push_back(g);
  }
  ggml_backend_buffer_t gbuf = ggml_backend_alloc_ctx_tensors(gctx, backend);
  std::vector<float> xs(static_cast<size_t>(M * K));
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
  ggml_backend_tensor_set(x, xs.data(), 0, xs.size() * 4);
  const std::vector<double> ms = peers::time_calls(M == 1 ? o.reps : std::max(3, o.reps / 4), [&](int i) {
    ggml_backend_graph_compute(backend, graphs[static_cast<size_t>(i) % copies]);
  });
  peers::print_json("llama.cpp", name, std::string("ggml mul_mat ") + ggml_type_name(type) + " (" + buft_name + ")",
                    o.threads, M, N, K, ms, static_cast<double>(wbytes), std::to_string(copies) + " weight copies");
  ggml_backend_buffer_free(gbuf);
  ggml_free(gctx);
  ggml_backend_buffer_free(wbuf);
  ggml_free(wctx);
}

}  // namespace

int main(int argc, char** argv) {
  const peers::Options o = peers::Options::parse(argc, argv);
  ggml_backend_t backend = ggml_backend_cpu_init();
  ggml_backend_cpu_set_n_threads(backend, o.threads);
  run(o, backend, "w8a8_gemv_k4096_n14336_pc", GGML_TYPE_Q8_0, "CPU", 1, 14336, 4096);
  run(o, backend, "w4a8_gemv_k4096_n14336_pc", GGML_TYPE_Q4_0, "CPU_REPACK", 1, 14336, 4096);
  run(o, backend, "w4a8_gemv_k4096_n14336_pc:plain", GGML_TYPE_Q4_0, "CPU", 1, 14336, 4096);
  for (long N : {4096L, 14336L})
    run(o, backend, "w8a8_gemm_m512_k4096_n" + std::to_string(N) + "_pc", GGML_TYPE_Q8_0, "CPU", 512, N, 4096);
  run(o, backend, "w4a8_gemm_m512_k4096_n4096_pc", GGML_TYPE_Q4_0, "CPU_REPACK", 512, 4096, 4096);
  // Native GGUF weights: the same formats multiplied as they are (cider's ggml_linear cases).
  run(o, backend, "ggml_q8_0_gemv_k4096_n14336", GGML_TYPE_Q8_0, "CPU", 1, 14336, 4096);
  run(o, backend, "ggml_q4_k_gemv_k4096_n14336", GGML_TYPE_Q4_K, "CPU", 1, 14336, 4096);
  run(o, backend, "ggml_q6_k_gemv_k4096_n14336", GGML_TYPE_Q6_K, "CPU", 1, 14336, 4096);
  run(o, backend, "ggml_q5_0_gemv_k4096_n14336", GGML_TYPE_Q5_0, "CPU", 1, 14336, 4096);
  run(o, backend, "ggml_q4_0_gemv_k4096_n14336", GGML_TYPE_Q4_0, "CPU", 1, 14336, 4096);
  run(o, backend, "ggml_q8_0_gemv_k640_n262144", GGML_TYPE_Q8_0, "CPU", 1, 262144, 640);
  run(o, backend, "ggml_q5_0_gemv_k640_n2048", GGML_TYPE_Q5_0, "CPU", 1, 2048, 640);  // Gemma 3 270M's layers
  run(o, backend, "ggml_q8_0_gemv_k640_n256", GGML_TYPE_Q8_0, "CPU", 1, 256, 640);
  run(o, backend, "ggml_q4_k_gemv_k1024_n640", GGML_TYPE_Q4_K, "CPU", 1, 640, 1024);
  run(o, backend, "ggml_q6_k_gemv_k2048_n640", GGML_TYPE_Q6_K, "CPU", 1, 640, 2048);
  run(o, backend, "ggml_q4_k_gemm_m512_k4096_n4096", GGML_TYPE_Q4_K, "CPU", 512, 4096, 4096);
  run(o, backend, "ggml_q6_k_gemm_m512_k4096_n4096", GGML_TYPE_Q6_K, "CPU", 512, 4096, 4096);
  run(o, backend, "ggml_q8_0_gemm_m512_k4096_n4096", GGML_TYPE_Q8_0, "CPU", 512, 4096, 4096);
  run(o, backend, "ggml_q5_0_gemm_m512_k640_n2048", GGML_TYPE_Q5_0, "CPU", 512, 2048, 640);  // Gemma 3 270M's MLP
  run(o, backend, "dense_bfloat16_gemv_k4096_n14336", GGML_TYPE_BF16, "CPU", 1, 14336, 4096);
  run(o, backend, "dense_bfloat16_gemm_m512_k4096_n4096", GGML_TYPE_BF16, "CPU", 512, 4096, 4096);
  ggml_backend_free(backend);
  return 0;
}
