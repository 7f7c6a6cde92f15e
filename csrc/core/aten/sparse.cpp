// Sparse COO tensors on tpu (the SparsePrivateUse1 key).
//
// The structure is PyTorch's own SparseTensorImpl, which is device-generic:
// indices ([sparse_dim, nnz] int64) and values ([nnz, dense sizes...]) are
// ordinary dense tpu tensors. So the constructor and metadata ops, and the ops
// PyTorch writes once for CPU and CUDA over other ATen ops (clone, copy_,
// to_dense, sum, mm, add/mul/div entry points, dense.to_sparse()), bind
// PyTorch's at::native functions as they are.
//
// The kernels whose CPU and CUDA versions are device-specific loops are
// written here from dense tpu ops, so they run natively (no CPU fallback):
//   _coalesce   linearized indices, stable sort, segment ids by cumsum,
//               index_add (one host read: the number of unique indices)
//   add.out     dense + sparse: index_put_(accumulate); sparse + sparse:
//               concatenation (coalesced again when both were coalesced)
//   mul.out     sparse * dense / scalar: values times the dense entries at the
//               indices; sparse * sparse: intersection by searchsorted
//   addmm       sparse x dense: rows of the dense gathered at the column
//               indices, scaled by the values, index_add'ed into the rows
// EmbeddingBag(sparse=True)'s backward is PyTorch's composite sparse backward.
// Errors are worded as CPU's kernels word them. These kernels run below
// autograd; the ops they call record no graph (autograd of the dense operand
// of mm/addmm comes from PyTorch's formulas, which call these kernels again).
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/TensorIndexing.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/native/SparseTensorUtils.h>
#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_dimI_native.h>
#include <ATen/ops/_dimV_native.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_native.h>
#include <ATen/ops/_to_dense_native.h>
#include <ATen/ops/_to_sparse_native.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/_embedding_bag_sparse_backward.h>
#include <ATen/ops/add_native.h>
#include <ATen/ops/clone_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/copy_sparse_to_sparse_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/div_native.h>
#include <ATen/ops/empty_like_native.h>
#include <ATen/ops/empty_native.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/mm_native.h>
#include <ATen/ops/mul_native.h>
#include <ATen/ops/neg_native.h>
#include <ATen/ops/permute_native.h>
#include <ATen/ops/resize_as_sparse_native.h>
#include <ATen/ops/searchsorted.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/sparse_mask_native.h>
#include <ATen/ops/sparse_resize_and_clear_native.h>
#include <ATen/ops/sparse_resize_native.h>
#include <ATen/ops/sub_native.h>
#include <ATen/ops/sum_native.h>
#include <ATen/ops/unsqueeze_native.h>
#include <ATen/ops/values_native.h>
#include <ATen/ops/zero_native.h>
#include <ATen/ops/zeros_native.h>
#include <torch/library.h>

#include "kernels.h"
#include "runtime/runtime.h"

