#include "views.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace tt::hlo {

int64_t ViewSpec::numel() const {
  int64_t n = 1;
  for (auto s : sizes) n *= s;
  return n;
}

bool ViewSpec::contiguous() const {
  int64_t expect = 1;
  for (int i = (int)sizes.size() - 1; i >= 0; --i) {
    if (sizes[i] == 1) continue;
    if (strides[i] != expect) return false;
    expect *= sizes[i];
  }
  return true;
}

namespace {

// Structured decomposition of a view; see ReadView.
struct Plan {
  bool ok = false;
  std::vector<int> order;   // the "real" dims (size>1, stride>0), sorted by stride ascending
  Dims base_shape;          // major -> minor
  Dims starts, limits;      // slice of base_shape
  int64_t L = 0;            // flat length covered by base_shape
};

Plan MakePlan(const ViewSpec& s) {
  Plan p;
  int r = (int)s.sizes.size();
  for (int i = 0; i < r; ++i)
    if (s.sizes[i] > 1 && s.strides[i] != 0) {
      if (s.strides[i] < 0) return p;
      p.order.push_back(i);
    }
  std::stable_sort(p.order.begin(), p.order.end(),
                   [&](int a, int b) { return s.strides[a] < s.strides[b]; });
  int k = (int)p.order.size();
  int64_t o = s.offset;
  if (k == 0) {
    p.base_shape = {o + 1};
    p.starts = {o};
    p.limits = {o + 1};
    p.L = o + 1;
    p.ok = true;
    return p;
  }
  std::vector<int64_t> st(k), n(k);
  for (int j = 0; j < k; ++j) {
    st[j] = s.strides[p.order[j]];
    n[j] = s.sizes[p.order[j]];
  }
  for (int j = 0; j + 1 < k; ++j)
    if (st[j + 1] % st[j] != 0 || st[j + 1] < st[j] * n[j]) return p;
  // minor -> major radices
  Dims radix, off;
  radix.push_back(st[0]);
  off.push_back(o % st[0]);
  int64_t rem = o / st[0];
  for (int j = 0; j + 1 < k; ++j) {
    int64_t bj = st[j + 1] / st[j];
    radix.push_back(bj);
    off.push_back(rem % bj);
    rem /= bj;
    if (off.back() + n[j] > bj) return p;
  }
  radix.push_back(rem + n[k - 1]);
  off.push_back(rem);
  // major -> minor
  p.base_shape.assign(radix.rbegin(), radix.rend());
  Dims offs(off.rbegin(), off.rend());
  p.starts = offs;
  p.limits = offs;
  p.limits.back() += 1;  // inner dim: one element
  for (int j = 0; j < k; ++j) p.limits[k - 1 - j] = offs[k - 1 - j] + n[j];
  p.L = 1;
  for (auto d : p.base_shape) p.L *= d;
  p.ok = true;
  return p;
}

// Flat base resized to length L (slice or zero pad).
Value FitLength(Builder& b, Value flat, int64_t L) {
  int64_t S = flat.dims()[0];
  if (L == S) return flat;
  if (L < S) return b.Slice(flat, {0}, {L}, {1});
  return b.Pad(flat, b.Zeros(Type(flat.et(), {})), {0}, {L - S}, {0});
}

// i64 flat indices of every element of the view, shape spec.sizes.
Value IndexGrid(Builder& b, const ViewSpec& s) {
  Type t(ET::S64, s.sizes);
  Value idx = b.Splat(t, (double)s.offset);
  for (int i = 0; i < (int)s.sizes.size(); ++i) {
    if (s.sizes[i] == 1 || s.strides[i] == 0) continue;
    Value io = b.Iota(t, i);
    idx = b.Add(idx, b.Mul(io, b.Splat(t, (double)s.strides[i])));
  }
  return idx;
}

}  // namespace

