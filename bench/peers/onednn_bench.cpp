// oneDNN peer harness: s8 x s8 -> f32 matmul with per-output-channel scales fixed at primitive creation (the
// setting under which oneDNN 2.x picks its fast int8 kernels), weights reordered once into oneDNN's preferred
// layout. Case names match `cider bench`. Activations are given already quantized to s8 (cider's timed call also
// quantizes them). Built by tools/bench_peers.sh against Debian's libdnnl-dev; not part of the cider build.
#include <oneapi/dnnl/dnnl.hpp>

#include "common.h"

using namespace dnnl;

namespace {

void run(const peers::Options& o, engine& eng, stream& s, const std::string& name, long M, long N, long K) {
  if (!o.wants(name)) return;
  const memory::dims src_dims = {M, K}, wei_dims = {K, N}, dst_dims = {M, N};
  const memory::desc src_md(src_dims, memory::data_type::s8, memory::format_tag::ab);
  const memory::desc wei_any(wei_dims, memory::data_type::s8, memory::format_tag::any);
  const memory::desc dst_md(dst_dims, memory::data_type::f32, memory::format_tag::ab);
  std::vector<float> scales(static_cast<size_t>(N));
  for (long n = 0; n < N; ++n) scales[static_cast<size_t>(n)] = 1e-3f * (1.0f + static_cast<float>(n % 7) / 7.0f);
  primitive_attr attr;
  attr.set_output_scales(1 << 1, scales);
  const matmul::primitive_desc pd(matmul::desc(src_md, wei_any, dst_md), attr, eng);
  const matmul prim(pd);

  const size_t wbytes = static_cast<size_t>(N * K);
  const size_t copies = M == 1 ? peers::copies_for(wbytes, o.pool_mb) : 1;
  std::vector<int8_t> user(wbytes);
  std::vector<memory> weights;
  for (size_t c = 0; c < copies; ++c) {
    peers::fill_random(user.data(), wbytes, 100 + c);
    for (int8_t& v : user) v = v == -128 ? -127 : v;
    memory u({wei_dims, memory::data_type::s8, memory::format_tag::ba}, eng, user.data());  // [N, K] row-major
    memory w(pd.weights_desc(), eng);
    reorder(u, w).execute(s, u, w);
    weights.push_back(w);
  }
  s.wait();
  std::vector<int8_t> x(static_cast<size_t>(M * K));
  peers::fill_random(x.data(), x.size(), 7);
  memory src(src_md, eng, x.data()), dst(dst_md, eng);
  const std::vector<double> ms = peers::time_calls(M == 1 ? o.reps : std::max(3, o.reps / 4), [&](int i) {
    prim.execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights[static_cast<size_t>(i) % copies]},
                     {DNNL_ARG_DST, dst}});
    s.wait();
  });
  const std::string impl = pd.impl_info_str();
  peers::print_json("onednn", name, "s8s8f32 matmul (" + impl + ")", o.threads, M, N, K, ms,
                    static_cast<double>(wbytes), std::to_string(copies) + " weight copies");
}

}  // namespace

int main(int argc, char** argv) {
  const peers::Options o = peers::Options::parse(argc, argv);
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  run(o, eng, s, "w8a8_gemv_k4096_n14336_pc", 1, 14336, 4096);
  for (long N : {4096L, 14336L}) run(o, eng, s, "w8a8_gemm_m512_k4096_n" + std::to_string(N) + "_pc", 512, N, 4096);
  return 0;
}
