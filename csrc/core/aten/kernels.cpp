// ATen kernels for the tpu device: tensor creation, views, copies, and the
// generic native kernel that runs any op found in the lowering registry
// (NativeKernel: output metadata comes from meta.cpp, strict mode's replay
// of repeated ops from plan.cpp, lowerings from ops/*).
#include <c10/util/strides.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_copy_from_and_resize_native.h>
#include <map>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/CPUAllocator.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_set>

#include "ops/registry.h"
#include "core/exec/debug.h"
#include "core/exec/events.h"
#include "core/exec/executor.h"
#include "kernels.h"
#include "meta.h"
#include "plan.h"
#include "runtime/runtime.h"
#include "core/device/storage.h"

namespace tt {

using hlo::ET;
using hlo::Type;
using hlo::Value;

static const c10::DispatchKeySet kTpuKeys(c10::DispatchKey::PrivateUse1);

// ---------------------------------------------------------------- creation
// Factories receive the requested device; this process drives one device,
// exposed as index 0 (the dispatcher adds no device guard for us).
static void CheckDevice(const std::optional<c10::Device>& device) {
  if (!device.has_value() || device->type() != c10::DeviceType::PrivateUse1) return;
  TORCH_CHECK(!device->has_index() || device->index() == 0, "torchtpu: invalid device ", *device,
              ": this process drives one tpu device, so the valid range of device indices is [0, 0] "
              "(choose the physical device with TORCHTPU_VISIBLE_DEVICES or torch.tpu.set_device "
              "before first use)");
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin, std::optional<c10::MemoryFormat> mf) {
  CheckDevice(device);
  TORCH_CHECK(!pin.value_or(false), "Only dense CPU tensors can be pinned (got pin_memory=True for a tpu tensor)");
  c10::ScalarType st = c10::dtype_or_default(dtype);
  ToET(st);  // rejects unsupported dtypes by name
  return at::detail::empty_generic(size, GetAllocator(), kTpuKeys, st, mf);
}

at::Tensor empty_strided_tpu(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> pin) {
  CheckDevice(device);
  TORCH_CHECK(!pin.value_or(false), "Only dense CPU tensors can be pinned (got pin_memory=True for a tpu tensor)");
  c10::ScalarType st = c10::dtype_or_default(dtype);
  ToET(st);
  return at::detail::empty_strided_generic(size, stride, GetAllocator(), kTpuKeys, st);
}

// ---------------------------------------------------------------- storage
static void EnsureStorageBytes(const at::Tensor& self, int64_t need) {
  c10::StorageImpl* impl = self.storage().unsafeGetStorageImpl();
  if ((int64_t)impl->nbytes() >= need) return;
  TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
  StatePtr st = GetState(impl);
  int64_t old = st->nbytes;
  GetAllocator()->Resized(old, need);  // may throw OutOfMemoryError
  st->nbytes = need;
  impl->set_nbytes(need);
}

static int64_t NeededBytes(c10::IntArrayRef size, c10::IntArrayRef stride, int64_t offset,
                           int64_t itemsize) {
  int64_t n = 1;
  for (auto s : size)
    if (s == 0) return 0;
  n = offset + 1;
  for (size_t i = 0; i < size.size(); ++i) n += (size[i] - 1) * stride[i];
  return n * itemsize;
}

const at::Tensor& resize(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> mf) {
  auto* impl = self.unsafeGetTensorImpl();
  int64_t offset = self.storage_offset();
  impl->set_sizes_contiguous(size);
  if (mf.has_value() && *mf != c10::MemoryFormat::Contiguous && *mf != c10::MemoryFormat::Preserve)
    impl->empty_tensor_restride(*mf);
  EnsureStorageBytes(self, NeededBytes(self.sizes(), self.strides(), offset, self.element_size()));
  return self;
}

at::Tensor& set_source_storage_offset(at::Tensor& self, c10::Storage source, c10::SymInt offset,
                                      c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  int64_t off = offset.expect_int();
  auto sz = C10_AS_INTARRAYREF_SLOW(size);
  auto sd = C10_AS_INTARRAYREF_SLOW(stride);
  TORCH_CHECK(source.device().type() == c10::DeviceType::PrivateUse1,
              "set_: expected a tpu storage, got ", source.device());
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  if (sd.empty() && !sz.empty()) {
    impl->set_sizes_contiguous(sz);
    impl->set_storage_offset(off);
  } else {
    impl->set_sizes_and_strides(sz, sd, off);
  }
  EnsureStorageBytes(self, NeededBytes(self.sizes(), self.strides(), off, self.element_size()));
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  int64_t n = source.nbytes() / self.element_size();
  std::vector<c10::SymInt> sz{c10::SymInt(n)}, sd{c10::SymInt(1)};
  return set_source_storage_offset(self, std::move(source), c10::SymInt(0), sz, sd);
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& src) {
  if (self.unsafeGetTensorImpl() == src.unsafeGetTensorImpl()) return self;
  return set_source_storage_offset(self, src.storage(), src.sym_storage_offset(), src.sym_sizes(),
                                   src.sym_strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage s(c10::Storage::use_byte_size_t(), 0, GetAllocator(), true);
  std::vector<c10::SymInt> sz{c10::SymInt(0)}, sd{c10::SymInt(1)};
  return set_source_storage_offset(self, s, c10::SymInt(0), sz, sd);
}

// ---------------------------------------------------------------- copies
static bool IsTpu(const at::Tensor& t) { return t.device().type() == c10::DeviceType::PrivateUse1; }

static void Finish(Region& r, uint64_t sig = 0) { r.AfterOp(sig); }

static uint64_t Signature(const std::string& name, const std::vector<at::Tensor>& inputs) {
  uint64_t h = std::hash<std::string>()(name) ^ ((uint64_t)Region::MatmulPrecisionKey() << 56);
  for (const at::Tensor& t : inputs) {
    h = h * 1000003u ^ (uint64_t)t.scalar_type();
    for (auto d : t.sizes()) h = h * 1000003u ^ (uint64_t)d;
    for (auto d : t.strides()) h = h * 31u ^ (uint64_t)d;
  }
  return h;
}

// torchtpu.warmup(): while its count is non-zero, ops compile on first sight
// (no host tier) and their meta keys count as seen HostTierRuns() times, so
// an identical workload afterwards runs every op from compiled programs
// (compiles nothing) instead of compiling the ops the host tier ran on its
// first sightings one request later.
static std::atomic<int>& WarmupDepth() {
  static std::atomic<int> n{0};
  return n;
}
void PushWarmup() { WarmupDepth().fetch_add(1); }
void PopWarmup() { WarmupDepth().fetch_sub(1); }

// Whether an op with this meta key (argument types, shapes, values) has been
// seen fewer than HostTierRuns() times before in this process.
static bool FirstSighting(const std::string& meta_key) {
  static std::mutex mu;
  static std::unordered_map<std::string, int> seen;
  std::lock_guard<std::mutex> g(mu);
  if (seen.size() > (1u << 18)) seen.clear();
  int& n = seen[meta_key];
  if (WarmupDepth().load(std::memory_order_relaxed) > 0) {
    n = std::max(n, HostTierRuns());
    return false;
  }
  return n++ < HostTierRuns();
}

// Whether tpu tensor t's elements are host values (HostReadable: covered by a
// host copy of its storage's current buffer, or a small view of a large
// computed one) and not pending in a region.
static bool OnHost(const at::Tensor& t) {
  const StorageState& st = *GetState(t.storage().unsafeGetStorageImpl());
  if (st.slot >= 0) return false;
  int64_t lo, hi;
  ViewByteRange(t, lo, hi);
  return HostReadable(st, lo, hi);
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.sizes() == dst.sizes() || self.numel() == dst.numel() || true);
  // packed fp4 pairs are bytes here (ToET): like CPU, no value conversions
  TORCH_CHECK(self.scalar_type() == dst.scalar_type() ||
                  (self.scalar_type() != c10::kFloat4_e2m1fn_x2 &&
                   dst.scalar_type() != c10::kFloat4_e2m1fn_x2),
              "\"copy_\" not implemented for 'Float4_e2m1fn_x2' (", self.scalar_type(), " -> ",
              dst.scalar_type(), ")");
  if (dst.numel() == 0) return dst;
  if (IsTpu(self) && !IsTpu(dst)) {
    // device -> host: read the source view contiguously, then let CPU copy_
    // handle dtype conversion and the destination's strides; straight into a
    // contiguous destination of the same dtype (.cpu(), .numpy()).
    if (dst.is_contiguous() && dst.scalar_type() == self.scalar_type() && !self.is_conj() &&
        !self.is_neg() && !dst.is_conj() && !dst.is_neg() && dst.sizes() == self.sizes()) {
      ReadToHost(self, dst.data_ptr());
      return dst;
    }
    at::Tensor host = at::empty(self.sizes(), self.options().device(c10::kCPU));
    ReadToHost(self, host.data_ptr());
    // the raw values of a lazily conjugated/negated view (see the Conjugate
    // and Negative fallthroughs below)
    if (self.is_conj()) host = host.conj_physical();
    if (self.is_neg()) host = host.neg();
    if (dst.scalar_type() == c10::kFloat4_e2m1fn_x2)  // CPU has no strided copy for it: bytes
      dst.view(c10::kByte).copy_(host.view(c10::kByte));
    else
      dst.copy_(host);
    return dst;
  }
  // Same memory-overlap rules as CPU's copy_: a destination whose elements
  // alias each other (expand) is ambiguous, and so is a source that partly
  // overlaps the destination.
  at::assert_no_internal_overlap(dst);
  if (IsTpu(self)) at::assert_no_partial_overlap(dst, self);
  // Checked before anything is recorded: a failed copy must leave the region as it was.
  if (!self.sizes().equals(dst.sizes())) {
    std::vector<int64_t> b = at::infer_size(dst.sizes(), self.sizes());  // CPU's message for mismatches
    TORCH_CHECK(c10::IntArrayRef(b).equals(dst.sizes()), "output with shape ", dst.sizes(),
                " doesn't match the broadcast shape ", c10::IntArrayRef(b));
  }
  std::lock_guard<std::recursive_mutex> g(Region::Lock());
  Region& r = Region::Current();
  r.BeginOp();
  if (!IsTpu(self)) {
    // host -> device
    at::Tensor src = self.resolve_conj().resolve_neg();
    if (src.scalar_type() != dst.scalar_type()) src = src.to(dst.scalar_type());
    if (src.scalar_type() == c10::kFloat4_e2m1fn_x2) src = src.view(c10::kByte);  // as above
    src = src.expand(dst.sizes()).contiguous();
    ET et = ToET(src.scalar_type());
    int64_t nbytes = src.numel() * src.element_size();
    GetMetrics().Native("aten::_copy_from");
    StatePtr st = GetState(dst.storage().unsafeGetStorageImpl());
    const bool whole = r.empty() && dst.storage_offset() == 0 && dst.is_contiguous() && nbytes == st->nbytes;
    if (whole && InHostTier() && nbytes <= kMirrorBytes) {
      // a host-tier result: its bytes stay on the host (also its host copy)
      // until a program needs them
      auto bytes = std::make_shared<const std::string>(static_cast<const char*>(src.data_ptr()), nbytes);
      st->buf = Runtime::Get().HostResident(bytes, ToPjrt(et), src.numel());
      st->et = et;
      st->numel = src.numel();
      SetHostMirror(*st, std::move(bytes));
      return dst;
    }
    pjrt::BufferPtr buf =
        Runtime::Get().Upload(src.data_ptr(), ToPjrt(et), {src.numel()}, nbytes);
    if (whole) {
      st->buf = buf;
      st->et = et;
      st->numel = src.numel();
      return dst;
    }
    Value v = r.BufferArg(buf, Type(et, {src.numel()}));
    r.Write(dst, v);
    Finish(r, Signature("h2d", {dst}));
    return dst;
  }
  // device -> device
  // Host tier (see HostTierEligible): a small conversion into a whole fresh
  // storage (`.to(torch.double)`) converts on the host; not float -> integer,
  // where CPU and XLA differ for NaN and out-of-range values. A value already
  // on the host stays there, compiling nothing.
  const bool host_tier = GetMode() == Mode::Strict && HostTierRuns() > 0 && self.scalar_type() != dst.scalar_type() &&
                         !(at::isFloatingType(self.scalar_type()) && !at::isFloatingType(dst.scalar_type())) &&
                         !self.is_complex() && !dst.is_complex() && self.numel() <= kHostTierMaxElements &&
                         dst.storage_offset() == 0 && dst.is_contiguous() &&
                         dst.numel() * (int64_t)dst.element_size() == (int64_t)dst.storage().nbytes();
  if (host_tier && r.pristine()) {
    std::string key = "aten::_copy_from|" + std::string(c10::toString(self.scalar_type())) + ">" +
                      c10::toString(dst.scalar_type());
    for (int64_t d : self.sizes()) key += "," + std::to_string(d);
    if (FirstSighting(key) || OnHost(self)) {  // as NativeKernel's host tier
      GetMetrics().HostTier("aten::_copy_from");
      at::Tensor host = self.cpu();
      HostTierScope scope;
      dst.copy_(host.to(dst.scalar_type()));  // converted on the host; the result stays there
      return dst;
    }
  }
  GetMetrics().Native("aten::_copy_from");
  Value v = r.Read(self);
  if (self.is_conj() && hlo::IsComplex(v.et())) {
    Type pt = v.type.with_et(hlo::ComplexPart(v.et()));
    Value re = r.b().Op1("stablehlo.real", {v}, pt), im = r.b().Op1("stablehlo.imag", {v}, pt);
    v = r.b().Op1("stablehlo.complex", {re, r.b().Unary("negate", im)}, v.type);
  }
  if (self.is_neg()) v = r.b().Unary("negate", v);
  ET et = ToET(dst.scalar_type());
  v = ops::Cast(r.b(), v, et);
  hlo::Dims d(dst.sizes().begin(), dst.sizes().end());
  v = r.b().BroadcastTo(v, d);
  r.Write(dst, v);
  Finish(r, Signature("d2d", {self, dst}));
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_output(dst, self.sizes());
  return copy_from(self, dst, false);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  at::Tensor host = at::empty({}, self.options().device(c10::kCPU));
  ReadToHost(self, host.data_ptr());
  return host.item();
}

// ---------------------------------------------------------------- native kernel
namespace {


ET ScalarArgType(const c10::Scalar& s, ET result_hint) {
  if (s.isBoolean()) return ET::PRED;
  if (s.isIntegral(false)) return ET::S64;
  if (s.isComplex()) return result_hint == ET::C128 ? ET::C128 : ET::C64;
  return result_hint == ET::F64 ? ET::F64 : ET::F32;
}

std::set<std::string>& WarnedFallbacks() {
  static std::set<std::string> s;
  return s;
}

// Advanced indexing with boolean masks has a data-dependent shape: like
// PyTorch's CPU kernels, turn each mask into long indices (nonzero) first.
// index_put with one full-shape mask and a one-element value stays a mask
// (the lowering selects, no host sync).
void ExpandMaskIndices(const std::string& name, std::vector<c10::IValue>& args) {
  bool is_index = name.rfind("aten::index.Tensor", 0) == 0;
  bool is_put = name.rfind("aten::index_put", 0) == 0 || name.rfind("aten::_index_put_impl_", 0) == 0;
  if (!is_index && !is_put) return;
  if (args.size() < 2 || !args[1].isList()) return;
  auto l = args[1].toList();
  // CPU index tensors (x[torch.tensor([0, 2])] on a tpu x) move to the
  // device, as CUDA's indexing kernels move them.
  bool on_cpu = false;
  for (size_t k = 0; k < l.size(); ++k) {
    c10::IValue e = l.get(k);
    if (e.isTensor() && e.toTensor().defined() && !IsTpu(e.toTensor())) on_cpu = true;
  }
  if (on_cpu) {
    c10::List<std::optional<at::Tensor>> moved;
    for (size_t k = 0; k < l.size(); ++k) {
      c10::IValue e = l.get(k);
      if (!e.isTensor() || !e.toTensor().defined()) moved.push_back(std::nullopt);
      else if (IsTpu(e.toTensor())) moved.push_back(e.toTensor());
      else moved.push_back(e.toTensor().to(args[0].toTensor().device()));
    }
    args[1] = c10::IValue(moved);
    l = args[1].toList();
  }
  bool any = false;
  for (size_t k = 0; k < l.size(); ++k) {
    c10::IValue e = l.get(k);
    if (e.isTensor() && e.toTensor().defined() &&
        (e.toTensor().scalar_type() == c10::kBool || e.toTensor().scalar_type() == c10::kByte))
      any = true;
  }
  if (!any) return;
  if (is_put && l.size() == 1 && args.size() > 2 && args[2].isTensor() && args[2].toTensor().numel() == 1 &&
      l.get(0).toTensor().sizes() == args[0].toTensor().sizes())
    return;
  c10::List<std::optional<at::Tensor>> out;
  for (size_t k = 0; k < l.size(); ++k) {
    c10::IValue e = l.get(k);
    if (!e.isTensor() || !e.toTensor().defined()) {
      out.push_back(std::nullopt);
      continue;
    }
    at::Tensor t = e.toTensor();
    if (t.scalar_type() == c10::kBool || t.scalar_type() == c10::kByte) {
      at::Tensor nz = t.nonzero();
      for (int64_t j = 0; j < t.dim(); ++j) out.push_back(nz.select(1, j));
    } else {
      out.push_back(t);
    }
  }
  args[1] = c10::IValue(out);
}

}  // namespace

// Whether f holds for every tensor argument (lists included).
template <typename F>
static bool EveryTensorArg(const std::vector<c10::IValue>& args, F&& f) {
  for (const auto& a : args) {
    if (a.isTensor() && !f(a.toTensor())) return false;
    if (a.isTensorList())
      for (const at::Tensor& t : a.toTensorVector())
        if (!f(t)) return false;
  }
  return true;
}

// Strict mode's host tier. An op whose meta key was seen fewer than
// HostTierRuns() times (TORCHTPU_HOST_TIER, default 2; FirstSighting) runs on
// the host through PyTorch's CPU kernel instead of paying an XLA compile
// (tens of ms) for a shape that may never come back: tensor printing, shapes
// seen once in test suites and notebooks; then its program compiles as usual.
// Ops on host values (AllOnHost) stay on the host.
// Only small inputs, and only ops whose CPU kernel gives the very same bits
// as the XLA program (data movement, comparisons, min/max, exact rounding
// ops; mul/div are one correctly rounded IEEE operation in f32/f64; sums
// only of integers), so where an op runs never changes its result.
// TORCHTPU_HOST_TIER=0 turns it off.
static bool HostTierEligible(const std::string& name, const std::vector<c10::IValue>& args) {
  if (HostTierRuns() == 0) return false;
  enum Kind { kMove, kCompare, kArith, kIntSum };
  static const std::unordered_map<std::string, Kind> kOps = {
      {"aten::cat", kMove}, {"aten::cat.out", kMove}, {"aten::stack", kMove}, {"aten::stack.out", kMove},
      {"aten::index_select", kMove}, {"aten::clone", kMove}, {"aten::abs", kMove}, {"aten::neg", kMove},
      {"aten::ceil", kMove}, {"aten::floor", kMove}, {"aten::trunc", kMove}, {"aten::where.self", kMove},
      {"aten::max", kMove}, {"aten::min", kMove}, {"aten::amax", kMove}, {"aten::amin", kMove},
      {"aten::eq.Tensor", kCompare}, {"aten::eq.Scalar", kCompare}, {"aten::ne.Tensor", kCompare},
      {"aten::ne.Scalar", kCompare}, {"aten::lt.Tensor", kCompare}, {"aten::lt.Scalar", kCompare},
      {"aten::le.Tensor", kCompare}, {"aten::le.Scalar", kCompare}, {"aten::gt.Tensor", kCompare},
      {"aten::gt.Scalar", kCompare}, {"aten::ge.Tensor", kCompare}, {"aten::ge.Scalar", kCompare},
      {"aten::bitwise_and.Tensor", kCompare}, {"aten::bitwise_or.Tensor", kCompare},
      {"aten::bitwise_not", kCompare}, {"aten::logical_not", kCompare}, {"aten::logical_and", kCompare},
      {"aten::logical_or", kCompare}, {"aten::isnan", kCompare}, {"aten::isinf", kCompare},
      {"aten::mul.Tensor", kArith}, {"aten::div.Tensor", kArith}, {"aten::sum", kIntSum},
      {"aten::sum.dim_IntList", kIntSum},
  };
  auto it = kOps.find(name);
  if (it == kOps.end()) return false;
  if (it->second == kIntSum && !args.empty() && !args.back().isNone()) return false;  // sum(dtype=...)
  auto ok = [&](const at::Tensor& t) {
    if (!t.defined()) return true;
    if (t.numel() > kHostTierMaxElements || t.is_complex()) return false;
    switch (it->second) {
      case kArith: return t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble ||
                          !at::isFloatingType(t.scalar_type());
      case kIntSum: return !at::isFloatingType(t.scalar_type());
      default: return true;
    }
  };
  return EveryTensorArg(args, ok);
}

// Runs op through its CPU kernel as the host tier does: subnormals as the
// device treats them, results uploaded with a host copy kept.
static void RunOnHost(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::string& name) {
  GetMetrics().HostTier(name);
  HostTierScope scope;
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
}

// Whether every tpu tensor argument is a host value (OnHost; and there is
// one): ops on values already on the host (a chain of host-tier results, a
// tensor being printed) stay there, compiling nothing.
static bool AllOnHost(const std::vector<c10::IValue>& args) {
  bool any = false;
  auto on_host = [&](const at::Tensor& t) {
    if (!t.defined() || !IsTpu(t)) return true;
    any = true;
    return OnHost(t);
  };
  return EveryTensorArg(args, on_host) && any;
}

// What NativeKernel needs to know about an operator besides its arguments,
// computed once per schema (the dispatcher's schemas live for the process).
struct OpStatic {
  std::string name;  // "aten::add.Tensor"
  const ops::Lowering* lw = nullptr;
  std::vector<std::string> arg_names;
  bool matmul = false, fill = false, batch_norm = false;
};

static const OpStatic& GetOpStatic(const c10::FunctionSchema& schema) {
  static std::mutex mu;
  static std::unordered_map<const c10::FunctionSchema*, std::unique_ptr<OpStatic>> cache;
  std::lock_guard<std::mutex> g(mu);
  auto& slot = cache[&schema];
  if (!slot) {
    auto o = std::make_unique<OpStatic>();
    o->name = schema.name();
    if (!schema.overload_name().empty()) o->name += "." + schema.overload_name();
    o->lw = ops::Find(o->name);
    for (const auto& a : schema.arguments()) o->arg_names.push_back(a.name());
    static const std::unordered_set<std::string> kMatmul = {"aten::mm", "aten::addmm", "aten::bmm",
        "aten::baddbmm", "aten::addmv", "aten::mv", "aten::dot", "aten::matmul", "aten::addbmm"};
    o->matmul = kMatmul.count(schema.name()) > 0;
    // fill_/zero_ write one value: CPU allows expanded (self-aliasing) outputs.
    o->fill = schema.name() == "aten::fill_" || schema.name() == "aten::zero_";
    o->batch_norm = o->name == "aten::native_batch_norm" || o->name == "aten::native_batch_norm.out";
    slot = std::move(o);
  }
  return *slot;
}

// Memory overlap, as CPU's TensorIterator checks it: a written argument
// must not alias itself (expanded views) nor partly overlap an input.
static void CheckOverlap(const OpStatic& info, const std::vector<c10::IValue>& args,
                         const std::vector<at::Tensor>& flat_inputs, const std::vector<at::Tensor>& outs) {
  std::vector<const at::Tensor*> inputs;
  for (auto& a : args) {
    if (a.isTensor() && a.toTensor().defined() && IsTpu(a.toTensor())) inputs.push_back(&a.toTensor());
  }
  bool check_internal = !info.fill;
  bool check_partial = !info.matmul;
  for (const at::Tensor& real : outs) {
    bool is_input = false;
    for (const at::Tensor& fi : flat_inputs)
      if (fi.unsafeGetTensorImpl() == real.unsafeGetTensorImpl()) is_input = true;
    if (!is_input || !real.defined() || real.numel() == 0) continue;
    if (check_internal) at::assert_no_internal_overlap(real);
    if (!check_partial) continue;
    for (const at::Tensor* in : inputs)
      if (in->unsafeGetTensorImpl() != real.unsafeGetTensorImpl()) at::assert_no_partial_overlap(real, *in);
  }
}

// Argument i of an op as its lowering sees it: tpu tensors read from the
// region, Scalars (and CPU 0-d tensors) as 0-d program arguments (logged in
// plan), other values as they are. `hint` is the first output's element type.
static ops::Arg LowerArg(Region& r, PlanRecorder& plan, const std::string& name, const c10::Argument& sa,
                         const c10::IValue& v, size_t i, ET hint) {
  ops::Arg a;
  if (v.isNone()) {
    a.kind = ops::Arg::None;
  } else if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) {
      a.kind = ops::Arg::None;
    } else if (IsTpu(t)) {
      a.kind = ops::Arg::Tensor;
      a.v = r.Read(t);
    } else {
      TORCH_CHECK(t.dim() == 0, name, ": expected all tensors on the tpu device, but argument '",
                  sa.name(), "' is on ", t.device());
      a.kind = ops::Arg::Scalar;
      c10::Scalar s = t.item();
      ET set = ScalarArgType(s, hint);
      a.v = r.Scalar(s, set);
      plan.Scalar(a.v, {(int)i, -1, set});
      a.v = ops::Cast(r.b(), a.v, ToET(t.scalar_type()));
      a.scalar_value = s.isComplex() ? 0.0 : s.toDouble();
    }
  } else if (v.isTensorList()) {
    a.kind = ops::Arg::TensorList;
    for (const at::Tensor& t : v.toTensorVector()) {
      TORCH_CHECK(IsTpu(t), name, ": expected all tensors of '", sa.name(),
                  "' on the tpu device, got ", t.device());
      a.vs.push_back(r.Read(t));
    }
  } else if (v.isList() && v.toList().elementType()->kind() == c10::TypeKind::OptionalType) {
    a.kind = ops::Arg::OptTensorList;
    auto l = v.toList();
    for (size_t k = 0; k < l.size(); ++k) {
      c10::IValue e = l.get(k);
      if (e.isNone() || !e.toTensor().defined()) a.ovs.push_back(std::nullopt);
      else a.ovs.push_back(r.Read(e.toTensor()));
    }
  } else if (v.isScalar() && sa.type()->kind() != c10::TypeKind::IntType &&
             sa.type()->kind() != c10::TypeKind::FloatType &&
             sa.type()->kind() != c10::TypeKind::BoolType) {
    c10::Scalar s = v.toScalar();
    a.kind = ops::Arg::Scalar;
    ET set = ScalarArgType(s, hint);
    a.v = r.Scalar(s, set);
    plan.Scalar(a.v, {(int)i, -1, set});
    a.scalar_is_float = s.isFloatingPoint();
    a.scalar_is_int = s.isIntegral(false);
    a.scalar_is_bool = s.isBoolean();
    a.scalar_is_complex = s.isComplex();
    a.scalar_value = s.isComplex() ? 0.0 : s.toDouble();
  } else if (v.isList() && sa.type()->kind() == c10::TypeKind::ListType &&
             sa.type()->containedType(0)->kind() == c10::TypeKind::NumberType) {
    // Scalar[] (e.g. per-tensor learning rates): program arguments, never literals.
    a.kind = ops::Arg::ScalarList;
    auto l = v.toList();
    for (size_t k = 0; k < l.size(); ++k) {
      c10::Scalar s = l.get(k).toScalar();
      ET set = ScalarArgType(s, hint);
      a.vs.push_back(r.Scalar(s, set));
      plan.Scalar(a.vs.back(), {(int)i, (int)k, set});
      a.doubles.push_back(s.isComplex() ? 0.0 : s.toDouble());
    }
  } else if (v.isInt()) {
    a.kind = ops::Arg::Int;
    a.i = v.toInt();
    if (sa.type()->kind() == c10::TypeKind::ScalarTypeType ||
        (sa.type()->kind() == c10::TypeKind::OptionalType &&
         sa.type()->containedType(0)->kind() == c10::TypeKind::ScalarTypeType))
      a.i = (int64_t)ToET((c10::ScalarType)v.toInt());
  } else if (v.isDouble()) {
    a.kind = ops::Arg::Double;
    a.d = v.toDouble();
  } else if (v.isBool()) {
    a.kind = ops::Arg::Bool;
    a.b = v.toBool();
  } else if (v.isIntList()) {
    a.kind = ops::Arg::IntList;
    a.ints = v.toIntVector();
  } else if (v.isDoubleList()) {
    a.kind = ops::Arg::DoubleList;
    a.doubles = v.toDoubleVector();
  } else if (v.isBoolList()) {
    a.kind = ops::Arg::BoolList;
    for (bool x : v.toBoolList()) a.bools.push_back(x);
  } else if (v.isString()) {
    a.kind = ops::Arg::String;
    a.s = v.toStringRef();
  } else if (v.isGenerator()) {
    a.kind = ops::Arg::Other;
  } else {
    a.kind = ops::Arg::Other;
  }
  return a;
}

