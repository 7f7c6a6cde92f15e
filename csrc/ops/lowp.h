// Low-precision float helpers shared by the lowerings (ops/lowp.cpp).
#pragma once
#include "registry.h"

namespace tt::ops {
// float8_* and float4 element types.
bool IsLowpFloat(ET t);
// A cast where v or et is a low-precision float, with PyTorch's semantics.
Value LowpCast(Builder& b, Value v, ET et);
// float8_e8m0fnu bits (held as u32) -> f32 (2^(bits-127); 0xff: NaN).
Value E8M0ToF32(Builder& b, Value bits_u32);
}  // namespace tt::ops
