// Low-precision floats (float8_*, float4_e2m1fn_x2): casts with PyTorch's
// semantics, and the block-scaled matmuls (torch._scaled_mm, _scaled_mm_v2,
// torchtpu::block_scaled_mm).
//
// Casts. c10 defines every 8-bit float by its conversions to and from float32
// (double, half, bfloat16 and integers go through float), so a cast touching
// one of them goes through f32 here too. XLA's `convert` already rounds to
// nearest even; where PyTorch differs from it we fix it up:
//   * float8_e4m3fn saturates: finite overflow and ±inf become ±448 (XLA: NaN);
//   * float8_e8m0fnu ignores the sign and rounds the exponent up when the
//     mantissa's top bit is set (c10's fp8e8m0fnu_from_fp32_value), 0 is
//     2^-127 and 0xff is NaN: built from the bits.
//   * float8_e5m2's NaN is 0x7f/0xff by the sign (XLA: 0x7e, unsigned).
// float8_e5m2 overflow (-> inf) and the fnuz types (overflow -> NaN 0x80) are
// XLA's convert as is; tests/test_lowp.py checks every bit pattern and a
// dense grid of floats against CPU PyTorch.
#include "lowp.h"

namespace tt::ops {

bool IsLowpFloat(ET t) {
  switch (t) {
    case ET::F8E4M3FN: case ET::F8E5M2: case ET::F8E8M0FNU: case ET::F4E2M1FN:
    case ET::F8E4M3FNUZ: case ET::F8E5M2FNUZ:
      return true;
    default: return false;
  }
}

static Value U32(Builder& b, const Dims& d, double v) { return b.Splat(Type(ET::U32, d), v); }

// float8_e8m0fnu bits (as u32) -> f32, exactly c10's operator float().
Value E8M0ToF32(Builder& b, Value bits_u32) {
  const Dims& d = bits_u32.dims();
  Value pow2 = b.Binary("shift_left", bits_u32, U32(b, d, 23));
  Value r = b.Select(b.Compare(bits_u32, U32(b, d, 0), "EQ"), U32(b, d, 0x00400000), pow2);
  r = b.Select(b.Compare(bits_u32, U32(b, d, 255), "EQ"), U32(b, d, 0x7f800001), r);
  return b.BitcastConvert(r, Type(ET::F32, d));
}

// f32 -> float8_e8m0fnu bits (as u32): c10's fp8e8m0fnu_from_fp32_value.
static Value F32ToE8M0Bits(Builder& b, Value f) {
  const Dims& d = f.dims();
  Value u = b.BitcastConvert(f, Type(ET::U32, d));
  Value e = b.Binary("and", b.Binary("shift_right_logical", u, U32(b, d, 23)), U32(b, d, 255));
  auto nz = [&](double mask) {
    return b.Compare(b.Binary("and", u, U32(b, d, mask)), U32(b, d, 0), "NE");
  };
  Value g = nz(0x400000), rs = nz(0x3FFFFF), lsb = b.Compare(e, U32(b, d, 0), "GT");
  Value up = b.Binary("and", g, b.Binary("or", rs, lsb));
  up = b.Binary("and", up, b.Compare(e, U32(b, d, 255), "NE"));  // inf/NaN stay 0xff
  return b.Add(e, b.Convert(up, ET::U32));
}

// An exact f32 value of a low-precision float.
static Value LowpToF32(Builder& b, Value v) {
  if (v.et() == ET::F8E8M0FNU) {
    Value bits = b.BitcastConvert(v, v.type.with_et(ET::U8));
    return E8M0ToF32(b, b.Convert(bits, ET::U32));
  }
  return b.Convert(v, ET::F32);
}

static Value F32ToLowp(Builder& b, Value f, ET et) {
  const Dims& d = f.dims();
  if (et == ET::F8E8M0FNU) {
    Value bits = b.Convert(F32ToE8M0Bits(b, f), ET::U8);
    return b.BitcastConvert(bits, Type(et, d));
  }
  if (et == ET::F8E4M3FN) {  // saturate (NaN compares false and stays NaN)
    Value hi = b.Splat(f.type, 448.0), lo = b.Splat(f.type, -448.0);
    f = b.Select(b.Compare(f, hi, "GT"), hi, f);
    f = b.Select(b.Compare(f, lo, "LT"), lo, f);
  }
  Value r = b.Convert(f, et);
  if (et == ET::F8E5M2) {  // NaN: c10 keeps the sign and sets every mantissa bit (XLA: 0x7e)
    Value sign = b.Binary("shift_right_logical", b.BitcastConvert(f, Type(ET::U32, d)), U32(b, d, 24));
    sign = b.Binary("and", sign, U32(b, d, 0x80));
    Value nan = b.Convert(b.Binary("or", sign, U32(b, d, 0x7f)), ET::U8);
    // select on the bytes: XLA:CPU computes f8 ops in a wider float, which
    // would canonicalize the NaN again
    Value rb = b.BitcastConvert(r, Type(ET::U8, d));
    r = b.BitcastConvert(b.Select(b.Compare(f, f, "NE"), nan, rb), Type(et, d));
  }
  return r;
}

Value LowpCast(Builder& b, Value v, ET et) {
  if (v.et() == et) return v;
  if (IsLowpFloat(v.et())) return Cast(b, LowpToF32(b, v), et);
  return F32ToLowp(b, Cast(b, v, ET::F32), et);
}

}  // namespace tt::ops