namespace tt {
namespace {

using at::sparse::get_sparse_impl;
using at::sparse::is_same_tensor;

// As CUDA's wrappers: every tensor argument on the one device; ops whose yaml
// entry says `device_check: NoCheck` (add, mul) also take CPU 0-d numbers.
void CheckTpu(const at::Tensor& t, const char* arg, const char* op, bool cpu_scalars) {
  if (!t.defined() || t.device().type() == c10::DeviceType::PrivateUse1) return;
  if (cpu_scalars && t.dim() == 0 && t.device().is_cpu()) return;
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, tpu:0 and ",
              t.device(), "! (when checking argument for argument ", arg, " in method ", op, ")");
}

// Row-major position of each index column over the sparse sizes (as
// at::sparse::flatten_indices): equal keys are equal indices, and key order is
// the lexicographic order coalesce sorts by.
at::Tensor LinearIndex(const at::Tensor& indices, c10::IntArrayRef sizes) {
  const int64_t sd = indices.size(0);
  at::Tensor key;
  int64_t mult = 1;
  for (int64_t d = sd - 1; d >= 0; --d) {
    at::Tensor row = indices.select(0, d);
    key = !key.defined() ? (mult == 1 ? row : row.mul(mult)) : key.add(row, mult);
    mult *= sizes[d];
  }
  if (!key.defined()) key = at::zeros({indices.size(1)}, indices.options());
  return key;
}

// Sums the values of equal indices; the result's indices are sorted. One host
// read (the number of unique indices), as CUDA's coalesce.
std::pair<at::Tensor, at::Tensor> CoalesceParts(const at::Tensor& indices, const at::Tensor& values,
                                                c10::IntArrayRef sizes) {
  const int64_t nnz = indices.size(1);
  at::Tensor key = LinearIndex(indices, sizes);
  auto [skey, perm] = key.sort(/*stable=*/true, 0, /*descending=*/false);
  at::Tensor flags = at::cat({at::ones({1}, key.options().dtype(at::kBool)),
                              skey.slice(0, 1, nnz).ne(skey.slice(0, 0, nnz - 1))});
  const int64_t n = flags.sum().item<int64_t>();
  at::Tensor seg = flags.cumsum(0).sub_(1);
  at::Tensor starts = at::nonzero_static(flags, n, -1).select(1, 0);
  at::Tensor new_indices = indices.index_select(1, perm.index_select(0, starts));
  // summed in sorted (stable) order, as CPU's coalesce adds them
  at::Tensor sorted_values = values.index_select(0, perm);
  const bool boolean = values.scalar_type() == at::kBool;  // duplicates: logical or
  if (boolean) sorted_values = sorted_values.to(at::kInt);
  std::vector<int64_t> vsize = sorted_values.sizes().vec();
  vsize[0] = n;
  at::Tensor new_values = at::zeros(vsize, sorted_values.options()).index_add_(0, seg, sorted_values);
  if (boolean) new_values = new_values.ne(0);
  return {new_indices, new_values};
}

// Makes `r` (a sparse tensor) hold these indices and values (aliased).
at::Tensor& SetSparse(at::Tensor& r, int64_t sparse_dim, int64_t dense_dim, c10::IntArrayRef sizes,
                      const at::Tensor& indices, const at::Tensor& values, bool coalesced) {
  auto* impl = get_sparse_impl(r);
  impl->raw_resize_(sparse_dim, dense_dim, sizes);
  impl->set_indices_and_values_unsafe(indices, values.scalar_type() == r.scalar_type() ? values
                                                                                       : values.to(r.scalar_type()));
  return r._coalesced_(coalesced);
}

bool IsOne(const c10::Scalar& s) {
  if (s.isBoolean()) return s.toBool();
  if (s.isComplex()) return s.toComplexDouble() == c10::complex<double>(1, 0);
  return s.toDouble() == 1.0;
}

// ---------------------------------------------------------------- coalesce
at::Tensor Coalesce(const at::Tensor& self) {
  GetMetrics().Native("aten::_coalesce");
  // as CPU: a copy even when there is nothing to sum
  if (self._nnz() < 2) {
    at::Tensor dst = self.clone();
    dst._coalesced_(true);
    return dst;
  }
  auto [indices, values] = CoalesceParts(self._indices(), self._values(), self.sizes());
  return at::_sparse_coo_tensor_with_dims_and_tensors(self.sparse_dim(), self.dense_dim(), self.sizes(), indices,
                                                      values, self.options(), /*is_coalesced=*/true);
}

// ---------------------------------------------------------------- add
at::Tensor& AddDenseSparse(at::Tensor& r, const at::Tensor& dense, const at::Tensor& sparse,
                           const c10::Scalar& alpha) {
  TORCH_CHECK(dense.sizes().equals(sparse.sizes()), "add: expected 'self' and 'other' to have same size, but self has size ",
              dense.sizes(), " while other has size ", sparse.sizes(),
              " (FYI: dense-sparse addition does not currently support broadcasting)");
  const auto common = c10::promoteTypes(dense.scalar_type(), sparse.scalar_type());
  TORCH_CHECK(c10::canCast(common, r.scalar_type()), "Can't convert result type ", common, " to output ",
              r.scalar_type(), " in add operation");
  const bool same = is_same_tensor(r, dense);
  if (!same) r.resize_as_(dense);
  if (sparse._nnz() == 0) {
    if (!same) r.copy_(dense);
    return r;
  }
  at::Tensor buf;
  if (r.scalar_type() != common) {
    buf = dense.to(common, /*non_blocking=*/false, /*copy=*/true);
  } else {
    buf = r;
    if (!same) buf.copy_(dense);
  }
  at::Tensor values = sparse._values().to(common);
  if (!IsOne(alpha)) values = values.mul(alpha);
  const int64_t sd = sparse.sparse_dim();
  if (sd == 0) {
    buf.add_(values.sum(0));
  } else {
    at::Tensor indices = sparse._indices();
    c10::List<std::optional<at::Tensor>> idx;
    for (int64_t d = 0; d < sd; ++d) idx.push_back(indices.select(0, d));
    buf.index_put_(idx, values, /*accumulate=*/true);
  }
  if (!is_same_tensor(buf, r)) r.copy_(buf);
  return r;
}

at::Tensor& AddOut(const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha, at::Tensor& r) {
  GetMetrics().Native("aten::add.out");
  CheckTpu(self, "self", "aten::add.out", true);
  CheckTpu(other, "other", "aten::add.out", true);
  CheckTpu(r, "out", "aten::add.out", false);
  if (!self.is_sparse()) {
    TORCH_CHECK(!r.is_sparse(), "add: expected a strided result tensor for add(dense, sparse), got a sparse one");
    return AddDenseSparse(r, self, other, alpha);
  }
  TORCH_CHECK(other.is_sparse(), "add(sparse, dense) is not supported. Use add(dense, sparse) instead.");
  TORCH_CHECK(self.sizes().equals(other.sizes()), "add: expected sizes of 'self' and 'other' to match, but ",
              self.sizes(), " != ", other.sizes());
  const auto common = c10::promoteTypes(self.scalar_type(), other.scalar_type());
  TORCH_CHECK(c10::canCast(common, r.scalar_type()), "Can't convert result type ", common, " to output ",
              r.scalar_type(), " in add operation");
  if (other._nnz() == 0) return at::copy_sparse_to_sparse_(r, self);
  if (self._nnz() == 0) {
    at::Tensor values = other._values().to(common);
    if (!IsOne(alpha)) values = values.mul(alpha);
    return SetSparse(r, other.sparse_dim(), other.dense_dim(), other.sizes(), other._indices().clone(), values,
                     other.is_coalesced());
  }
  TORCH_CHECK(at::sparse::is_same_density(self, other), "add: expected 'self' and 'other' to have same density, but 'self' has ",
              self.sparse_dim(), " sparse dimensions while 'other' has ", other.sparse_dim(), " sparse dimensions");
  at::Tensor s_values = other._values().to(common);
  if (!IsOne(alpha)) s_values = s_values.mul(alpha);
  at::Tensor indices = at::cat({self._indices(), other._indices()}, 1);
  at::Tensor values = at::cat({self._values().to(common), s_values}, 0);
  // CPU merges two coalesced operands into a coalesced result; otherwise
  // (and on CUDA) the result is the uncoalesced concatenation.
  const bool coalesced = self.is_coalesced() && other.is_coalesced();
  if (coalesced) std::tie(indices, values) = CoalesceParts(indices, values, self.sizes());
  std::vector<int64_t> sizes = self.sizes().vec();
  return SetSparse(r, self.sparse_dim(), self.dense_dim(), sizes, indices, values, coalesced);
}

// ---------------------------------------------------------------- mul
// sparse * dense (CPU's intersection_binary_op_sparse_dense_out for mul): the
// result keeps the sparse operand's indices (and, where the dense operand has
// more leading dims, repeats them over those dims).
at::Tensor& MulDenseSparse(const at::Tensor& d, const at::Tensor& s_, at::Tensor& res) {
  using at::indexing::Ellipsis;
  using at::indexing::Slice;
  using at::indexing::TensorIndex;
  const std::vector<int64_t> res_shape = at::infer_size(d.sizes(), s_.sizes());
  if (!s_._nnz() || !s_.numel() || !d.numel()) {
    const auto common = c10::promoteTypes(d.scalar_type(), s_.scalar_type());
    TORCH_CHECK(c10::canCast(common, res.scalar_type()), "mul(): can't convert result type ", common,
                " to output ", res.scalar_type(), ".");
    const auto sparse_dim = static_cast<int64_t>(res_shape.size());
    return SetSparse(res, sparse_dim, 0, res_shape, at::empty({sparse_dim, 0}, s_._indices().options()),
                     at::empty({0}, s_._values().options().dtype(res.scalar_type())), true);
  }
  const int64_t d_dim = d.dim(), s_dim = s_.dim();
  // sparse broadcast over dense creates new sparse dims: duplicates must go first
  const at::Tensor s = d_dim > s_dim ? s_.coalesce() : s_;
  const int64_t sparse_dim = s.sparse_dim(), dense_dim = s.dense_dim();
  const at::Tensor s_indices = s._indices(), s_values = s._values();
  // values first: the result's device is the first operand's where the host
  // tier runs a small op through CPU's kernel (d may be a CPU 0-d number)
  auto apply = [&](const at::Tensor& d_filtered) -> at::Tensor& {
    return SetSparse(res, sparse_dim, dense_dim, res_shape, s_indices, at::mul(s_values, d_filtered),
                     s.is_coalesced());
  };
  if (d_dim <= dense_dim) return apply(d);  // only the values meet the dense operand

  const int64_t sparse_dim_intersec = std::min(sparse_dim, d_dim - dense_dim);
  const int64_t d_start = std::max<int64_t>(0, d_dim - s_dim);
  const int64_t s_start = std::max<int64_t>(0, s_dim - d_dim);
  std::vector<TensorIndex> ix;
  if (d_start) ix.emplace_back(Ellipsis);
  for (int64_t i = 0; i < sparse_dim_intersec; ++i) ix.emplace_back(s_indices[s_start + i]);
  for (int64_t i = d_start + sparse_dim_intersec; i < d_dim; ++i) ix.emplace_back(Slice());
  const std::vector<int64_t> d_expanded(res_shape.end() - d_dim, res_shape.end());
  const at::Tensor d_filtered = d.expand(d_expanded).index(ix);
  if (s_dim >= d_dim) return apply(d_filtered);

  // The dense operand has leading (batch) dims the sparse one lacks: each
  // batch position gets a copy of the sparse indices.
  const c10::IntArrayRef batch = d.sizes().slice(0, d_start);
  int64_t batch_count = 1;
  for (int64_t b : batch) batch_count *= b;
  const int64_t res_sparse_dim = static_cast<int64_t>(batch.size()) + sparse_dim;
  const int64_t nnz = s._nnz(), res_nnz = batch_count * nnz;
  std::vector<int64_t> vshape = s_values.sizes().vec();
  vshape[0] = res_nnz;
  at::Tensor res_values = at::mul(s_values, d_filtered).reshape(vshape);
  std::vector<at::Tensor> rows;
  int64_t inner = res_nnz, outer = 1;
  for (int64_t size : batch) {
    inner /= size;
    rows.push_back(at::arange(size, s_indices.options()).view({1, size, 1}).expand({outer, size, inner}).reshape({-1}));
    outer *= size;
  }
  at::Tensor res_indices = at::cat({at::stack(rows), s_indices.repeat({1, batch_count})}, 0);
  return SetSparse(res, res_sparse_dim, dense_dim, res_shape, res_indices, res_values, true);
}

// sparse * sparse (same sizes): the entries whose indices both have.
at::Tensor& MulSparseSparse(const at::Tensor& t_, const at::Tensor& s_, at::Tensor& r) {
  TORCH_CHECK(t_.sizes().equals(s_.sizes()), "mul: expected 'self' and 'other' to have same sizes when both are sparse",
              ", but ", t_.sizes(), " != ", s_.sizes());
  if (!t_._nnz() || !s_._nnz()) {
    r.resize_as_(t_);
    return r.zero_();
  }
  const auto common = c10::promoteTypes(t_.scalar_type(), s_.scalar_type());
  TORCH_CHECK(c10::canCast(common, r.scalar_type()), "Can't convert result type ", common, " to output ",
              r.scalar_type(), " in mul operation");
  const at::Tensor t = t_.coalesce(), s = s_.coalesce();
  at::Tensor tk = LinearIndex(t._indices(), t.sizes()), sk = LinearIndex(s._indices(), s.sizes());
  at::Tensor pos = at::searchsorted(sk, tk).clamp_max_(s._nnz() - 1);
  at::Tensor match = sk.index_select(0, pos).eq(tk);
  const int64_t n = match.sum().item<int64_t>();
  at::Tensor sel_t = at::nonzero_static(match, n, -1).select(1, 0);
  at::Tensor sel_s = pos.index_select(0, sel_t);
  at::Tensor values = t._values().to(common).index_select(0, sel_t).mul(s._values().to(common).index_select(0, sel_s));
  std::vector<int64_t> sizes = s.sizes().vec();
  return SetSparse(r, s.sparse_dim(), s.dense_dim(), sizes, t._indices().index_select(1, sel_t), values, true);
}

at::Tensor& MulOut(const at::Tensor& self, const at::Tensor& other, at::Tensor& r) {
  GetMetrics().Native("aten::mul.out");
  CheckTpu(self, "self", "aten::mul.out", true);
  CheckTpu(other, "other", "aten::mul.out", true);
  CheckTpu(r, "out", "aten::mul.out", false);
  TORCH_CHECK(r.is_sparse(), "mul: expected a sparse result tensor, got one with layout ", r.layout());
  if (!other.is_sparse()) return MulDenseSparse(other, self, r);
  if (!self.is_sparse()) return MulDenseSparse(self, other, r);
  return MulSparseSparse(self, other, r);
}

// ---------------------------------------------------------------- addmm
// r = beta * t + alpha * (sparse @ dense), t already expanded to [i, k].
at::Tensor AddmmSparseDense(const at::Tensor& t, const at::Tensor& sparse, const at::Tensor& dense,
                            const c10::Scalar& beta, const c10::Scalar& alpha, const at::Tensor* out) {
  TORCH_CHECK(t.layout() == c10::kStrided, "addmm_sparse_dense: expected 't' to have strided layout, got tensor with layout ",
              t.layout());
  TORCH_CHECK(sparse.layout() == c10::kSparse && dense.layout() == c10::kStrided,
              "addmm_sparse_dense: expected either 'mat1' to have sparse layout and 'mat2' to have strided layout, "
              "got 'mat1' with layout ", sparse.layout(), " and 'mat2' with layout ", dense.layout());
  TORCH_CHECK(sparse.sparse_dim() == 2, "addmm: matrices expected, got ", sparse.sparse_dim(), "D tensor");
  TORCH_CHECK(sparse.dense_dim() == 0, "addmm: scalar values expected, got ", sparse.dense_dim(), "D values");
  TORCH_CHECK(dense.dim() == 2, "addmm: matrices expected, got ", dense.dim(), "D tensor");
  const int64_t dim_i = sparse.size(0), dim_j = sparse.size(1), dim_k = dense.size(1);
  TORCH_CHECK(dense.size(0) == dim_j, "addmm: Argument #3 (dense): Expected dim 0 size ", dim_j, ", got ",
              dense.size(0));
  TORCH_CHECK(t.size(0) == dim_i, "addmm: Argument #1 (t): Expected dim 0 size ", dim_i, ", got ", t.size(0));
  TORCH_CHECK(t.size(1) == dim_k, "addmm: Argument #1 (t): Expected dim 1 size ", dim_k, ", got ", t.size(1));
  const at::ScalarType rtype = out ? out->scalar_type() : t.scalar_type();
  if (sparse._nnz() == 0) return t.mul(at::scalar_tensor(beta, t.options().dtype(rtype)));
  // CPU's kernel reads mat2 and the result as the values' type
  const at::ScalarType vtype = sparse.scalar_type();
  TORCH_CHECK(dense.scalar_type() == vtype, "expected scalar type ", vtype, " but found ", dense.scalar_type());
  TORCH_CHECK(rtype == vtype, "expected scalar type ", vtype, " but found ", rtype);
  at::Tensor indices = sparse._indices();
  at::Tensor values = sparse._values();
  if (!IsOne(alpha)) values = values.mul(alpha);  // CPU scales each value by alpha first
  at::Tensor rows = dense.index_select(0, indices.select(0, 1)).mul(values.unsqueeze(1));
  at::Tensor acc = at::zeros({dim_i, dim_k}, dense.options()).index_add_(0, indices.select(0, 0), rows);
  if (beta.toComplexDouble() == c10::complex<double>(0, 0)) return acc;  // t is not read (NaNs too)
  return IsOne(beta) ? acc.add_(t) : acc.add_(t.mul(beta));
}

void CheckAddmmDevices(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2, const char* op) {
  CheckTpu(self, "self", op, false);
  CheckTpu(mat1, "mat1", op, false);
  CheckTpu(mat2, "mat2", op, false);
}

at::Tensor Addmm(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2, const c10::Scalar& beta,
                 const c10::Scalar& alpha) {
  GetMetrics().Native("aten::addmm");
  CheckAddmmDevices(self, mat1, mat2, "aten::addmm");
  c10::MaybeOwned<at::Tensor> t = at::expand_size(self, {mat1.size(0), mat2.size(1)}, "addmm_out");
  return AddmmSparseDense(*t, mat1, mat2, beta, alpha, nullptr);
}

at::Tensor& AddmmOut(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2, const c10::Scalar& beta,
                     const c10::Scalar& alpha, at::Tensor& out) {
  GetMetrics().Native("aten::addmm.out");
  CheckAddmmDevices(self, mat1, mat2, "aten::addmm.out");
  CheckTpu(out, "out", "aten::addmm.out", false);
  TORCH_CHECK(out.layout() == c10::kStrided, "addmm_sparse_dense: expected strided result tensor, got tensor with layout ",
              out.layout());
  c10::MaybeOwned<at::Tensor> t = at::expand_size(self, {mat1.size(0), mat2.size(1)}, "addmm_out");
  at::Tensor r = AddmmSparseDense(*t, mat1, mat2, beta, alpha, &out);
  out.resize_(r.sizes());
  out.copy_(r);
  return out;
}

at::Tensor& Addmm_(at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2, const c10::Scalar& beta,
                   const c10::Scalar& alpha) {
  GetMetrics().Native("aten::addmm_");
  CheckAddmmDevices(self, mat1, mat2, "aten::addmm_");
  // no broadcasting in place (as CPU)
  at::Tensor r = AddmmSparseDense(self, mat1, mat2, beta, alpha, &self);
  self.copy_(r);
  return self;
}

}  // namespace

