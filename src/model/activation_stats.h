// cider/model/activation_stats.h — activation statistics of the linear layers over a calibration text
// (`cider imatrix`), and the importance file they are saved as, which a requantizing weight format reads
// (`--imatrix FILE`).
//
// For a linear layer y = W·x (W: (N, K)), quantizing W to Ŵ changes the output by (W − Ŵ)·x, whose expected square
// over the inputs is Σ_n Σ_k (W − Ŵ)²_nk · E[x_k²] when the input channels are uncorrelated: the error of weight
// (n, k) counts by the mean square of input channel k. So each layer's statistic is that mean, one value per input
// channel (the diagonal of the inputs' second-moment matrix, llama.cpp's "importance matrix"), and the block encoder
// (quant/ggml_quantize.h) minimises the error weighted by it instead of the plain squared error.
//
// File: safetensors (model/safetensors.h), one F32 tensor (K) per layer named "<module>.act_sq" (the module path as the
// loader names it, "model.layers.0.self_attn.q_proj"), mean squared activation over the calibration rows; metadata
// format = "cider-imatrix", version = "1", rows_<module> = the rows each was averaged over, tokens = the calibration
// tokens, text = the calibration file's name.
// With second moments (`cider imatrix --hessian`), also "<module>.hessian" F32 (K, K): the mean of x xᵀ over the
// rows (its diagonal is act_sq), for GPTQ's error feedback (quant/gptq.h). Layers fed the same input (q/k/v, gate/up)
// share one: the others name it in metadata hessian_of_<module> = <module that holds it>.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace cider::model {

class ActivationStats {
 public:
  // Adds `rows` rows of a layer's input x (rows, K), row-major. A layer's K must stay the same (cider::Error
  // otherwise).
  // With second moments on, also x's rows into the layer's mean of x xᵀ (a layer whose input is, row for row, the one
  // the previous call saw shares that layer's).
  void add(const std::string& layer, const float* x, int64_t rows, int64_t K);
  // Second moments for the layers whose K is at most max_k (0: none). They cost K² floats each, and GPTQ's factor
  // O(K³) at load: wider layers keep the diagonal alone.
  void set_second_moments(int64_t max_k) { second_moments_max_k_ = max_k; }
  int64_t second_moment_layers() const;  // layers with second moments (their own or shared)
  int64_t rows(const std::string& layer) const;  // 0 when never seen
  // The mean square of each input channel of `layer` (K values); empty when never seen.
  std::vector<float> mean_square(const std::string& layer) const;
  std::vector<std::string> layers() const;  // sorted
  // Writes the importance file (atomically: model/safetensors.h); `tokens` and `text` go to its metadata.
  void write(const std::string& path, int64_t tokens, const std::string& text) const;

 private:
  struct Entry {
    std::vector<double> sum_sq;
    int64_t rows = 0;
    std::vector<float> sum_xxt;  // (K, K), upper triangle: Σ x xᵀ (second moments on, not shared)
    std::string shares;           // the layer whose Σ x xᵀ this one's input equals
  };
  std::map<std::string, Entry> layers_;
  int64_t second_moments_max_k_ = 0;
  // The previous add, when it was a layer's first: its layer (or the one it shares) and a hash of its input, to find
  // layers fed the same input.
  std::string last_layer_;
  uint64_t last_hash_ = 0;
};

// An importance file read back: layer → its K mean squares, each finite and >= 0.
//   * cider's file (above): keyed by module path;
//   * llama.cpp's (`llama-imatrix`'s GGUF: general.type = "imatrix", per weight "<name>.in_sum2" F32 (n_mat, K) sums
//     of squares and "<name>.counts" F32 (n_mat, 1) rows summed): keyed by GGUF tensor name ("blk.0.attn_q.weight"),
//     mean = in_sum2 / counts; a stacked-expert entry (n_mat > 1) is not used (those layers get plain fits).
// Anything else (neither format, a tensor of the wrong type, shape or name, a negative or non-finite value) is a
// cider::Error (kCorrupt) naming the file, the tensor and the value.
struct Importance {
  std::map<std::string, std::vector<float>> layers;
  bool gguf_names = false;  // keyed by GGUF tensor names (llama.cpp's file)
  // cider's file with second moments: layer → its (K, K) mean of x xᵀ (shared by layers fed the same input).
  std::map<std::string, std::shared_ptr<const std::vector<float>>> second_moments;
};
Importance read_importance(const std::string& path);

}  // namespace cider::model
