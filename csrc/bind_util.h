// Argument checks shared by the nanobind modules (_C and _cuda). Every
// failure names the argument and what was expected.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>

#include "common/dtypes.h"

namespace rcn_fast::bind {

namespace nb = nanobind;
using AnyArray = nb::ndarray<nb::ro>;

// uint16_is_bf16: numpy has no bfloat16; the Python layer passes ml_dtypes
// bfloat16 arrays as uint16 views and sets this flag.
inline DType float_dtype(const AnyArray& a, const char* name, bool uint16_is_bf16 = false) {
  const nb::dlpack::dtype t = a.dtype();
  if (t.lanes == 1) {
    if (uint16_is_bf16 && t.code == uint8_t(nb::dlpack::dtype_code::UInt) && t.bits == 16)
      return DType::BF16;
    if (t.code == uint8_t(nb::dlpack::dtype_code::Float) && t.bits == 32) return DType::F32;
    if (t.code == uint8_t(nb::dlpack::dtype_code::Float) && t.bits == 16) return DType::F16;
    if (t.code == uint8_t(nb::dlpack::dtype_code::Bfloat) && t.bits == 16) return DType::BF16;
  }
  throw nb::type_error((std::string(name) +
                        ": expected float32, float16 or bfloat16 elements (dlpack code " +
                        std::to_string(int(t.code)) + ", " + std::to_string(int(t.bits)) + " bits)")
                           .c_str());
}

inline void require_ndim(const AnyArray& a, size_t ndim, const char* name, const char* shape) {
  if (a.ndim() != ndim)
    throw nb::value_error((std::string(name) + ": expected a " + std::to_string(ndim) +
                           "-d array of shape " + shape + ", got " + std::to_string(a.ndim()) +
                           " dimension(s)")
                              .c_str());
}

// An empty array (some dimension 0) passes: it has no element to address,
// and exporters give it arbitrary strides (numpy's DLPack export gives 0).
inline void require_unit_inner_stride(const AnyArray& a, const char* name) {
  const size_t nd = a.ndim();
  for (size_t i = 0; i < nd; ++i)
    if (a.shape(i) == 0) return;
  if (nd > 0 && a.shape(nd - 1) > 1 && a.stride(nd - 1) != 1)
    throw nb::value_error((std::string(name) +
                           ": the last dimension must be contiguous (stride 1 element); "
                           "pass a contiguous copy")
                              .c_str());
  for (size_t i = 0; i < nd; ++i)
    if (a.stride(i) < 0)
      throw nb::value_error((std::string(name) + ": negative strides are not supported").c_str());
}

inline void require_device(const AnyArray& a, int device_type, const char* name, const char* where) {
  if (a.device_type() != device_type)
    throw nb::value_error((std::string(name) + ": expected an array in " + where + " memory").c_str());
}

}  // namespace rcn_fast::bind