// Structure, metadata and PyTorch's device-generic sparse kernels.
TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  m.impl("_sparse_coo_tensor_with_dims", at::native::new_with_dims_sparse);
  m.impl("_sparse_coo_tensor_with_dims_and_tensors", at::native::new_with_dims_and_tensor_sparse_symint);
  m.impl("empty.memory_format", at::native::empty_sparse);
  m.impl("empty_like", at::native::empty_like_sparse_coo);
  m.impl("_indices", at::native::_indices_sparse);
  m.impl("_values", at::native::_values_sparse);
  m.impl("indices", at::native::indices_sparse);
  m.impl("values", at::native::values_sparse);
  m.impl("_nnz", at::native::_nnz_sparse);
  m.impl("sparse_dim", at::native::sparse_dim_sparse);
  m.impl("_dimI", at::native::sparse_dim_sparse);
  m.impl("dense_dim", at::native::dense_dim_sparse);
  m.impl("_dimV", at::native::dense_dim_sparse);
  m.impl("is_coalesced", at::native::is_coalesced_sparse);
  m.impl("_coalesced_", at::native::_coalesced_sparse_);
  m.impl("sparse_resize_", at::native::sparse_resize_);
  m.impl("sparse_resize_and_clear_", at::native::sparse_resize_and_clear_);
  m.impl("resize_as_sparse_", at::native::resize_as_sparse_);
  m.impl("copy_", at::native::copy_sparse_wrapper_);
  m.impl("copy_sparse_to_sparse_", at::native::copy_sparse_);
  m.impl("clone", at::native::clone_sparse);
  m.impl("zero_", at::native::zero_sparse_);
  m.impl("zeros.out", at::native::zeros_sparse_out);
  m.impl("_to_dense", at::native::sparse_to_dense);
  m.impl("_to_sparse", static_cast<at::Tensor (*)(const at::Tensor&, std::optional<c10::Layout>, at::OptionalIntArrayRef,
                                                  std::optional<int64_t>)>(at::native::sparse_coo_to_sparse));
  m.impl("_to_sparse.sparse_dim", static_cast<at::Tensor (*)(const at::Tensor&, int64_t)>(at::native::sparse_coo_to_sparse));
  m.impl("unsqueeze", at::native::unsqueeze_sparse);
  m.impl("permute", at::native::permute_sparse_coo);
  m.impl("neg", at::native::neg_sparse);
  m.impl("neg_", at::native::neg_sparse_);
  m.impl("neg.out", at::native::neg_out_sparse);
  m.impl("sum", at::native::sum_coo);
  m.impl("sum.dim_IntList", at::native::sum_sparse_coo);
  m.impl("mm", static_cast<at::Tensor (*)(const at::Tensor&, const at::Tensor&)>(at::native::_sparse_mm));
  m.impl("mm.out", at::native::_sparse_mm_out);
  m.impl("add.Tensor", at::native::add_sparse);
  m.impl("add_.Tensor", at::native::add_sparse_);
  m.impl("sub.Tensor", at::native::sub_sparse);
  m.impl("sub_.Tensor", at::native::sub_sparse_);
  m.impl("sub.out", at::native::sub_out_sparse);
  m.impl("mul.Tensor", at::native::mul_sparse);
  m.impl("mul_.Tensor", at::native::mul_sparse_);
  m.impl("div.Tensor", static_cast<at::Tensor (*)(const at::Tensor&, const at::Tensor&)>(at::native::div_sparse));
  m.impl("div_.Tensor", static_cast<at::Tensor& (*)(at::Tensor&, const at::Tensor&)>(at::native::div_sparse_));
  m.impl("div.out", static_cast<at::Tensor& (*)(const at::Tensor&, const at::Tensor&, at::Tensor&)>(
                        at::native::div_out_sparse_zerodim));
  // dense.sparse_mask(sparse): the dense entries at the mask's indices
  // (PyTorch's device-generic form: dense * the mask's pattern)
  m.impl("sparse_mask", at::native::sparse_mask);
  // written here from dense tpu ops
  m.impl("_coalesce", Coalesce);
  m.impl("add.out", AddOut);
  m.impl("mul.out", MulOut);
  m.impl("addmm", Addmm);
  m.impl("addmm.out", AddmmOut);
  m.impl("addmm_", Addmm_);
}