// ---------------------------------------------------------------- device rules
// CUDA's rules for tensors of other devices among tpu tensors, so code written
// on tpu does not break on CUDA: an op whose native_functions.yaml entry has no
// `device_check: NoCheck` takes every tensor argument (lists and optional
// tensors too) on the one device; a NoCheck op (TensorIterator ops, index,
// copies) also takes CPU 0-d tensors, used as numbers, and index/index_put
// take CPU index tensors. Ops outside ATen's yaml follow the NoCheck rule.
#include "device_rules.inc"  // kExactSameDeviceOps, generated from the installed torch

static bool ExactSameDevice(const std::string& name) {
  static const std::unordered_set<std::string> ops(std::begin(kExactSameDeviceOps), std::end(kExactSameDeviceOps));
  return ops.count(name) > 0;
}

static bool TakesCpuIndices(const std::string& name, const std::string& arg) {
  static const std::unordered_set<std::string> ops = {
      "aten::index.Tensor", "aten::index.Tensor_out", "aten::index_put_", "aten::index_put",
      "aten::index_put.out", "aten::_index_put_impl_", "aten::_index_put_impl", "aten::_index_put_impl.out",
      "aten::_unsafe_index_put"};
  return arg == "indices" && ops.count(name) > 0;
}

static bool IsCopy(const std::string& name) {
  static const std::unordered_set<std::string> ops = {
      "aten::copy_", "aten::copy", "aten::copy.out", "aten::_copy_from", "aten::_copy_from_and_resize",
      "aten::_to_copy", "aten::_to_copy.out", "aten::set_.source_Tensor", "aten::set_.source_Storage",
      "aten::set_.source_Storage_storage_offset", "aten::set_.source_Tensor_storage_offset"};
  return ops.count(name) > 0;
}

