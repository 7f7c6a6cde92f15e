// View, copy and factory ops as they appear in functionalized graphs
// (torch.compile): value semantics, so a view is a reshape/transpose/slice of
// the value. Registered graph-only: eager views alias storage instead.
#include <algorithm>

#include "../hlo/views.h"
#include "registry.h"

namespace tt::ops {
namespace {

Dims ContiguousStrides(const Dims& d) {
  Dims s(d.size(), 1);
  for (int i = (int)d.size() - 2; i >= 0; --i) s[i] = s[i + 1] * std::max<int64_t>(d[i + 1], 1);
  return s;
}

// reshape-like: the output shape comes from the meta kernel
std::vector<Value> ReshapeL(LowerCtx& c) {
  Value x = c.t(0);
  return {c.b.Reshape(x, c.out().dims)};
}
TT_GRAPH_LOWERINGS(({"aten::view", "aten::_unsafe_view", "aten::reshape", "aten::_reshape_alias",
                     "aten::view_copy", "aten::squeeze", "aten::squeeze.dim", "aten::squeeze.dims",
                     "aten::unsqueeze", "aten::flatten.using_ints", "aten::unflatten.int", "aten::alias",
                     "aten::detach", "aten::clone", "aten::lift_fresh_copy", "aten::contiguous",
                     "aten::_unsafe_view.out", "aten::view.out", "aten::alias_copy", "aten::detach_copy",
                     "aten::squeeze_copy", "aten::unsqueeze_copy", "aten::resolve_conj", "aten::resolve_neg"}),
                   ReshapeL);

std::vector<Value> ToCopy(LowerCtx& c) { return {Cast(c.b, c.t(0), c.out().et)}; }
TT_GRAPH_LOWERINGS(({"aten::_to_copy", "aten::to.dtype", "aten::_to_copy.out"}), ToCopy);

std::vector<Value> Expand(LowerCtx& c) {
  return {c.b.BroadcastTo(Cast(c.b, c.t(0), c.out().et), c.out().dims)};
}
TT_GRAPH_LOWERINGS(({"aten::expand", "aten::expand_copy", "aten::expand_as"}), Expand);

std::vector<Value> Permute(LowerCtx& c) {
  Value x = c.t(0);
  Dims perm = c.ints(1);
  for (auto& p : perm) p = NormDim(p, x.rank());
  return {c.b.Transpose(x, perm)};
}
TT_GRAPH_LOWERINGS(({"aten::permute", "aten::permute_copy"}), Permute);

std::vector<Value> TransposeL(LowerCtx& c) {
  Value x = c.t(0);
  int r = x.rank();
  if (r < 2) return {x};
  int64_t d0 = c.args.size() > 1 ? NormDim(c.i64(1), r) : 0, d1 = c.args.size() > 2 ? NormDim(c.i64(2), r) : 1;
  Dims perm;
  for (int i = 0; i < r; ++i) perm.push_back(i);
  std::swap(perm[d0], perm[d1]);
  return {c.b.Transpose(x, perm)};
}
TT_GRAPH_LOWERINGS(({"aten::t", "aten::transpose.int", "aten::t_copy", "aten::transpose_copy.int"}), TransposeL);

std::vector<Value> SliceL(LowerCtx& c) {
  Value x = c.t(0);
  int r = x.rank();
  int64_t dim = NormDim(c.i64_or(1, 0), r);
  int64_t size = x.dims()[dim];
  int64_t step = c.i64_or(4, 1);
  int64_t start = c.has(2) ? c.i64(2) : 0;
  if (start < 0) start += size;
  start = std::clamp<int64_t>(start, 0, size);
  int64_t len = c.out().dims[dim];
  int64_t limit = len == 0 ? start : std::min(size, start + (len - 1) * step + 1);
  return {c.b.SliceDim(x, dim, start, limit, step)};
}
TT_GRAPH_LOWERINGS(({"aten::slice.Tensor", "aten::slice_copy.Tensor"}), SliceL);

std::vector<Value> NarrowL(LowerCtx& c) {
  Value x = c.t(0);
  int r = x.rank();
  int64_t dim = NormDim(c.i64(1), r);
  int64_t start = c.i64(2);
  if (start < 0) start += x.dims()[dim];
  return {c.b.SliceDim(x, dim, start, start + c.out().dims[dim])};
}
TT_GRAPH_LOWERINGS(({"aten::narrow", "aten::narrow_copy"}), NarrowL);

std::vector<Value> SelectL(LowerCtx& c) {
  Value x = c.t(0);
  int r = x.rank();
  int64_t dim = NormDim(c.i64(1), r);
  int64_t idx = c.i64(2);
  if (idx < 0) idx += x.dims()[dim];
  return {c.b.Reshape(c.b.SliceDim(x, dim, idx, idx + 1), c.out().dims)};
}
TT_GRAPH_LOWERINGS(({"aten::select.int", "aten::select_copy.int"}), SelectL);

// split / split_with_sizes / unbind / chunk: consecutive slices along dim
std::vector<Value> SplitL(LowerCtx& c) {
  Value x = c.t(0);
  int r = x.rank();
  bool unbind = c.op.find("unbind") != std::string::npos;
  int64_t dim = NormDim(unbind ? c.i64_or(1, 0) : c.i64_or(2, 0), r);
  std::vector<Value> out;
  int64_t pos = 0;
  for (size_t k = 0; k < c.outs.size(); ++k) {
    const Type& ot = c.out(k);
    int64_t len = unbind ? 1 : ot.dims[dim];
    out.push_back(c.b.Reshape(c.b.SliceDim(x, dim, pos, pos + len), ot.dims));
    pos += len;
  }
  return out;
}
TT_GRAPH_LOWERINGS(({"aten::split.Tensor", "aten::split_with_sizes", "aten::unbind.int", "aten::chunk",
                     "aten::split_copy.Tensor", "aten::split_with_sizes_copy", "aten::unbind_copy.int",
                     "aten::tensor_split.sections"}),
                   SplitL);

// as_strided over the (contiguous) value of its input
std::vector<Value> AsStridedL(LowerCtx& c) {
  Value x = c.t(0);
  Value flat = c.b.Reshape(x, {x.type.numel()});
  hlo::ViewSpec s;
  s.sizes = c.ints(1);
  s.strides = c.ints(2);
  s.offset = c.has(3) ? c.i64(3) : 0;
  return {hlo::ReadView(c.b, flat, s)};
}
TT_GRAPH_LOWERINGS(({"aten::as_strided", "aten::as_strided_copy"}), AsStridedL);

// The diagonal (offset, dim1, dim2) of a contiguous value of shape `dims`, as
// a view: the other dims in order, then the diagonal.
hlo::ViewSpec DiagonalView(const Dims& dims, int64_t off, int64_t d1, int64_t d2) {
  Dims cs = ContiguousStrides(dims);
  hlo::ViewSpec s;
  for (int i = 0; i < (int)dims.size(); ++i)
    if (i != d1 && i != d2) {
      s.sizes.push_back(dims[i]);
      s.strides.push_back(cs[i]);
    }
  int64_t n = off >= 0 ? std::max<int64_t>(std::min(dims[d1], dims[d2] - off), 0)
                       : std::max<int64_t>(std::min(dims[d1] + off, dims[d2]), 0);
  s.sizes.push_back(n);
  s.strides.push_back(cs[d1] + cs[d2]);
  s.offset = n == 0 ? 0 : (off >= 0 ? off * cs[d2] : -off * cs[d1]);
  return s;
}

std::vector<Value> DiagonalL(LowerCtx& c) {
  Value x = c.t(0);
  int r = x.rank();
  hlo::ViewSpec s = DiagonalView(x.dims(), c.i64_or(1, 0), NormDim(c.i64_or(2, 0), r), NormDim(c.i64_or(3, 1), r));
  return {hlo::ReadView(c.b, c.b.Reshape(x, {x.type.numel()}), s)};
}
TT_GRAPH_LOWERINGS(({"aten::diagonal", "aten::diagonal_copy"}), DiagonalL);

// Functionalization's view inverses: the input's value with src written through
// the view (over the input's contiguous value, as the view lowerings above
// read it). Lowered rather than decomposed: torch's decompositions
// (where/index) give the result the strides of an elementwise op, where the
// meta kernels (and eager: a clone of the input, then a copy into the view)
// keep the input's strides. Functionalization then views the result back
// into its base (a view of a transposed intermediate, issue 39) and
// torch.compile failed with "Cannot view a tensor with shape ...".
Value WriteInto(LowerCtx& c, const hlo::ViewSpec& s) {
  Value x = c.t(0);
  const Type& o = c.out();
  Value src = Bcast(c.b, c.t(1), s.sizes, o.et);
  Value flat = c.b.Reshape(Cast(c.b, x, o.et), {x.type.numel()});
  return c.b.Reshape(hlo::WriteView(c.b, flat, src, s), o.dims);
}

// slice_scatter(self, src, dim=0, start=None, end=None, step=1)
std::vector<Value> SliceScatterL(LowerCtx& c) {
  Value x = c.t(0);
  int r = x.rank();
  int64_t dim = NormDim(c.i64_or(2, 0), r);
  int64_t size = x.dims()[dim];
  int64_t step = c.i64_or(5, 1);
  if (step <= 0) c.fail("slice step must be positive");
  int64_t start = c.i64_or(3, 0), end = c.i64_or(4, size);
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::clamp<int64_t>(start, 0, size);
  end = std::clamp<int64_t>(end, start, size);
  Dims cs = ContiguousStrides(x.dims());
  hlo::ViewSpec s;
  s.sizes = x.dims();
  s.strides = cs;
  s.sizes[dim] = (end - start + step - 1) / step;
  s.strides[dim] = cs[dim] * step;
  s.offset = start * cs[dim];
  return {WriteInto(c, s)};
}
TT_GRAPH_LOWERINGS(({"aten::slice_scatter"}), SliceScatterL);

// select_scatter(self, src, dim, index)
std::vector<Value> SelectScatterL(LowerCtx& c) {
  Value x = c.t(0);
  int r = x.rank();
  int64_t dim = NormDim(c.i64(2), r);
  int64_t idx = c.i64(3);
  if (idx < 0) idx += x.dims()[dim];
  if (idx < 0 || idx >= x.dims()[dim]) c.fail("select_scatter index out of range");
  Dims cs = ContiguousStrides(x.dims());
  hlo::ViewSpec s;
  for (int i = 0; i < r; ++i)
    if (i != dim) {
      s.sizes.push_back(x.dims()[i]);
      s.strides.push_back(cs[i]);
    }
  s.offset = idx * cs[dim];
  return {WriteInto(c, s)};
}
TT_GRAPH_LOWERINGS(({"aten::select_scatter"}), SelectScatterL);

// diagonal_scatter(self, src, offset=0, dim1=0, dim2=1): the view DiagonalL reads
std::vector<Value> DiagonalScatterL(LowerCtx& c) {
  Value x = c.t(0);
  int r = x.rank();
  return {WriteInto(c, DiagonalView(x.dims(), c.i64_or(2, 0), NormDim(c.i64_or(3, 0), r), NormDim(c.i64_or(4, 1), r)))};
}
TT_GRAPH_LOWERINGS(({"aten::diagonal_scatter"}), DiagonalScatterL);

std::vector<Value> ViewDtype(LowerCtx& c) {
  Value x = c.t(0);
  const Type& ot = c.out();
  if (hlo::ETBytes(x.et()) == hlo::ETBytes(ot.et) && x.et() != ET::PRED && ot.et != ET::PRED)
    return {c.b.BitcastConvert(x, ot)};
  Value flat = hlo::FlatBitcast(c.b, c.b.Reshape(x, {x.type.numel()}), ot.et);
  return {c.b.Reshape(flat, ot.dims)};
}
TT_GRAPH_LOWERINGS(({"aten::view.dtype"}), ViewDtype);

// view_as_real: complex [..] -> real [.., 2] (re, im); view_as_complex back
std::vector<Value> ViewAsReal(LowerCtx& c) {
  Builder& b = c.b;
  Value x = c.t(0);
  if (!hlo::IsComplex(x.et())) c.fail("view_as_real is only supported for complex tensors");
  Type pt = x.type.with_et(hlo::ComplexPart(x.et()));
  Dims d = x.dims();
  d.push_back(1);
  Value re = b.Reshape(b.Op1("stablehlo.real", {x}, pt), d), im = b.Reshape(b.Op1("stablehlo.imag", {x}, pt), d);
  return {b.Concat({re, im}, (int64_t)d.size() - 1)};
}
TT_GRAPH_LOWERINGS(({"aten::view_as_real", "aten::view_as_real_copy"}), ViewAsReal);

std::vector<Value> ViewAsComplex(LowerCtx& c) {
  Builder& b = c.b;
  Value x = c.t(0);
  const Type& o = c.out();
  if (x.rank() == 0 || x.dims().back() != 2) c.fail("Tensor must have a last dimension of size 2");
  int64_t l = x.rank() - 1;
  ET pt = hlo::ComplexPart(o.et);
  Value re = b.Reshape(Cast(b, b.SliceDim(x, l, 0, 1), pt), o.dims);
  Value im = b.Reshape(Cast(b, b.SliceDim(x, l, 1, 2), pt), o.dims);
  return {b.Op1("stablehlo.complex", {re, im}, o)};
}
TT_GRAPH_LOWERINGS(({"aten::view_as_complex", "aten::view_as_complex_copy"}), ViewAsComplex);

// copy(self, src): src broadcast into self's shape and dtype
std::vector<Value> CopyL(LowerCtx& c) { return {Bcast(c.b, c.t(1), c.out().dims, c.out().et)}; }
TT_GRAPH_LOWERINGS(({"aten::copy"}), CopyL);

// factories
std::vector<Value> ZerosL(LowerCtx& c) { return {c.b.Zeros(c.out())}; }
TT_GRAPH_LOWERINGS(({"aten::empty.memory_format", "aten::empty_strided", "aten::zeros", "aten::new_zeros",
                     "aten::new_empty", "aten::new_empty_strided", "aten::empty_like", "aten::zeros_like"}),
                   ZerosL);
std::vector<Value> OnesL(LowerCtx& c) { return {c.b.Splat(c.out(), 1.0)}; }
TT_GRAPH_LOWERINGS(({"aten::ones", "aten::new_ones", "aten::ones_like"}), OnesL);

// full(size, fill_value) / full_like(self, fill_value) / new_full(self, size, fill_value)
std::vector<Value> FullL(LowerCtx& c) {
  size_t vi = c.op == "aten::new_full" ? 2 : 1;
  return {Bcast(c.b, c.t(vi), c.out().dims, c.out().et)};
}
TT_GRAPH_LOWERINGS(({"aten::full", "aten::full_like", "aten::new_full"}), FullL);

std::vector<Value> ScalarTensorL(LowerCtx& c) { return {Cast(c.b, c.t(0), c.out().et)}; }
TT_GRAPH_LOWERINGS(({"aten::scalar_tensor"}), ScalarTensorL);

}  // namespace
}  // namespace tt::ops

namespace tt::ops {
namespace {
// embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse): rows of weight
std::vector<Value> EmbeddingL(LowerCtx& c) {
  Value w = c.t(0), idx = c.t(1);
  int64_t n = idx.type.numel(), d = w.dims()[1];
  Value ix = c.b.Reshape(Cast(c.b, idx, ET::S64), {n, 1});
  Value g = c.b.Op1("stablehlo.gather", {w, ix}, Type(w.et(), {n, d}),
                    "dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], "
                    "start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1, " +
                        std::to_string(d) + ">, indices_are_sorted = false");
  return {c.b.Reshape(g, c.out().dims)};
}
TT_GRAPH_LOWERINGS(({"aten::embedding"}), EmbeddingL);
}  // namespace
}  // namespace tt::ops
