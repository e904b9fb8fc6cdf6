// binding_registry.h -- the fixed, light-weight C++ interface between kernels and Python.
//
// Read-only. Kernel binding files (kernels/*_binding.cpp) include only this header, never
// torch headers, so they compile in a fraction of a second. Each binding registers one
// Python-callable function on the module `cuda_extension`:
//
//   #include "binding_registry.h"
//   static cuda_ext::Outputs my_op(const cuda_ext::Args& args) {
//     const cuda_ext::Tensor& x = args.tensor(0);
//     CUDA_EXT_CHECK(x.is_contiguous(), "x must be contiguous");
//     cuda_ext::Tensor y = cuda_ext::empty_like(x);
//     my_op_launch(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), 0,
//                  cuda_ext::current_stream(x));
//     return {y};
//   }
//   REGISTER_BINDING(my_op, "my_op(x: Tensor) -> Tensor", my_op);
//
// Python then calls `cuda_extension.my_op(x)`. Arguments may be tensors, ints, floats and
// bools. Outputs must be tensors allocated with cuda_ext::empty / empty_like (or inputs).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace cuda_ext {

enum class DType : int { Float32, Float64, Float16, BFloat16, Int32, Int64, Int16, Int8, UInt8, Bool };

// A view of a torch tensor: data pointer, sizes and strides in elements, dtype, device.
// `device` is -1 for the CPU and the CUDA ordinal otherwise. `handle` keeps storage alive.
struct Tensor {
  void* data = nullptr;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  DType dtype = DType::Float32;
  int device = -1;
  std::shared_ptr<void> handle;

  int dim() const { return static_cast<int>(sizes.size()); }
  int64_t size(int d) const { return sizes.at(d < 0 ? d + dim() : d); }
  int64_t stride(int d) const { return strides.at(d < 0 ? d + dim() : d); }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : sizes) n *= s;
    return n;
  }
  bool is_cuda() const { return device >= 0; }
  bool is_contiguous() const {
    if (numel() == 0) return true;
    int64_t expected = 1;
    for (int d = dim() - 1; d >= 0; --d) {
      if (sizes[d] != 1 && strides[d] != expected) return false;
      expected *= sizes[d];
    }
    return true;
  }
  template <class T> T* data_ptr() const { return static_cast<T*>(data); }
};

using Value = std::variant<Tensor, int64_t, double, bool>;

// The positional arguments of one call from Python, with typed, checked accessors.
class Args {
 public:
  explicit Args(std::vector<Value> values) : values_(std::move(values)) {}
  size_t size() const { return values_.size(); }
  const Tensor& tensor(size_t i) const { return get<Tensor>(i, "a tensor"); }
  int64_t integer(size_t i) const { return get<int64_t>(i, "an int"); }
  bool boolean(size_t i) const { return get<bool>(i, "a bool"); }
  double real(size_t i) const {
    if (i < values_.size() && std::holds_alternative<int64_t>(values_[i]))
      return static_cast<double>(std::get<int64_t>(values_[i]));
    return get<double>(i, "a float");
  }

 private:
  template <class T> const T& get(size_t i, const char* what) const {
    if (i >= values_.size())
      throw std::invalid_argument("argument " + std::to_string(i) + " missing: got " +
                                  std::to_string(values_.size()) + " arguments");
    if (!std::holds_alternative<T>(values_[i]))
      throw std::invalid_argument("argument " + std::to_string(i) + " must be " + what);
    return std::get<T>(values_[i]);
  }
  std::vector<Value> values_;
};

// One tensor is returned to Python as a tensor, several as a tuple.
using Outputs = std::vector<Tensor>;
using BindingFn = std::function<Outputs(const Args&)>;

// Implemented by the fixed layer (binding.cpp), which owns the allocator and streams.
Tensor empty(const std::vector<int64_t>& sizes, DType dtype, int device);
inline Tensor empty_like(const Tensor& t) { return empty(t.sizes, t.dtype, t.device); }
// The current CUDA stream of the tensor's device, as a cudaStream_t (nullptr on the CPU).
void* current_stream(const Tensor& like);
bool register_binding(const char* name, const char* doc, BindingFn fn);

}  // namespace cuda_ext

#define CUDA_EXT_CHECK(cond, msg)                                                   \
  do {                                                                              \
    if (!(cond)) throw std::invalid_argument(std::string(__FILE__) + ":" +          \
                                             std::to_string(__LINE__) + ": " + (msg)); \
  } while (0)

#define CUDA_EXT_CONCAT_(a, b) a##b
#define CUDA_EXT_CONCAT(a, b) CUDA_EXT_CONCAT_(a, b)
#define REGISTER_BINDING(name, doc, fn)                                   \
  static const bool CUDA_EXT_CONCAT(cuda_ext_registered_, name) =         \
      ::cuda_ext::register_binding(#name, doc, fn)