static void CheckDevices(const c10::FunctionSchema& schema, const std::string& name, const std::vector<c10::IValue>& args) {
  if (IsCopy(name)) return;
  const bool exact = ExactSameDevice(name);
  auto check = [&](const at::Tensor& t, size_t i) {
    if (!t.defined() || IsTpu(t)) return;
    const std::string& arg = schema.arguments()[i].name();
    if (!exact && t.dim() == 0 && t.device().is_cpu()) return;
    if (!exact && TakesCpuIndices(name, arg) && t.device().is_cpu()) return;
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, tpu:0 and ",
                t.device(), "! (when checking argument for argument ", arg, " in method ", name, ")");
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    if (v.isTensor()) {
      check(v.toTensor(), i);
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) check(t, i);
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef())
        if (e.isTensor()) check(e.toTensor(), i);
    }
  }
}

void NativeKernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const OpStatic& info = GetOpStatic(schema);
  const std::string& name = info.name;
  const ops::Lowering* lw = info.lw;
  TORCH_CHECK(lw, "torchtpu: no lowering registered for ", name);
  size_t nargs = schema.arguments().size();
  std::vector<c10::IValue> args(stack->end() - nargs, stack->end());
  CheckDevices(schema, name, args);
  ExpandMaskIndices(name, args);

  // The meta key: what output metadata (below), op plans and the host tier's
  // sightings depend on (argument dtypes, sizes, strides, values).
  std::string key;
  std::vector<at::Tensor> flat_inputs;
  MetaKey(schema, name, args, key, flat_inputs);
  // Strict mode's host tier, before any output metadata, lowering or program
  // text: an op with these argument types and shapes seen fewer than
  // HostTierRuns() times runs on the host (printing, shapes seen once), and
  // so does an op on values already on the host. Every sighting counts,
  // whichever way it ran, so once its inputs come from the device an op seen
  // often enough compiles at once: a workload's ops all reach the device
  // together (generate: from the third request on), not one link of a chain
  // of host values per repetition.
  const bool host_tier = GetMode() == Mode::Strict && HostTierEligible(name, args);
  if (host_tier) {
    const bool first = FirstSighting(key);
    std::lock_guard<std::recursive_mutex> g(Region::Lock());
    if (first || AllOnHost(args)) {
      RunOnHost(op, stack, name);
      return;
    }
  }
  const Mode mode = GetMode();
  const bool debug = mode == Mode::Debug;
  // Strict mode replays the plan of an earlier call with the same argument
  // metadata, or records one (plan.h).
  PlanRecorder plan;
  std::string plan_key;
  if (mode == Mode::Strict && PlansEnabled() && !CapturingPrograms()) {
    std::lock_guard<std::recursive_mutex> g(Region::Lock());
    if (Region::Current().pristine()) {
      plan_key = key;
      plan_key += Region::MatmulPrecisionKey();
      PlanKey(flat_inputs, plan_key);
      if (ReplayPlan(plan_key, schema, name, args, flat_inputs, stack)) return;
      plan.active = true;
    }
  }
  // 1. Output metadata from PyTorch's meta kernels (also validates input),
  //    cached per meta key (some are Python and slow). Debug mode runs the
  //    meta kernel uncached and validates against it.
  std::shared_ptr<MetaResult> mr = OutputMeta(op, name, args, key, flat_inputs, debug);
  if (debug) DebugBoundsCheck(schema, args);

  std::vector<at::Tensor> outs;   // real output tensors (in order of tensor returns)
  std::vector<c10::IValue> rets;  // values to return
  auto make = [&](const OutSpec& o) {
    if (o.input >= 0) {
      at::Tensor real = flat_inputs[o.input];
      if (real.sizes() != c10::IntArrayRef(o.sizes)) {
        real.resize_(o.sizes);
        plan.active = false;  // a plan never resizes an argument
      }
      return real;
    }
    return empty_strided_tpu(o.sizes, o.strides, o.dtype, std::nullopt, std::nullopt, std::nullopt);
  };
  for (const MetaRet& r : mr->rets) {
    if (r.kind == 0) {
      at::Tensor real = make(r.tensors[0]);
      outs.push_back(real);
      rets.push_back(real);
    } else if (r.kind == 1) {
      std::vector<at::Tensor> list;
      for (const OutSpec& o : r.tensors) {
        list.push_back(make(o));
        outs.push_back(list.back());
      }
      rets.push_back(c10::IValue(list));
    } else {
      rets.push_back(r.other);
    }
  }

  // Ops that mutate arguments without returning them (e.g. _foreach_add_):
  // the written arguments are the outputs, in schema order.
  size_t n_returned = outs.size();
  if (!schema.returns().empty()) {
    // Mutated arguments that are not returned (e.g. _amp_update_scale_'s
    // growth_tracker) follow the returned outputs; a lowering may return
    // values for them (or only for the returned outputs).
    std::unordered_set<const c10::TensorImpl*> seen;
    for (auto& t : outs) seen.insert(t.unsafeGetTensorImpl());
    for (size_t i = 0; i < nargs; ++i) {
      const auto* ai = schema.arguments()[i].alias_info();
      if (!ai || !ai->isWrite()) continue;
      const c10::IValue& v = args[i];
      if (v.isTensor() && v.toTensor().defined() && IsTpu(v.toTensor()) &&
          !seen.count(v.toTensor().unsafeGetTensorImpl()))
        outs.push_back(v.toTensor());
    }
    // native_batch_norm updates running_mean/running_var in place when
    // training although its schema does not mark them written (CPU/CUDA do).
    if (info.batch_norm && nargs > 5 &&
        args[5].isBool() && args[5].toBool()) {
      for (size_t i = 3; i <= 4; ++i)
        if (args[i].isTensor() && args[i].toTensor().defined() && IsTpu(args[i].toTensor()))
          outs.push_back(args[i].toTensor());
    }
  } else {
    for (size_t i = 0; i < nargs; ++i) {
      const auto* ai = schema.arguments()[i].alias_info();
      if (!ai || !ai->isWrite()) continue;
      const c10::IValue& v = args[i];
      if (v.isTensor() && v.toTensor().defined()) outs.push_back(v.toTensor());
      else if (v.isTensorList())
        for (const at::Tensor& t : v.toTensorVector()) outs.push_back(t);
    }
  }

  CheckOverlap(info, args, flat_inputs, outs);

  // 2. Lower into the current region.
  std::lock_guard<std::recursive_mutex> g(Region::Lock());
  Region& r = Region::Current();
  r.BeginOp();
  ET hint = outs.empty() ? ET::F32 : ToET(outs[0].scalar_type());
  ops::LowerCtx c{r.b(), name, {}, info.arg_names, {}, {}};
  bool writing = false;  // the op began writing its outputs into the region
  c.args.reserve(nargs);
  try {
    for (size_t i = 0; i < nargs; ++i)
      c.args.push_back(LowerArg(r, plan, name, schema.arguments()[i], args[i], i, hint));
    for (auto& t : outs) c.outs.push_back(Type(ToET(t.scalar_type()), hlo::Dims(t.sizes().begin(), t.sizes().end())));
    c.host_scalar = [&r, &plan](double d, ET et) {
      Value v = r.Scalar(c10::Scalar(d), et);
      plan.Scalar(v, {-1, -1, et});
      return v;
    };
    c.float_arg_input = [&r, &plan, &args](size_t i, ET et) {
      Value v = r.Scalar(c10::Scalar(args[i].toDouble()), et);
      plan.Scalar(v, {(int)i, -1, et});
      return v;
    };
    if (lw->random) {
      c10::optional<at::Generator> gen;
      for (auto& v : args)
        if (v.isGenerator()) gen = v.toGenerator();
      int64_t numel = 1;
      for (auto& t : outs) numel = std::max<int64_t>(numel, t.numel());
      c.rng_key = [&r, gen, numel] { return r.RngKey(gen, numel); };
    }
    // strict / defer_and_fuse: the index arguments' bounds, from their values
    // before the op writes (checked at the next synchronization, as CUDA does)
    std::shared_ptr<PendingCheckValue> bounds;
    if (!debug) bounds = RecordBoundsCheck(r, schema, args);
    r.FollowMatmulPrecision();
    std::vector<Value> vals = lw->fn(c);
    if (!schema.returns().empty() && vals.size() == n_returned && n_returned < outs.size())
      outs.resize(n_returned);
    TORCH_CHECK(vals.size() == outs.size(), "torchtpu: lowering of ", name, " returned ", vals.size(),
                " values for ", outs.size(), " outputs");
    if (debug) DebugValidateOutputs(name, *mr, outs, n_returned, vals);
    writing = true;
    for (size_t i = 0; i < outs.size(); ++i) {
      if (!vals[i].valid()) continue;  // a written argument the lowering left unchanged
      Value v = ops::Cast(r.b(), vals[i], ToET(outs[i].scalar_type()));
      r.Write(outs[i], v);
    }
    AttachBoundsCheck(r, bounds);
  } catch (const ops::LowerError& e) {
    r.Recover(writing);
    TORCH_CHECK(false, e.what());
  } catch (const pjrt::Error& e) {
    r.Recover(writing);
    TORCH_CHECK(false, "torchtpu: ", name, ": ", e.what());
  } catch (...) {
    r.Recover(writing);
    throw;
  }
  Region::Record rec;
  if (plan.active) r.RecordNextFlush(&rec);
  try {
    if (debug) DebugFinish(name, outs);
    else Finish(r, Signature(name, flat_inputs));
  } catch (const pjrt::Error& e) {
    TORCH_CHECK(false, "torchtpu: ", name, " failed on the device: ", e.what());
  }
  plan.Finish(plan_key, mr, rec, args, c.args, flat_inputs, outs);
  GetMetrics().Native(name);
  torch::jit::drop(*stack, nargs);
  for (auto& v : rets) stack->push_back(std::move(v));
}

