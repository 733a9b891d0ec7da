// decode()/encode(): numpy <-> raw codes through the exact scalar conversions of core/dtype.h.
//
// fp4 codes are UNPACKED here (one uint8 code 0..15 per element); packing two per byte is the
// caller's job, which keeps shapes identical between input and output.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {
namespace {

using InArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;
using InF32 = nb::ndarray<float, nb::ro, nb::c_contig, nb::device::cpu>;
using OutArray = nb::ndarray<nb::numpy>;

// The dtypes decode()/encode() accept, in the order dtype_names() lists them.
constexpr DType kCodecDTypes[] = {DType::kF32,     DType::kBF16, DType::kF16,
                                  DType::kFP8E4M3, DType::kE8M0, DType::kFP4E2M1};

DType codec_dtype(const std::string& name) {
  const DType d = dtype_from_name(name);
  for (DType c : kCodecDTypes) {
    if (c == d) return d;
  }
  DSV41RT_THROW_CODE(kUnsupported, "dtype '", name,
                     "' is not a float format; use f32, bf16, f16, fp8_e4m3, e8m0 or fp4_e2m1");
}

// numpy dtype of the code array for each format.
nb::dlpack::dtype code_dtype(DType d) {
  switch (d) {
    case DType::kF32:
      return nb::dtype<float>();
    case DType::kBF16:
    case DType::kF16:
      return nb::dtype<uint16_t>();
    default:
      return nb::dtype<uint8_t>();
  }
}

const char* code_dtype_name(DType d) {
  switch (d) {
    case DType::kF32:
      return "float32";
    case DType::kBF16:
    case DType::kF16:
      return "uint16";
    default:
      return "uint8";
  }
}

std::vector<size_t> shape_of(size_t ndim, const int64_t* dims, size_t* numel) {
  std::vector<size_t> shape(ndim);
  size_t n = 1;
  for (size_t i = 0; i < ndim; ++i) {
    shape[i] = static_cast<size_t>(dims[i]);
    n *= shape[i];
  }
  *numel = n;
  return shape;
}

// A fresh numpy array owning a new[] buffer (freed by the capsule when numpy drops it).
template <typename T>
OutArray new_array(const std::vector<size_t>& shape, size_t numel, T** out) {
  T* buf = new T[numel ? numel : 1];
  nb::capsule owner(buf, [](void* p) noexcept { delete[] static_cast<T*>(p); });
  *out = buf;
  return OutArray(buf, shape.size(), shape.data(), owner, nullptr, nb::dtype<T>());
}

OutArray decode(const InArray& codes, const std::string& dtype_name_str) {
  const DType d = codec_dtype(dtype_name_str);
  if (codes.dtype() != code_dtype(d)) {
    DSV41RT_THROW("decode(", dtype_name_str, ") expects a ", code_dtype_name(d), " array of codes");
  }
  size_t n = 0;
  std::vector<size_t> shape;
  {
    std::vector<int64_t> dims(codes.ndim());
    for (size_t i = 0; i < codes.ndim(); ++i) dims[i] = static_cast<int64_t>(codes.shape(i));
    shape = shape_of(codes.ndim(), dims.data(), &n);
  }
  float* out = nullptr;
  OutArray result = new_array<float>(shape, n, &out);
  const void* src = codes.data();
  if (d == DType::kFP4E2M1) {
    const auto* c = static_cast<const uint8_t*>(src);
    for (size_t i = 0; i < n; ++i) {
      DSV41RT_CHECK(c[i] < 16, "fp4_e2m1 code ", static_cast<int>(c[i]), " at flat index ", i,
                    " is out of range 0..15 (decode takes unpacked codes)");
    }
    nb::gil_scoped_release release;
    for (size_t i = 0; i < n; ++i) out[i] = fp4_e2m1_to_f32(c[i]);
  } else {
    nb::gil_scoped_release release;
    decode_to_f32(d, src, static_cast<int64_t>(n), out);
  }
  return result;
}

OutArray encode(const InF32& values, const std::string& dtype_name_str) {
  const DType d = codec_dtype(dtype_name_str);
  size_t n = 0;
  std::vector<int64_t> dims(values.ndim());
  for (size_t i = 0; i < values.ndim(); ++i) dims[i] = static_cast<int64_t>(values.shape(i));
  const std::vector<size_t> shape = shape_of(values.ndim(), dims.data(), &n);
  const float* src = values.data();
  switch (d) {
    case DType::kF32: {
      float* out = nullptr;
      OutArray result = new_array<float>(shape, n, &out);
      encode_from_f32(d, src, static_cast<int64_t>(n), out);
      return result;
    }
    case DType::kBF16:
    case DType::kF16: {
      uint16_t* out = nullptr;
      OutArray result = new_array<uint16_t>(shape, n, &out);
      nb::gil_scoped_release release;
      encode_from_f32(d, src, static_cast<int64_t>(n), out);
      return result;
    }
    case DType::kFP4E2M1: {
      uint8_t* out = nullptr;
      OutArray result = new_array<uint8_t>(shape, n, &out);
      nb::gil_scoped_release release;
      for (size_t i = 0; i < n; ++i) out[i] = f32_to_fp4_e2m1(src[i]);
      return result;
    }
    default: {
      uint8_t* out = nullptr;
      OutArray result = new_array<uint8_t>(shape, n, &out);
      nb::gil_scoped_release release;
      encode_from_f32(d, src, static_cast<int64_t>(n), out);
      return result;
    }
  }
}

}  // namespace

void register_dtype(nb::module_& m) {
  m.def(
      "dtype_names",
      [] {
        std::vector<std::string> names;
        for (DType d : kCodecDTypes) names.emplace_back(dtype_name(d));
        return names;
      },
      "Names accepted by decode()/encode(): f32, bf16, f16, fp8_e4m3, e8m0, fp4_e2m1.");
  m.def("decode", &decode, nb::arg("codes"), nb::arg("dtype"),
        "Decode raw codes to float32 (same shape). Codes: uint16 for bf16/f16, uint8 for "
        "fp8_e4m3/e8m0 and UNPACKED fp4_e2m1 (one code 0..15 per element), float32 for f32.");
  m.def("encode", &encode, nb::arg("values"), nb::arg("dtype"),
        "Encode float32 values to raw codes (same shape); inverse of decode(). fp8_e4m3 "
        "saturates to +-448; fp4_e2m1 yields unpacked codes; e8m0 rounds up to a power of two.");
}

}  // namespace dsv41rt::bindings
