// Ops with data-dependent output shapes: nonzero, masked_select, unique
// (_unique2, unique_dim, unique_consecutive), repeat_interleave(Tensor).
// Each synchronizes once: it computes a count on the device, reads it to the
// host (.item(), which flushes and waits), then runs static-shape ops
// (nonzero_static, sort, gathers, scatters) that are all native lowerings.
// These kernels run below autograd: the at:: calls inside record no graph.
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <torch/library.h>

#include "core/exec/executor.h"
#include "runtime/runtime.h"

namespace tt {
namespace {

int64_t CountTrue(const at::Tensor& mask_bool) { return mask_bool.sum().item<int64_t>(); }

// Small inputs in strict mode: the op synchronizes anyway, so it runs on the
// host (the same bits: a selection) instead of compiling its count and
// gather programs for a shape that may not come back (tensor printing).
bool SmallOnHost(std::initializer_list<const at::Tensor*> ts) {
  if (GetMode() != Mode::Strict) return false;
  for (const at::Tensor* t : ts)
    if (t->numel() > kHostTierMaxElements) return false;
  return true;
}

at::Tensor Nonzero(const at::Tensor& self) {
  if (SmallOnHost({&self})) {
    GetMetrics().HostTier("aten::nonzero");
    at::Tensor host = self.cpu();
    HostTierScope scope;  // a subnormal is zero on the device
    return at::nonzero(host).to(self.device());
  }
  GetMetrics().Native("aten::nonzero");
  int64_t n = CountTrue(self.scalar_type() == at::kBool ? self : self.ne(0));
  return at::nonzero_static(self, n, -1);
}

at::Tensor& NonzeroOut(const at::Tensor& self, at::Tensor& out) {
  at::Tensor r = Nonzero(self);
  out.resize_(r.sizes());
  out.copy_(r);
  return out;
}

// flat positions of the true elements of a 1-D bool tensor
at::Tensor TruePositions(const at::Tensor& flags, int64_t n) {
  return at::nonzero_static(flags, n, -1).select(1, 0);
}

at::Tensor MaskedSelect(const at::Tensor& self, const at::Tensor& mask) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "masked_select: expected BoolTensor for mask");
  if (SmallOnHost({&self, &mask})) {
    GetMetrics().HostTier("aten::masked_select");
    at::Tensor s = self.cpu(), m = mask.cpu();
    HostTierScope scope;
    return at::masked_select(s, m).to(self.device());
  }
  GetMetrics().Native("aten::masked_select");
  auto shape = at::infer_size(self.sizes(), mask.sizes());
  at::Tensor m = mask.expand(shape).reshape({-1});
  at::Tensor x = self.expand(shape).reshape({-1});
  int64_t n = CountTrue(m);
  return x.index_select(0, TruePositions(m, n));
}

at::Tensor& MaskedSelectOut(const at::Tensor& self, const at::Tensor& mask, at::Tensor& out) {
  at::Tensor r = MaskedSelect(self, mask);
  out.resize_(r.sizes());
  out.copy_(r);
  return out;
}

at::Tensor LongOpts(const at::Tensor& like, int64_t n) { return at::empty({n}, like.options().dtype(at::kLong)); }