// ---------------------------------------------------------------- CPU fallback
static std::unordered_set<std::string>& FallbackBlocklist() {
  static std::unordered_set<std::string> s = {
      "aten::as_strided", "aten::view", "aten::_reshape_alias", "aten::unfold",
      "aten::set_", "aten::resize_", "aten::_local_scalar_dense", "aten::_copy_from",
      "aten::empty", "aten::empty_strided", "aten::view_as_real", "aten::view_as_complex",
  };
  return s;
}

void CpuFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  std::string name = schema.name();
  if (!schema.overload_name().empty()) name += "." + schema.overload_name();
  TORCH_CHECK(!FallbackBlocklist().count(schema.name()), "torchtpu: ", name,
              " has no tpu kernel and cannot run through the CPU fallback");
  {
    std::lock_guard<std::mutex> g(GetMetrics().mu);
    auto& warned = WarnedFallbacks();
    if (!warned.count(name)) {
      warned.insert(name);
      TORCH_WARN("torchtpu: ", name,
                 " has no native tpu lowering yet; running it on the CPU (copies to and from "
                 "the host). This warning is shown once per op.");
    }
  }
  {
    const size_t nargs = schema.arguments().size();
    CheckDevices(schema, name, std::vector<c10::IValue>(stack->end() - nargs, stack->end()));
  }
  GetMetrics().Fallback(name);
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
}

