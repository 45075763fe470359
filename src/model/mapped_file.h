// cider/model/mapped_file.h — a read-only memory-mapped file. Checkpoints are mapped, never read into memory:
// tensors that cider uses as they are (bf16/f32 weights) stay pages of the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace cider::model {

class MappedFile {
 public:
  // Maps the whole file read-only. Throws cider::Error (kIo) naming the path and the OS error.
  static std::shared_ptr<const MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace cider::model
