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
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace cider::model {

class ActivationStats {
 public:
  // Adds `rows` rows of a layer's input x (rows, K), row-major. A layer's K must stay the same (cider::Error
  // otherwise).
  void add(const std::string& layer, const float* x, int64_t rows, int64_t K);
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
  };
  std::map<std::string, Entry> layers_;
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
};
Importance read_importance(const std::string& path);

}  // namespace cider::model
