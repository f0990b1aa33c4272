// defines: lh::Tensor — shape, strides, dtype, device and shared owning storage (views share it).
// Used by ops, the model, codecs and the data plane.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace lh {

using Shape = std::vector<int64_t>;
std::string shape_string(const Shape& s);
int64_t shape_numel(const Shape& s);

// Raw device memory. CPU memory is 64-byte aligned host memory; CUDA memory is plain cudaMalloc.
class Storage {
 public:
  static Result<std::shared_ptr<Storage>> allocate(size_t bytes, Device device);
  // Memory someone else owns (a torch tensor's, a caller's buffer): never freed here; the owner keeps it alive as
  // long as any tensor over it.
  static std::shared_ptr<Storage> borrow(void* data, size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  Storage(void* p, size_t b, Device d, bool owned = true) : ptr_(p), bytes_(b), device_(d), owned_(owned) {}
  void* ptr_;
  size_t bytes_;
  Device device_;
  bool owned_ = true;
};

class Tensor {
 public:
  Tensor() = default;

  // Allocation that can fail (no CUDA device, out of memory): the Status says why.
  static Result<Tensor> create(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu);
  // CPU allocation, contents uninitialised / zero. Aborts only if host memory is exhausted.
  static Tensor empty(const Shape& shape, DType dtype = DType::f32);
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32);
  static Tensor from_vector(const std::vector<float>& v, const Shape& shape);
  // A contiguous tensor over memory the caller owns and keeps alive (and unmoved) while the tensor or a view of it
  // exists: the Python bindings hand torch tensors to codecs and collectives this way, without a copy.
  static Tensor borrow(void* data, const Shape& shape, DType dtype, Device device = Device::cpu);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? i + ndim() : i); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool is_cpu() const { return device_ == Device::cpu; }
  bool is_contiguous() const;
  std::string describe() const;  // "f32[4, 8] cpu"

  void* raw_data() const;
  template <class T>
  T* data() const {
    LH_ASSERT(sizeof(T) == dtype_size(dtype_), "data<T>() with a T of the wrong size for " + describe());
    return static_cast<T*>(raw_data());
  }
  // Element access for tests and reference loops (CPU, f32, contiguous).
  float& at(int64_t i) const { return data<float>()[i]; }

  // Views share storage. Contiguous tensors only; a bad request is an invariant violation.
  Tensor view(const Shape& shape) const;
  Tensor slice(int64_t begin, int64_t end) const;  // rows [begin, end) of dim 0

  // Copies.
  Result<Tensor> to(Device device) const;       // a contiguous copy on `device`
  Tensor clone() const;                          // CPU deep copy
  Status copy_from(const Tensor& src);           // same shape and dtype, any devices
  void fill(float value);                        // CPU f32
  Status zero();                                 // any device, any dtype

  std::vector<float> to_vector() const;          // CPU f32 contents (copies from CUDA if needed)

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  Shape shape_;
  Shape strides_;  // elements
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu;
};

// Byte copies between any two devices (cudaMemcpy when either side is CUDA).
Status copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes);

}  // namespace lh