// _embedding_bag_backward (EmbeddingBag(sparse=True) in recommendation
// models): with sparse=True, PyTorch's composite sparse backward (the bags'
// gradients gathered per index, embedding's sparse backward), as CUDA's
// _embedding_bag_backward does; dense, the registry's lowering.
void EmbeddingBagBackward(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  constexpr size_t kArgs = 12;
  auto a = torch::jit::last(*stack, kArgs);
  if (!a[9].toBool()) {
    NativeKernel(op, ks, stack);
    return;
  }
  const at::Tensor& indices = a[1].toTensor();
  const at::Tensor& offsets = a[2].toTensor();
  at::Tensor offset2bag = a[3].toTensor();
  if (offset2bag.numel() != indices.numel()) {  // the bag of each index, from the offsets
    at::Tensor pos = at::arange(indices.numel(), offsets.options());
    offset2bag = at::searchsorted(offsets, pos, /*out_int32=*/false, /*right=*/true) - 1;
  }
  std::optional<at::Tensor> psw;
  if (a[10].isTensor()) psw = a[10].toTensor();
  at::Tensor r = at::_embedding_bag_sparse_backward_symint(
      a[0].toTensor(), indices, offsets, offset2bag, a[4].toTensor(), a[6].toSymInt(), a[7].toBool(),
      a[8].toInt(), psw, a[11].toInt());
  torch::jit::drop(*stack, kArgs);
  torch::jit::push(*stack, std::move(r));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_embedding_bag_backward", torch::CppFunction::makeFromBoxedFunction<&EmbeddingBagBackward>());
}

// dense.to_sparse(): PyTorch's device-generic conversion (nonzero, unique_dim
// and indexing: native tpu ops).
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_to_sparse", static_cast<at::Tensor (*)(const at::Tensor&, std::optional<c10::Layout>, at::OptionalIntArrayRef,
                                                  std::optional<int64_t>)>(at::native::dense_to_sparse));
  m.impl("_to_sparse.sparse_dim", static_cast<at::Tensor (*)(const at::Tensor&, int64_t)>(at::native::dense_to_sparse));
}

}  // namespace tt