// `param.data = t`, `Module.to` and `set_data` ask whether a tensor may take
// another's TensorImpl fields. TensorImpl's own rule knows only the built-in
// dense backends (CPU, CUDA, ...), so a CPU parameter moved to tpu would get a
// new Parameter per module and tied weights would come untied. Dense strided
// tensors of tpu and of those backends are compatible, as CPU and CUDA are.
static bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set())) return true;
  auto dense = [](const at::Tensor& t) {
    if (t.layout() != c10::kStrided || t.is_quantized() || t.is_nested()) return false;
    switch (t.device().type()) {
      case c10::kPrivateUse1: case c10::kCPU: case c10::kCUDA: case c10::kMPS: case c10::kHIP:
      case c10::kXPU: case c10::kHPU: case c10::kMTIA:
        return true;
      default:
        return false;
    }
  };
  return dense(self) && dense(from);
}

// torch.equal as CPU's kernel answers it: same device required, dtypes
// promoted, different sizes unequal, NaN unequal to itself; one device program
// and one host read (transformers' tests call it for every state-dict check).
static bool equal_tpu(const at::Tensor& self, const at::Tensor& other) {
  TORCH_CHECK(self.device() == other.device(), "Cannot compare two tensors on different devices. Got: ",
              self.device(), " and ", other.device());
  if (!self.is_same_size(other)) return false;
  if (self.numel() == 0) return true;
  return at::eq(self, other).all().item<bool>();
}