Value ReadView(Builder& b, Value base, const ViewSpec& s, const Value* dyn_offset) {
  int64_t numel = s.numel();
  Type out(base.et(), s.sizes);
  if (numel == 0) return b.Zeros(out);
  int64_t S = base.dims()[0];
  if (s.contiguous()) {
    if (dyn_offset) {
      Value v = b.Op1("stablehlo.dynamic_slice", {base, *dyn_offset}, Type(base.et(), {numel}),
                      "slice_sizes = " + I64Array({numel}));
      return b.Reshape(v, s.sizes);
    }
    Value v = b.Slice(base, {s.offset}, {s.offset + numel}, {1});
    return b.Reshape(v, s.sizes);
  }
  Plan p = MakePlan(s);
  if (p.ok) {
    Value v = FitLength(b, base, p.L);
    v = b.Reshape(v, p.base_shape);
    Dims ones(p.base_shape.size(), 1);
    v = b.Slice(v, p.starts, p.limits, ones);
    int k = (int)p.order.size();
    // now [n_{k-1}, ..., n_0, 1]: drop the inner 1, order major->minor = reversed p.order
    Dims real_dims;
    for (int j = k - 1; j >= 0; --j) real_dims.push_back(s.sizes[p.order[j]]);
    v = b.Reshape(v, real_dims);
    // transpose into ascending original-dim order
    std::vector<int> major_order(p.order.rbegin(), p.order.rend());
    std::vector<int> sorted = major_order;
    std::sort(sorted.begin(), sorted.end());
    Dims perm;
    for (int d : sorted)
      perm.push_back(std::find(major_order.begin(), major_order.end(), d) - major_order.begin());
    v = b.Transpose(v, perm);
    // insert size-1 / broadcast dims
    Dims bdims;
    for (int d : sorted) bdims.push_back(d);
    return b.Broadcast(v, s.sizes, bdims);
  }
  // General case (overlapping windows, unusual strides): gather.
  Value idx = b.Reshape(IndexGrid(b, s), {numel, 1});
  (void)S;
  Value g = b.Op1("stablehlo.gather", {base, idx}, Type(base.et(), {numel}),
                  "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], "
                  "start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1>, "
                  "indices_are_sorted = false");
  return b.Reshape(g, s.sizes);
}

Value WriteView(Builder& b, Value base, Value update, const ViewSpec& s, const Value* dyn_offset) {
  int64_t numel = s.numel();
  int64_t S = base.dims()[0];
  if (numel == 0) return base;
  update = b.Convert(update, base.et());
  if (s.contiguous()) {
    Value u = b.Reshape(update, {numel});
    if (s.offset == 0 && numel == S && !dyn_offset) return u;
    return b.DynamicUpdateSlice(base, u, {dyn_offset ? *dyn_offset : b.ScalarConst(ET::S64, (double)s.offset)});
  }
  // Expanded (stride 0) dims: every alias holds the same value; keep one.
  ViewSpec t = s;
  {
    Dims start(s.sizes.size(), 0), limit = s.sizes, strides(s.sizes.size(), 1);
    bool any = false;
    for (size_t i = 0; i < s.sizes.size(); ++i)
      if (s.strides[i] == 0 && s.sizes[i] > 1) {
        limit[i] = 1;
        t.sizes[i] = 1;
        any = true;
      }
    if (any) update = b.Slice(update, start, limit, strides);
  }
  Plan p = MakePlan(t);
  if (p.ok) {
    int k = (int)p.order.size();
    std::vector<int> major_order(p.order.rbegin(), p.order.rend());
    Dims real_dims;
    for (int d : major_order) real_dims.push_back(t.sizes[d]);
    // drop size-1 dims, then transpose ascending -> major order
    std::vector<int> sorted = major_order;
    std::sort(sorted.begin(), sorted.end());
    Dims sorted_sizes;
    for (int d : sorted) sorted_sizes.push_back(t.sizes[d]);
    Value u = b.Reshape(update, sorted_sizes);
    Dims perm;
    for (int d : major_order)
      perm.push_back(std::find(sorted.begin(), sorted.end(), d) - sorted.begin());
    u = b.Transpose(u, perm);
    Dims ushape;
    for (size_t j = 0; j < p.base_shape.size(); ++j) ushape.push_back(p.limits[j] - p.starts[j]);
    u = b.Reshape(u, ushape);
    (void)k;
    Value v = FitLength(b, base, p.L);
    v = b.Reshape(v, p.base_shape);
    std::vector<Value> starts;
    for (auto st : p.starts) starts.push_back(b.ScalarConst(ET::S64, (double)st));
    v = b.DynamicUpdateSlice(v, u, starts);
    v = b.Reshape(v, {p.L});
    if (p.L == S) return v;
    if (p.L > S) return b.Slice(v, {0}, {S}, {1});
    return b.Concat({v, b.Slice(base, {p.L}, {S}, {1})}, 0);
  }
  // General case: scatter (last write wins for overlapping elements).
  Value idx = b.Reshape(IndexGrid(b, t), {t.numel(), 1});
  Value u = b.Reshape(update, {t.numel()});
  Region reg;
  reg.arg_types = {Type(base.et(), {}), Type(base.et(), {})};
  reg.body = [](Builder&, const std::vector<Value>& a) { return std::vector<Value>{a[1]}; };
  return b.Op1("stablehlo.scatter", {base, idx, u}, base.type,
               "scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], "
               "scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, "
               "indices_are_sorted = false, unique_indices = false",
               {reg});
}

