// Small helpers shared by the reduce/nn/index/shape lowering files.
#pragma once
#include <cmath>
#include <limits>
#include <string>

#include "registry.h"

namespace tt::ops {
namespace nnutil {

// Index of the schema argument called `n`, or -1.
inline int ArgIndex(const LowerCtx& c, const char* n) {
  for (size_t i = 0; i < c.names.size(); ++i)
    if (c.names[i] == n) return (int)i;
  return -1;
}

// Identity element of max (is_max) / min for et.
inline Value MinMaxInit(Builder& b, ET et, bool is_max) {
  Type t(et, {});
  if (et == ET::PRED) return b.Constant(t, is_max ? "false" : "true");
  if (hlo::IsInt(et)) {
    std::string lit;
    bool u = hlo::IsUnsigned(et);
    int bits = hlo::ETBytes(et) * 8;
    if (is_max) {
      lit = u ? "0" : "-" + std::to_string((unsigned long long)1 << (bits - 1));
    } else {
      lit = u ? (bits == 64 ? std::to_string(std::numeric_limits<unsigned long long>::max())
                            : std::to_string(((unsigned long long)1 << bits) - 1))
              : std::to_string(((unsigned long long)1 << (bits - 1)) - 1);
    }
    return b.Constant(t, lit);
  }
  return b.Splat(t, is_max ? -INFINITY : INFINITY);
}


}  // namespace nnutil
using nnutil::ArgIndex;
using nnutil::MinMaxInit;
}  // namespace tt::ops