// ---------------------------------------------------------------- registration
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("equal", equal_tpu);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided_tpu);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("unfold", at::native::unfold);
  m.impl("view_as_real", at::native::view_as_real);
  m.impl("view_as_complex", at::native::view_as_complex);
  m.impl("resize_", resize);
  m.impl("set_.source_Storage_storage_offset", set_source_storage_offset);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_", set_empty);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
}

// PyTorch has no meta functions for the fused GRU cell (CUDA-only upstream,
// which PyTorch's GRU also uses on PrivateUse1 devices); NativeKernel takes
// output shapes from meta. The backward always returns both bias grads.
static std::tuple<at::Tensor, at::Tensor> FusedGruCellMeta(const at::Tensor& ig, const at::Tensor& hg,
                                                          const at::Tensor& hx, const std::optional<at::Tensor>&,
                                                          const std::optional<at::Tensor>&) {
  TORCH_CHECK(ig.dim() == 2 && hg.sizes() == ig.sizes() && hx.dim() == 2 && ig.size(1) == 3 * hx.size(1) &&
                  ig.size(0) == hx.size(0),
              "_thnn_fused_gru_cell: expected input_gates and hidden_gates of shape [B, 3H] and hx of [B, H], got ",
              ig.sizes(), ", ", hg.sizes(), ", ", hx.sizes());
  return {at::empty_like(hx), at::empty({hx.size(0), 5 * hx.size(1)}, hx.options())};
}
static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> FusedGruCellBackwardMeta(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool) {
  int64_t b = grad_hy.size(0), h = grad_hy.size(1);
  auto o = grad_hy.options();
  return {at::empty({b, 3 * h}, o), at::empty({b, 3 * h}, o), at::empty({b, h}, o), at::empty({3 * h}, o),
          at::empty({3 * h}, o)};
}
TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("_thnn_fused_gru_cell", FusedGruCellMeta);
  m.impl("_thnn_fused_gru_cell_backward", FusedGruCellBackwardMeta);
}