Value FlatBitcast(Builder& b, Value flat, ET to) {
  ET from = flat.et();
  if (from == to) return flat;
  int64_t n = flat.dims()[0];
  int fb = ETBytes(from), tb = ETBytes(to);
  auto plain = [](ET e) { return e != ET::PRED && !IsComplex(e); };
  if (fb == tb && plain(from) && plain(to)) return b.BitcastConvert(flat, Type(to, {n}));
  // Through bytes.
  Value bytes;
  if (from == ET::PRED) {
    bytes = b.Convert(flat, ET::U8);
  } else if (IsComplex(from)) {
    ET part = ComplexPart(from);
    Value re = b.Op1("stablehlo.real", {flat}, Type(part, {n}));
    Value im = b.Op1("stablehlo.imag", {flat}, Type(part, {n}));
    Value st = b.Concat({b.Reshape(re, {n, 1}), b.Reshape(im, {n, 1})}, 1);
    bytes = b.BitcastConvert(st, Type(ET::U8, {n, 2, ETBytes(part)}));
    bytes = b.Reshape(bytes, {n * fb});
  } else if (fb == 1) {
    bytes = b.BitcastConvert(flat, Type(ET::U8, {n}));
  } else {
    bytes = b.Reshape(b.BitcastConvert(flat, Type(ET::U8, {n, fb})), {n * fb});
  }
  int64_t nb = n * fb, m = nb / tb;
  if (m * tb != nb) bytes = b.Slice(bytes, {0}, {m * tb}, {1});
  if (to == ET::PRED) {
    return b.Compare(bytes, b.Zeros(bytes.type), "NE");
  }
  if (IsComplex(to)) {
    ET part = ComplexPart(to);
    int pb = ETBytes(part);
    Value parts = b.BitcastConvert(b.Reshape(bytes, {m, 2, pb}), Type(part, {m, 2}));
    Value re = b.Reshape(b.Slice(parts, {0, 0}, {m, 1}, {1, 1}), {m});
    Value im = b.Reshape(b.Slice(parts, {0, 1}, {m, 2}, {1, 1}), {m});
    return b.Op1("stablehlo.complex", {re, im}, Type(to, {m}));
  }
  if (tb == 1) return b.BitcastConvert(bytes, Type(to, {m}));
  return b.BitcastConvert(b.Reshape(bytes, {m, tb}), Type(to, {m}));
}

}  // namespace tt::hlo
