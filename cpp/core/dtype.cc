#include "core/dtype.h"

#include <cstring>
#include <limits>

#include "core/status.h"

namespace dsv41rt {
namespace {

struct DTypeNames {
  DType dtype;
  const char* name;
  const char* safetensors;  // nullptr: not a safetensors dtype
  int bits;
};

constexpr DTypeNames kNames[] = {
    {DType::kF32, "f32", "F32", 32},      {DType::kBF16, "bf16", "BF16", 16},
    {DType::kF16, "f16", "F16", 16},      {DType::kFP8E4M3, "fp8_e4m3", "F8_E4M3", 8},
    {DType::kE8M0, "e8m0", "F8_E8M0", 8}, {DType::kFP4E2M1, "fp4_e2m1", nullptr, 4},
    {DType::kI8, "i8", "I8", 8},          {DType::kI32, "i32", "I32", 32},
    {DType::kI64, "i64", "I64", 64},      {DType::kU8, "u8", "U8", 8},
};

const DTypeNames& entry(DType dtype) {
  for (const auto& e : kNames) {
    if (e.dtype == dtype) return e;
  }
  DSV41RT_THROW_CODE(kInternal, "invalid DType value ", static_cast<int>(dtype));
}

template <typename T>
void cast_to_f32(const void* src, int64_t n, float* dst) {
  const T* s = static_cast<const T*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
}

}  // namespace

const char* dtype_name(DType dtype) { return entry(dtype).name; }

DType dtype_from_name(std::string_view name) {
  for (const auto& e : kNames) {
    if (name == e.name) return e.dtype;
  }
  DSV41RT_THROW("unknown dtype name '", name,
                "' (expected f32, bf16, f16, fp8_e4m3, e8m0, fp4_e2m1, i8, i32, i64, u8)");
}

DType dtype_from_safetensors(std::string_view name) {
  for (const auto& e : kNames) {
    if (e.safetensors != nullptr && name == e.safetensors) return e.dtype;
  }
  DSV41RT_THROW_CODE(kUnsupported, "unsupported safetensors dtype '", name,
                     "' (supported: F32, BF16, F16, F8_E4M3, F8_E8M0, I8, I32, I64, U8)");
}

const char* safetensors_name(DType dtype) {
  const auto& e = entry(dtype);
  DSV41RT_CHECK_CODE(kUnsupported, e.safetensors != nullptr, "dtype ", e.name,
                     " has no safetensors name (store packed fp4 as I8 or U8)");
  return e.safetensors;
}

int dtype_bits(DType dtype) { return entry(dtype).bits; }

int64_t bytes_for(DType dtype, int64_t numel) {
  DSV41RT_CHECK(numel >= 0, "negative element count ", numel);
  const int bits = dtype_bits(dtype);
  if (bits == 4) return numel / 2 + (numel & 1);
  const int64_t size = bits / 8;
  DSV41RT_CHECK_CODE(kOutOfRange, numel <= std::numeric_limits<int64_t>::max() / size,
                     "byte size of ", numel, " x ", dtype_name(dtype), " overflows int64");
  return numel * size;
}

namespace {

// Checks a conversion's arguments; false when it has no elements (the pointers may then be null).
bool has_elements(int64_t n, const void* src, const void* dst) {
  DSV41RT_CHECK(n >= 0, "negative element count ", n);
  if (n == 0) return false;
  DSV41RT_CHECK(src != nullptr && dst != nullptr, "null pointer");
  return true;
}

// A tensor's data may sit at any byte offset of its file (a 1-byte UE8M0 scale before it), so
// the 16-bit codes are read with memcpy: an unaligned uint16_t load is UB.
// The conversions are passed as lambdas (a type each, so each loop inlines its own).
template <typename Code, typename ToF32>
void decode_each(const void* src, int64_t n, float* dst, ToF32 to_f32) {
  const auto* s = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    Code code;
    std::memcpy(&code, s + sizeof(Code) * i, sizeof(Code));
    dst[i] = to_f32(code);
  }
}

template <typename Code, typename FromF32>
void encode_each(const float* src, int64_t n, void* dst, FromF32 from_f32) {
  auto* d = static_cast<Code*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = from_f32(src[i]);
}

}  // namespace

void decode_to_f32(DType dtype, const void* src, int64_t n, float* dst) {
  if (!has_elements(n, src, dst)) return;
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kBF16:
      return decode_each<uint16_t>(src, n, dst, [](uint16_t c) { return bf16_to_f32(c); });
    case DType::kF16:
      return decode_each<uint16_t>(src, n, dst, [](uint16_t c) { return f16_to_f32(c); });
    case DType::kFP8E4M3:
      return decode_each<uint8_t>(src, n, dst, [](uint8_t c) { return fp8_e4m3_to_f32(c); });
    case DType::kE8M0:
      return decode_each<uint8_t>(src, n, dst, [](uint8_t c) { return e8m0_to_f32(c); });
    case DType::kFP4E2M1: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t byte = s[i / 2];
        dst[i] = fp4_e2m1_to_f32((i & 1) ? fp4_unpack_hi(byte) : fp4_unpack_lo(byte));
      }
      return;
    }
    case DType::kI8:
      return cast_to_f32<int8_t>(src, n, dst);
    case DType::kI32:
      return cast_to_f32<int32_t>(src, n, dst);
    case DType::kI64:
      return cast_to_f32<int64_t>(src, n, dst);
    case DType::kU8:
      return cast_to_f32<uint8_t>(src, n, dst);
  }
  DSV41RT_THROW_CODE(kInternal, "invalid DType value ", static_cast<int>(dtype));
}

void encode_from_f32(DType dtype, const float* src, int64_t n, void* dst) {
  if (!has_elements(n, src, dst)) return;
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kBF16:
      return encode_each<uint16_t>(src, n, dst, [](float v) { return f32_to_bf16(v); });
    case DType::kF16:
      return encode_each<uint16_t>(src, n, dst, [](float v) { return f32_to_f16(v); });
    case DType::kFP8E4M3:
      return encode_each<uint8_t>(src, n, dst, [](float v) { return f32_to_fp8_e4m3(v); });
    case DType::kE8M0:
      return encode_each<uint8_t>(src, n, dst, [](float v) { return f32_to_e8m0(v); });
    case DType::kFP4E2M1: {
      auto* d = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i + 1 < n; i += 2) {
        d[i / 2] = fp4_pack(f32_to_fp4_e2m1(src[i]), f32_to_fp4_e2m1(src[i + 1]));
      }
      if (n & 1) d[n / 2] = fp4_pack(f32_to_fp4_e2m1(src[n - 1]), 0);
      return;
    }
    default:
      DSV41RT_THROW_CODE(kUnsupported, "encode_from_f32 does not support dtype ",
                         dtype_name(dtype));
  }
}

}  // namespace dsv41rt
