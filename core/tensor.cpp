// Tensor and Storage: allocation on CPU and CUDA, views, copies between devices.
// Used by everything that holds numbers.
#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/cuda_runtime.h"

namespace lh {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i8: return "i8";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

std::string shape_string(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Result<std::shared_ptr<Storage>> Storage::allocate(size_t bytes, Device device) {
  size_t alloc = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  void* p = nullptr;
  if (device == Device::cpu) {
    p = std::aligned_alloc(64, alloc);
    if (!p) return Status(StatusCode::kUnavailable, "out of host memory allocating " + std::to_string(bytes) + " bytes");
  } else {
#if defined(LH_USE_CUDA)
    if (!cuda_available()) return unavailable("no CUDA device: " + cuda_device_summary());
    LH_CUDA_CHECK(cudaMalloc(&p, alloc));
#else
    return unavailable("this longhaul was built without CUDA (LH_CUDA=OFF or no nvcc at build time)");
#endif
  }
  return std::shared_ptr<Storage>(new Storage(p, bytes, device));
}

std::shared_ptr<Storage> Storage::borrow(void* data, size_t bytes, Device device) {
  return std::shared_ptr<Storage>(new Storage(data, bytes, device, /*owned=*/false));
}

Storage::~Storage() {
  if (!owned_) return;
  if (device_ == Device::cpu) {
    std::free(ptr_);
  } else {
#if defined(LH_USE_CUDA)
    cudaFree(ptr_);
#endif
  }
}

static Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t s = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    st[i] = s;
    s *= shape[i];
  }
  return st;
}

Result<Tensor> Tensor::create(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape)
    if (d < 0) return invalid_argument("negative dimension in shape " + shape_string(shape));
  Tensor t;
  LH_ASSIGN_OR_RETURN(t.storage_, Storage::allocate(shape_numel(shape) * dtype_size(dtype), device));
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

Tensor Tensor::borrow(void* data, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.storage_ = Storage::borrow(data, shape_numel(shape) * dtype_size(dtype), device);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  auto r = create(shape, dtype, Device::cpu);
  LH_ASSERT(r.ok(), r.status().to_string());
  return std::move(r).value();
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& v, const Shape& shape) {
  LH_ASSERT(static_cast<int64_t>(v.size()) == shape_numel(shape), "from_vector: size does not match shape");
  Tensor t = empty(shape, DType::f32);
  std::memcpy(t.raw_data(), v.data(), v.size() * sizeof(float));
  return t;
}

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

std::string Tensor::describe() const {
  return std::string(dtype_name(dtype_)) + shape_string(shape_) + " " + device_name(device_);
}

void* Tensor::raw_data() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_;
}

Tensor Tensor::view(const Shape& shape) const {
  LH_ASSERT(is_contiguous(), "view of a non-contiguous tensor " + describe());
  LH_ASSERT(shape_numel(shape) == numel(), "view " + shape_string(shape) + " of " + describe());
  Tensor t = *this;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  LH_ASSERT(ndim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "slice out of range of " + describe());
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.offset_ += static_cast<size_t>(begin * strides_[0]) * dtype_size(dtype_);
  return t;
}

Status copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  if (dst_dev == Device::cpu && src_dev == Device::cpu) {
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
#if defined(LH_USE_CUDA)
  cudaMemcpyKind kind = dst_dev == Device::cpu ? cudaMemcpyDeviceToHost
                        : src_dev == Device::cpu ? cudaMemcpyHostToDevice
                                                 : cudaMemcpyDeviceToDevice;
  LH_CUDA_CHECK(cudaMemcpy(dst, src, bytes, kind));
  return Status::Ok();
#else
  return unavailable("copy to or from CUDA memory in a build without CUDA");
#endif
}

Result<Tensor> Tensor::to(Device device) const {
  LH_ASSERT(is_contiguous(), "to() of a non-contiguous tensor");
  LH_ASSIGN_OR_RETURN(Tensor out, create(shape_, dtype_, device));
  LH_RETURN_IF_ERROR(copy_bytes(out.raw_data(), device, raw_data(), device_, nbytes()));
  return out;
}

Tensor Tensor::clone() const {
  auto r = to(Device::cpu);
  LH_ASSERT(r.ok(), r.status().to_string());
  return std::move(r).value();
}

Status Tensor::copy_from(const Tensor& src) {
  if (src.shape_ != shape_ || src.dtype_ != dtype_)
    return invalid_argument("copy_from: " + src.describe() + " into " + describe());
  LH_ASSERT(is_contiguous() && src.is_contiguous(), "copy_from with non-contiguous tensors");
  return copy_bytes(raw_data(), device_, src.raw_data(), src.device_, nbytes());
}

void Tensor::fill(float value) {
  LH_ASSERT(is_cpu() && dtype_ == DType::f32 && is_contiguous(), "fill() needs a contiguous CPU f32 tensor");
  float* p = data<float>();
  for (int64_t i = 0, n = numel(); i < n; ++i) p[i] = value;
}

Status Tensor::zero() {
  if (is_cpu()) {
    std::memset(raw_data(), 0, nbytes());
    return Status::Ok();
  }
#if defined(LH_USE_CUDA)
  LH_CUDA_CHECK(cudaMemset(raw_data(), 0, nbytes()));
  return Status::Ok();
#else
  return unavailable("CUDA tensor in a build without CUDA");
#endif
}

std::vector<float> Tensor::to_vector() const {
  LH_ASSERT(dtype_ == DType::f32 && is_contiguous(), "to_vector() needs a contiguous f32 tensor");
  std::vector<float> v(numel());
  Status s = copy_bytes(v.data(), Device::cpu, raw_data(), device_, nbytes());
  LH_ASSERT(s.ok(), s.to_string());
  return v;
}

}  // namespace lh