// Groups of equal neighbours in `rows` ([N, M] or [N]) taken in the order
// `perm` (sorted or identity): unique rows, inverse (original order), counts.
std::tuple<at::Tensor, at::Tensor, at::Tensor> Groups(const at::Tensor& rows, const at::Tensor& perm) {
  int64_t N = rows.size(0);
  at::Tensor s = rows.index_select(0, perm);
  at::Tensor ne = s.slice(0, 1, N).ne(s.slice(0, 0, N - 1));
  if (ne.dim() > 1) ne = ne.flatten(1).any(1);
  at::Tensor flags = at::cat({at::ones({1}, ne.options()), ne});
  int64_t n = CountTrue(flags);
  at::Tensor gid = flags.cumsum(0).sub_(1);
  at::Tensor starts = TruePositions(flags, n);
  at::Tensor values = s.index_select(0, starts);
  at::Tensor inverse = LongOpts(rows, N).scatter_(0, perm, gid);
  at::Tensor ends = at::cat({starts.slice(0, 1, n), at::full({1}, N, starts.options())});
  at::Tensor counts = ends.sub(starts);
  return {values, inverse, counts};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> Unique2(const at::Tensor& self, bool sorted, bool return_inverse,
                                                       bool return_counts) {
  GetMetrics().Native("aten::_unique2");
  at::Tensor flat = self.reshape({-1});
  int64_t N = flat.numel();
  if (N == 0) {
    return {at::empty({0}, self.options()),
            return_inverse ? at::zeros(self.sizes(), self.options().dtype(at::kLong)) : LongOpts(self, 0),
            LongOpts(self, 0)};
  }
  // sorted=false may return any order: sorted is one valid order
  at::Tensor perm = std::get<1>(flat.sort(/*stable=*/true, 0, false));
  auto [v, inv, cnt] = Groups(flat, perm);
  return {v, return_inverse ? inv.view(self.sizes()) : LongOpts(self, 0),
          return_counts ? cnt : LongOpts(self, 0)};
}

// rows of self along dim: [N, M]
at::Tensor Rows(const at::Tensor& self, int64_t dim) { return self.movedim(dim, 0).reshape({self.size(dim), -1}); }

at::Tensor RowsBack(const at::Tensor& rows, const at::Tensor& self, int64_t dim) {
  std::vector<int64_t> sz(self.sizes().begin(), self.sizes().end());
  sz.erase(sz.begin() + dim);
  sz.insert(sz.begin(), rows.size(0));
  return rows.reshape(sz).movedim(0, dim);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> UniqueDimImpl(const at::Tensor& self, int64_t dim, bool sort,
                                                             bool return_inverse, bool return_counts) {
  dim = c10::maybe_wrap_dim(dim, self.dim());
  int64_t N = self.size(dim);
  if (N == 0 || self.numel() == 0) {
    // as on CPU: the input back, with empty inverse/counts
    return {self.clone(), LongOpts(self, return_inverse ? N : 0), LongOpts(self, 0)};
  }
  at::Tensor rows = Rows(self, dim);
  at::Tensor perm = at::arange(N, self.options().dtype(at::kLong));
  if (sort) {
    // lexicographic: stable sorts by the columns from last to first
    for (int64_t col = rows.size(1) - 1; col >= 0; --col) {
      at::Tensor key = rows.select(1, col).index_select(0, perm);
      perm = perm.index_select(0, std::get<1>(key.sort(/*stable=*/true, 0, false)));
    }
  }
  auto [v, inv, cnt] = Groups(rows, perm);
  return {RowsBack(v, self, dim), return_inverse ? inv : LongOpts(self, 0), return_counts ? cnt : LongOpts(self, 0)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> UniqueDim(const at::Tensor& self, int64_t dim, bool sorted,
                                                         bool return_inverse, bool return_counts) {
  GetMetrics().Native("aten::unique_dim");
  return UniqueDimImpl(self, dim, true, return_inverse, return_counts);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> UniqueConsecutive(const at::Tensor& self, bool return_inverse,
                                                                 bool return_counts, std::optional<int64_t> dim) {
  GetMetrics().Native("aten::unique_consecutive");
  if (dim.has_value()) {
    auto r = UniqueDimImpl(self, *dim, false, return_inverse, return_counts);
    return r;
  }
  at::Tensor flat = self.reshape({-1});
  int64_t N = flat.numel();
  if (N == 0) {
    return {at::empty({0}, self.options()),
            return_inverse ? at::zeros(self.sizes(), self.options().dtype(at::kLong)) : LongOpts(self, 0),
            LongOpts(self, 0)};
  }
  auto [v, inv, cnt] = Groups(flat, at::arange(N, self.options().dtype(at::kLong)));
  return {v, return_inverse ? inv.view(self.sizes()) : LongOpts(self, 0), return_counts ? cnt : LongOpts(self, 0)};
}

// repeat_interleave(repeats): i repeated repeats[i] times
at::Tensor RepeatInterleave(const at::Tensor& repeats, std::optional<c10::SymInt> output_size) {
  GetMetrics().Native("aten::repeat_interleave.Tensor");
  TORCH_CHECK(repeats.dim() == 1 || repeats.dim() == 0, "repeat_interleave only accept 1D vector as repeat");
  TORCH_CHECK(repeats.scalar_type() == at::kLong || repeats.scalar_type() == at::kInt,
              "repeats has to be Long or Int tensor");
  at::Tensor r = repeats.reshape({-1});
  int64_t total;
  if (output_size.has_value()) {
    total = output_size->expect_int();
  } else {
    if (r.numel() > 0)
      TORCH_CHECK(r.min().item<int64_t>() >= 0, "repeats can not be negative");
    total = r.numel() == 0 ? 0 : r.sum().item<int64_t>();
  }
  if (total == 0 || r.numel() == 0) return at::empty({0}, repeats.options());
  at::Tensor cum = r.cumsum(0);
  at::Tensor pos = at::arange(total, repeats.options().dtype(at::kLong));
  return at::searchsorted(cum, pos, /*out_int32=*/false, /*right=*/true).to(repeats.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("nonzero", Nonzero);
  m.impl("nonzero.out", NonzeroOut);
  m.impl("masked_select", MaskedSelect);
  m.impl("masked_select.out", MaskedSelectOut);
  m.impl("_unique2", Unique2);
  m.impl("unique_dim", UniqueDim);
  m.impl("unique_consecutive", UniqueConsecutive);
  m.impl("repeat_interleave.Tensor", RepeatInterleave);
}

}  // namespace tt
