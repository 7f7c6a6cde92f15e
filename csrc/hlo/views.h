// Reading and writing strided views of a flat storage value. A storage is a
// 1-D array; a tensor is (sizes, strides, offset) over it. Reads decompose
// into slice/reshape/transpose/broadcast where the strides allow it and use a
// gather otherwise; writes are the inverse (dynamic_update_slice or scatter).
#pragma once
#include "builder.h"

namespace tt::hlo {

struct ViewSpec {
  Dims sizes, strides;
  int64_t offset = 0;
  int64_t numel() const;
  bool contiguous() const;
};

// Logical tensor of shape spec.sizes read from flat (1-D) `base`. `dyn_offset` (a 0-d s64
// value, contiguous views only): the view starts there instead of at spec.offset, so one
// program serves every offset (a ring buffer read at a moving position).
Value ReadView(Builder& b, Value base, const ViewSpec& spec, const Value* dyn_offset = nullptr);
// New flat base equal to `base` with `update` (shape spec.sizes) written through the view
// (`dyn_offset`: as in ReadView).
Value WriteView(Builder& b, Value base, Value update, const ViewSpec& spec, const Value* dyn_offset = nullptr);
// Reinterpret the bytes of a flat array as another element type (1-D result).
Value FlatBitcast(Builder& b, Value flat, ET to);

}  // namespace tt::hlo