// copy_from resolves the conj/neg bits of its source itself: the generic
// Conjugate/Negative fallbacks would clone the source, and clone copies
// through _copy_from again (endless recursion).
TORCH_LIBRARY_IMPL(aten, Conjugate, m) { m.impl("_copy_from", torch::CppFunction::makeFallthrough()); }
TORCH_LIBRARY_IMPL(aten, Negative, m) { m.impl("_copy_from", torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&CpuFallback>());
}

// AutocastPrivateUse1: see autocast.cpp.

// Registers the generic native kernel for every op in the lowering registry
// (called once at import, after all lowerings have registered).
void RegisterNativeKernels() {
  // one library per namespace: aten, and torchtpu (ops defined in Python,
  // torchtpu/quant.py, before this runs)
  static std::map<std::string, std::unique_ptr<torch::Library>> libs;
  if (!libs.empty()) return;
  for (const std::string& full : ops::RegisteredOps()) {
    size_t sep = full.find("::");
    std::string ns = full.substr(0, sep), n = full.substr(sep + 2);
    size_t dot = n.find('.');
    c10::OperatorName opname(ns + "::" + n.substr(0, dot), dot == std::string::npos ? "" : n.substr(dot + 1));
    auto handle = c10::Dispatcher::singleton().findSchema(opname);
    if (!handle) continue;
    auto& lib = libs[ns];
    if (!lib)
      lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns,
                                             std::optional<c10::DispatchKey>(c10::DispatchKey::PrivateUse1),
                                             __FILE__, __LINE__);
    if (ops::Find(full)->graph_only) continue;
    // Composite ops decompose above us (their autograd comes from the
    // decomposition); a backend kernel would bypass it. Their lowerings still
    // serve torch.compile graphs.
    if (handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) continue;
    // a kernel of our own registered for it already (it calls NativeKernel
    // for what the lowering covers: sparse.cpp)
    if (handle->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
    lib->impl(n.c_str(), torch::CppFunction::makeFromBoxedFunction<&NativeKernel>());
  }
}

}  // namespace tt
