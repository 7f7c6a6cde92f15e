// Helpers shared by sort.cpp / index_scatter.cpp (torch-free).
#pragma once
#include "registry.h"

namespace tt::ops {
struct SortResult {
  Value values, indices;  // indices: s64 positions along dim
};
// "a before b" in ascending (descending) order with NaN as the largest value.
Value SortBefore(Builder& b, Value a, Value c, bool descending);
// Stable sort of x along dim; returns sorted values and original positions.
SortResult SortAlong(Builder& b, Value x, int64_t dim, bool descending);
// v gathered at per-element positions `pos` along dim (pos: v's shape but dim).
Value TakeAlong(Builder& b, Value v, Value pos, int64_t dim);
// Schema position of argument `name` (-1 if absent).
int ArgPos(const LowerCtx& c, const char* name);
// Inclusive prefix sum along dim (s64 or the input type).
Value PrefixSum(Builder& b, Value x, int64_t dim);
}  // namespace tt::ops
