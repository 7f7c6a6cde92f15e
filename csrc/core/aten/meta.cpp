// Output metadata of tpu ops (see meta.h).
#include "meta.h"

#include <ATen/MetaFunctions.h>
#include <ATen/ScalarOps.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <c10/util/strides.h>

#include <algorithm>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/exec/debug.h"
#include "runtime/runtime.h"
#include "core/device/storage.h"
#include <torch/library.h>

namespace tt {

using hlo::Value;

namespace {

static bool IsTpu(const at::Tensor& t) { return t.device().type() == c10::DeviceType::PrivateUse1; }

struct MetaConv {
  std::unordered_map<const c10::TensorImpl*, at::Tensor> meta_to_real;
  // One meta tensor per real tensor: `x.sub_(x)` passes x twice, and the
  // meta kernel's returned self must map back to x (else the result would go
  // to a new tensor and x would stay unchanged).
  std::unordered_map<const c10::TensorImpl*, at::Tensor> real_to_meta;
  at::Tensor ToMeta(const at::Tensor& t) {
    if (!t.defined() || !IsTpu(t)) return t;
    auto it = real_to_meta.find(t.unsafeGetTensorImpl());
    if (it != real_to_meta.end()) return it->second;
    at::Tensor m = at::empty_strided(t.sizes(), t.strides(),
                                     t.options().device(c10::kMeta));
    meta_to_real[m.unsafeGetTensorImpl()] = t;
    real_to_meta[t.unsafeGetTensorImpl()] = m;
    return m;
  }
  c10::IValue Convert(const c10::IValue& v) {
    if (v.isTensor()) return ToMeta(v.toTensor());
    // Factories (tril_indices, ...) whose meta kernel is a Python reference
    // would otherwise run real tpu ops just to compute the output shape.
    if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) return c10::Device(c10::kMeta);
    if (v.isTensorList()) {
      std::vector<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorVector()) out.push_back(ToMeta(t));
      return c10::IValue(out);
    }
    if (v.isList()) {
      auto l = v.toList();
      if (l.size() > 0 && (l.elementType()->kind() == c10::TypeKind::OptionalType)) {
        c10::List<std::optional<at::Tensor>> out;
        for (size_t i = 0; i < l.size(); ++i) {
          c10::IValue e = l.get(i);
          if (e.isNone()) out.push_back(std::nullopt);
          else out.push_back(ToMeta(e.toTensor()));
        }
        return c10::IValue(out);
      }
    }
    return v;
  }
};

void AppendRaw(std::string& k, const void* p, size_t n) { k.append(static_cast<const char*>(p), n); }

void KeyTensor(std::string& k, const at::Tensor& t, std::vector<at::Tensor>& flat) {
  if (!t.defined()) {
    k += 'u';
    return;
  }
  if (!IsTpu(t)) {
    // CPU 0-d tensor used as a scalar: its value is data, not metadata; a
    // wrapped Python number promotes differently from a 0-d tensor
    k += t.unsafeGetTensorImpl()->is_wrapped_number() ? 'w' : 'c';
    k += (char)t.scalar_type();
    AppendRaw(k, t.sizes().data(), t.dim() * sizeof(int64_t));
    return;
  }
  // identical tensors passed twice must map to one flattened index
  for (size_t i = 0; i < flat.size(); ++i)
    if (flat[i].unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
      k += 'r';
      AppendRaw(k, &i, sizeof(i));
      return;
    }
  flat.push_back(t);
  k += 't';
  k += (char)t.scalar_type();
  k += (char)t.dim();
  AppendRaw(k, t.sizes().data(), t.dim() * sizeof(int64_t));
  AppendRaw(k, t.strides().data(), t.dim() * sizeof(int64_t));
  bool grad = t.requires_grad();
  k += grad ? 'g' : 'n';
}

bool IsScalarType(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::NumberType) return true;
  if (t->kind() == c10::TypeKind::OptionalType) return IsScalarType(t->containedType(0));
  if (t->kind() == c10::TypeKind::ListType) return IsScalarType(t->containedType(0));
  return false;
}

// Ops whose output shape depends on Scalar values (keyed by value).
bool ShapeFromScalars(const std::string& name) {
  return name.rfind("aten::arange", 0) == 0 || name.rfind("aten::linspace", 0) == 0 ||
         name.rfind("aten::logspace", 0) == 0 || name.rfind("aten::range", 0) == 0;
}

}  // namespace

void MetaKey(const c10::FunctionSchema& schema, const std::string& name,
             const std::vector<c10::IValue>& args, std::string& k, std::vector<at::Tensor>& flat) {
  k.reserve(256);
  k = name;
  k += '|';
  bool by_value = ShapeFromScalars(name);
  for (size_t ai = 0; ai < args.size(); ++ai) {
    const c10::IValue& v = args[ai];
    if (!by_value && !v.isTensor() && IsScalarType(schema.arguments()[ai].type())) {
      // Meta results depend on a Scalar's type, not its value: a new
      // learning rate must not miss this cache.
      if (v.isList()) {
        k += 'S';
        auto l = v.toList();
        for (size_t i = 0; i < l.size(); ++i) k += (char)l.get(i).tagKind()[0];
        k += ']';
      } else {
        k += 's';
        k += v.tagKind();
      }
      continue;
    }
    if (v.isTensor()) {
      KeyTensor(k, v.toTensor(), flat);
    } else if (v.isTensorList()) {
      k += 'L';
      for (const at::Tensor& t : v.toTensorVector()) KeyTensor(k, t, flat);
      k += ']';
    } else if (v.isList() && v.toList().elementType()->kind() == c10::TypeKind::OptionalType) {
      k += 'O';
      auto l = v.toList();
      for (size_t i = 0; i < l.size(); ++i) {
        c10::IValue e = l.get(i);
        if (e.isNone()) k += 'u';
        else KeyTensor(k, e.toTensor(), flat);
      }
      k += ']';
    } else if (v.isNone()) {
      k += 'N';
    } else if (v.isInt()) {
      int64_t x = v.toInt();
      k += 'i';
      AppendRaw(k, &x, 8);
    } else if (v.isDouble()) {
      k += 'd';
      // An op that returns nothing (a fused optimizer step) has no output
      // metadata a float could change: a scheduler's new lr hits the cache.
      if (schema.returns().empty()) continue;
      double x = v.toDouble();
      AppendRaw(k, &x, 8);
    } else if (v.isBool()) {
      k += v.toBool() ? 'T' : 'F';
    } else if (v.isComplexDouble()) {
      auto x = v.toComplexDouble();
      k += 'z';
      AppendRaw(k, &x, 16);
    } else if (v.isIntList()) {
      k += 'I';
      for (int64_t x : v.toIntVector()) AppendRaw(k, &x, 8);
      k += ']';
    } else if (v.isDoubleList()) {
      k += 'D';
      for (double x : v.toDoubleVector()) AppendRaw(k, &x, 8);
      k += ']';
    } else if (v.isBoolList()) {
      k += 'B';
      for (bool x : v.toBoolList()) k += x ? '1' : '0';
      k += ']';
    } else if (v.isString()) {
      k += 's';
      k += v.toStringRef();
      k += '"';
    } else if (v.isGenerator()) {
      k += 'G';
    } else if (v.isDevice()) {
      k += 'v';
    } else if (v.isList()) {
      // scalar lists (e.g. _foreach_add_.ScalarList): values and types
      k += 'S';
      auto l = v.toList();
      for (size_t i = 0; i < l.size(); ++i) {
        c10::IValue e = l.get(i);
        if (e.isDouble()) { double x = e.toDouble(); k += 'd'; AppendRaw(k, &x, 8); }
        else if (e.isInt()) { int64_t x = e.toInt(); k += 'i'; AppendRaw(k, &x, 8); }
        else if (e.isBool()) k += e.toBool() ? 'T' : 'F';
        else k += '?';
      }
      k += ']';
    } else {
      k += '?';
      k += v.tagKind();
    }
  }
}

namespace {

std::mutex g_meta_mu;
std::unordered_map<std::string, std::shared_ptr<MetaResult>> g_meta_cache;

std::shared_ptr<MetaResult> LookupMeta(const std::string& key) {
  std::lock_guard<std::mutex> g(g_meta_mu);
  auto it = g_meta_cache.find(key);
  return it == g_meta_cache.end() ? nullptr : it->second;
}

void StoreMeta(const std::string& key, std::shared_ptr<MetaResult> r) {
  std::lock_guard<std::mutex> g(g_meta_mu);
  if (g_meta_cache.size() > 65536) g_meta_cache.clear();
  g_meta_cache[key] = std::move(r);
}
// Batch norm in evaluation mode: CPU (and CUDA) return empty (0,) save_mean /
// save_invstd, while the meta kernels (torch/_decomp) give them shape (C,).
void EvalBatchNormStats(const std::string& name, const std::vector<c10::IValue>& args, MetaResult& mr) {
  bool eval = false;
  if (name == "aten::native_batch_norm.out" && args.size() > 10 && args[5].isBool() && !args[5].toBool()) {
    // CPU leaves the save_mean / save_invstd out tensors as they are (the lowering passes them through).
    for (size_t k = 1; k <= 2 && k < mr.rets.size(); ++k)
      if (mr.rets[k].kind == 0 && args[8 + k].isTensor() && args[8 + k].toTensor().defined()) {
        const at::Tensor& t = args[8 + k].toTensor();
        mr.rets[k].tensors[0].sizes.assign(t.sizes().begin(), t.sizes().end());
        mr.rets[k].tensors[0].strides.assign(t.strides().begin(), t.strides().end());
      }
    return;
  }
  if (name == "aten::native_batch_norm" || name == "aten::_native_batch_norm_legit")
    eval = args.size() > 5 && args[5].isBool() && !args[5].toBool();
  else if (name == "aten::_native_batch_norm_legit_no_training" ||
           name == "aten::_native_batch_norm_legit_no_training.out")
    eval = true;
  if (!eval || mr.rets.size() < 3) return;
  for (size_t k = 1; k <= 2; ++k)
    if (mr.rets[k].kind == 0) {
      mr.rets[k].tensors[0].sizes = {0};
      mr.rets[k].tensors[0].strides = {1};
    }
}

// ---- debug-mode validation against PyTorch's meta functions
std::string DescribeSpec(const OutSpec& o) {
  std::ostringstream m;
  m << "sizes " << c10::IntArrayRef(o.sizes) << ", strides " << c10::IntArrayRef(o.strides) << ", dtype "
    << o.dtype;
  return m.str();
}

// Debug mode: `what` (another source of output metadata) must give what
// PyTorch's meta kernel gave (fresh).
void DebugCompareMeta(const std::string& name, const std::shared_ptr<MetaResult>& cached,
                      const MetaResult& fresh, const char* what) {
  if (!cached) return;
  bool same = cached->rets.size() == fresh.rets.size();
  for (size_t i = 0; same && i < fresh.rets.size(); ++i) {
    const auto &a = cached->rets[i], &b = fresh.rets[i];
    if (a.kind != b.kind || a.tensors.size() != b.tensors.size()) same = false;
    for (size_t k = 0; same && k < a.tensors.size(); ++k)
      same = a.tensors[k].sizes == b.tensors[k].sizes && a.tensors[k].strides == b.tensors[k].strides &&
             a.tensors[k].dtype == b.tensors[k].dtype && a.tensors[k].input == b.tensors[k].input;
  }
  TORCH_CHECK(same, "torchtpu bug: for ", name, ", ", what,
              " differs from PyTorch's meta function for the same arguments");
}

}  // namespace

// Output k of the lowering must have exactly the meta function's shape, and
// every returned output tensor the meta function's sizes, strides and dtype.
void DebugValidateOutputs(const std::string& name, const MetaResult& mr, const std::vector<at::Tensor>& outs,
                          size_t n_returned, const std::vector<Value>& vals) {
  for (size_t i = 0; i < outs.size() && i < vals.size(); ++i) {
    if (!vals[i].valid()) continue;  // left unchanged
    hlo::Dims want(outs[i].sizes().begin(), outs[i].sizes().end());
    TORCH_CHECK(vals[i].dims() == want, "torchtpu bug: the lowering of ", name, " returned ", vals[i].type.str(),
                " for output ", i, ", but PyTorch's meta function gives sizes ", outs[i].sizes(), " and dtype ",
                outs[i].scalar_type());
  }
  size_t k = 0;
  for (const MetaRet& r : mr.rets) {
    for (const OutSpec& o : r.tensors) {
      if (k >= n_returned || k >= outs.size()) return;
      const at::Tensor& t = outs[k++];
      bool ok = t.sizes() == c10::IntArrayRef(o.sizes) && t.scalar_type() == o.dtype;
      for (int64_t d = 0; ok && d < t.dim() && t.numel() > 1; ++d)
        ok = t.size(d) <= 1 || t.stride(d) == o.strides[d];
      TORCH_CHECK(ok, "torchtpu bug: output ", k - 1, " of ", name, " has sizes ", t.sizes(), ", strides ",
                  t.strides(), ", dtype ", t.scalar_type(), " but PyTorch's meta function gives ",
                  DescribeSpec(o));
    }
  }
}


// Output metadata for ops whose PyTorch meta kernel encodes CUDA-only limits
// (_flash_attention_forward's output shape, see FlashForwardMeta;
// torch._grouped_mm's demands bf16 and 16-byte aligned strides; transformers'
// MoE layers call it in every dtype on non-CPU devices). nullptr: use the
// meta kernel.
static OutSpec Contiguous(std::vector<int64_t> sizes, c10::ScalarType dtype) {
  OutSpec o;
  auto st = c10::contiguous_strides(sizes);
  o.sizes = std::move(sizes);
  o.strides.assign(st.begin(), st.end());
  o.dtype = dtype;
  return o;
}

// aten::_flash_attention_forward: torch's meta gives the output query's
// shape (empty_like(query): CUDA's flash kernels need the value head dim to
// equal the query's); the tpu lowering (ops/attention.cpp) allows a value
// head dim of its own (as MLA uses), so the output is (..., Hq, Dv).
static std::shared_ptr<MetaResult> FlashForwardMeta(const std::vector<c10::IValue>& args) {
  const at::Tensor& q = args[0].toTensor();
  const at::Tensor& v = args[2].toTensor();
  if (q.dim() < 3 || v.dim() != q.dim() || v.size(-1) == q.size(-1)) return nullptr;  // torch's meta is right
  bool varlen = !args[3].isNone();
  std::vector<int64_t> o(q.sizes().begin(), q.sizes().end());
  o.back() = v.size(-1);
  std::vector<int64_t> lse = varlen ? std::vector<int64_t>{q.size(1), q.size(0)}
                                    : std::vector<int64_t>{q.size(0), q.size(2), q.size(1)};
  auto mr = std::make_shared<MetaResult>();
  for (OutSpec spec : {Contiguous(o, q.scalar_type()), Contiguous(lse, at::kFloat), Contiguous({2}, at::kUInt64),
                       Contiguous({}, at::kUInt64), Contiguous({0}, q.scalar_type())}) {
    mr->rets.emplace_back();
    mr->rets.back().tensors.push_back(std::move(spec));
  }
  return mr;
}

static std::shared_ptr<MetaResult> OwnMeta(const std::string& name, const std::vector<c10::IValue>& args) {
  if (name == "aten::_flash_attention_forward" && args.size() >= 4) return FlashForwardMeta(args);
  if (name != "aten::_grouped_mm" || args.size() < 5) return nullptr;
  const at::Tensor& a = args[0].toTensor();
  const at::Tensor& b = args[1].toTensor();
  const char* op = "torch._grouped_mm: ";
  TORCH_CHECK(a.dim() == 2 || a.dim() == 3, op, "mat_a must be 2D or 3D, got ", a.dim(), "D");
  TORCH_CHECK(b.dim() == 2 || b.dim() == 3, op, "mat_b must be 2D or 3D, got ", b.dim(), "D");
  TORCH_CHECK(a.scalar_type() == b.scalar_type() && at::isFloatingType(a.scalar_type()), op,
              "mat_a and mat_b must have the same floating dtype, got ", a.scalar_type(), " and ",
              b.scalar_type());
  TORCH_CHECK(args[3].isNone(), op, "bias is not supported (as on CUDA)");
  const bool a2 = a.dim() == 2, b2 = b.dim() == 2;
  const bool has_offs = !args[2].isNone() && args[2].toTensor().defined();
  TORCH_CHECK(has_offs == (a2 || b2), op,
              a2 || b2 ? "offs is required when mat_a or mat_b is 2D" : "offs must be None for 3D x 3D");
  if (!a2 || !b2)
    TORCH_CHECK(a.size(-1) == b.size(-2), op, "contraction dimension of mat_a and mat_b must match, got ",
                a.sizes(), " and ", b.sizes());
  std::vector<int64_t> sizes;
  if (has_offs) {
    const at::Tensor& offs = args[2].toTensor();
    TORCH_CHECK(offs.dim() == 1 && (offs.scalar_type() == at::kInt || offs.scalar_type() == at::kLong), op,
                "offs must be a 1-D int32 tensor, got ", offs.sizes(), " ", offs.scalar_type());
    int64_t g = offs.size(0);
    if (a2 && b2) {
      TORCH_CHECK(a.size(1) == b.size(0), op, "mat_a ", a.sizes(), " and mat_b ", b.sizes(),
                  " must share the grouped dimension K");
      sizes = {g, a.size(0), b.size(1)};
    } else if (a2) {
      TORCH_CHECK(b.size(0) == g, op, "offs has ", g, " groups but mat_b has ", b.size(0));
      sizes = {a.size(0), b.size(2)};
    } else {
      TORCH_CHECK(a.size(0) == g, op, "offs has ", g, " groups but mat_a has ", a.size(0));
      sizes = {a.size(1), b.size(1)};
    }
  } else {
    TORCH_CHECK(a.size(0) == b.size(0), op, "batch sizes must match, got ", a.sizes(), " and ", b.sizes());
    sizes = {a.size(0), a.size(1), b.size(2)};
  }
  OutSpec o;
  o.sizes = sizes;
  auto st = c10::contiguous_strides(sizes);
  o.strides.assign(st.begin(), st.end());
  o.dtype = args[4].isNone() ? a.scalar_type() : args[4].toScalarType();
  auto mr = std::make_shared<MetaResult>();
  mr->rets.emplace_back();
  mr->rets.back().tensors.push_back(std::move(o));
  return mr;
}


// float4_e2m1fn_x2 storages are bytes (ToET): only ops that move data see
// its values correctly; any other op would compute on the bytes, so it raises
// as CPU does. Checked where the meta result is computed (not per call).
static void CheckPackedFp4(const std::string& name, const std::vector<at::Tensor>& inputs) {
  static const std::unordered_set<std::string> moves = {
      "cat", "stack", "clone", "index", "index_select", "where", "eq", "ne", "flip", "roll",
      "zero_", "index_put", "index_put_", "_index_put_impl_", "gather", "slice_scatter",
      "select_scatter", "_to_copy", "copy", "copy_",
      "_scaled_mm", "_scaled_mm_v2"};  // these two unpack the nibbles (ops/lowp.cpp)
  for (const at::Tensor& t : inputs) {
    if (!t.defined() || t.scalar_type() != c10::kFloat4_e2m1fn_x2) continue;
    std::string base = name.substr(name.find("::") + 2);
    base = base.substr(0, base.find('.'));
    TORCH_CHECK_NOT_IMPLEMENTED(moves.count(base) || name.rfind("torchtpu::", 0) == 0, "\"", name,
                                "\" not implemented for 'Float4_e2m1fn_x2' (packed fp4 pairs: "
                                "unpack them, e.g. torchtpu.quant.unpack_fp4)");
  }
}

// ---- C++ output-metadata rules
// PyTorch's C++ meta functions (at::meta::*: the structured kernels' shape,
// stride and dtype logic, broadcasting and type promotion included) for the
// commonest ops. PyTorch 2.13 registers Python meta kernels over them, whose
// first call imports torch._dynamo (about a second); called directly, they
// give the same results at C++ speed. Debug mode checks each against the
// registered meta kernel.
namespace {

using T = const at::Tensor&;
using S = const c10::Scalar&;
using OptS = const std::optional<c10::Scalar>&;
using OptT = const std::optional<at::Tensor>&;
using OptDims = at::OptionalIntArrayRef;
using OptDtype = std::optional<c10::ScalarType>;
using Pair = std::tuple<at::Tensor, at::Tensor>;

template <class F, F* f>
c10::KernelFunction Fn() {
  return c10::KernelFunction::makeFromUnboxedFunction(c10::CompileTimeFunctionPointer<F, f>());
}

// max()/min() of a whole non-empty tensor (CppRule checks): a 0-d tensor of its dtype.
void FullReductionRule(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* s) {
  const at::Tensor& self = (*s)[0].toTensor();
  at::Tensor out = at::empty_strided({}, {}, self.options());
  s->clear();
  s->push_back(std::move(out));
}

// abs, relu (no C++ meta function): a tensor like self, for real dtypes and
// dense inputs (CppRule checks), as TensorIterator allocates it.
void AbsRule(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* s) {
  // A contiguous input (size-1 dims may have any stride, e.g. a [1, n] row
  // of a wider tensor) gets contiguous strides, as TensorIterator gives it;
  // another dense input (CppRule: no size-1 dims) keeps its strides.
  const at::Tensor& self = (*s)[0].toTensor();
  at::Tensor out = self.is_contiguous() ? at::empty(self.sizes(), self.options())
                                        : at::empty_strided(self.sizes(), self.strides(), self.options());
  s->clear();
  s->push_back(std::move(out));
}

// In-place random fills whose PyTorch meta is a Python reference that refuses
// a generator ("generator is not supported in refs"): the output is self,
// after CPU's argument checks (same messages).
void RandomFillRule(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* s) {
  const std::string& name = op.schema().name();
  at::Tensor self = (*s)[0].toTensor();
  auto num = [&](size_t i, double dflt) { return i < s->size() && !(*s)[i].isNone() ? (*s)[i].toDouble() : dflt; };
  if (name == "aten::exponential_") {
    TORCH_CHECK(at::isFloatingType(self.scalar_type()), "exponential_ not implemented for '", self.scalar_type(), "'");
    double l = num(1, 1.0);
    TORCH_CHECK(l > 0.0, "exponential_ expects lambda > 0.0, but found lambda=", l);
  } else if (name == "aten::log_normal_") {
    TORCH_CHECK(at::isFloatingType(self.scalar_type()), "log_normal_ not implemented for '", self.scalar_type(), "'");
    double sd = num(2, 2.0);
    TORCH_CHECK(sd > 0.0, "log_normal_ expects std > 0.0, but found std=", sd);
  } else if (name == "aten::cauchy_") {
    TORCH_CHECK(at::isFloatingType(self.scalar_type()), "cauchy_ not implemented for '", self.scalar_type(), "'");
  } else if (name == "aten::geometric_") {
    double p = num(1, 0.5);
    TORCH_CHECK(0 < p && p < 1, "geometric_ expects p to be in (0, 1), but got p=", p);
  }
  s->clear();
  s->push_back(std::move(self));
}

// add/sub/mul/div/rsub with a Scalar operand (no C++ meta function of their
// own): PyTorch's kernels for these overloads call the Tensor overload with
// the scalar as a wrapped-number 0-d tensor (wrapped_scalar_tensor), so the
// Tensor overload's meta function on the same wrapped scalar gives CPU's
// output sizes, strides and dtype (type promotion included).
template <at::Tensor (*F)(T, T)>
void ScalarBinaryRule(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* s) {
  at::Tensor self = (*s)[0].toTensor();
  at::Tensor other = at::native::wrapped_scalar_tensor((*s)[1].toScalar());
  at::Tensor out = F(self, other);
  s->clear();
  s->push_back(std::move(out));
}
template <at::Tensor (*F)(T, T, S), bool Reverse>
void ScalarAlphaRule(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* s) {
  at::Tensor self = (*s)[0].toTensor();
  at::Tensor other = at::native::wrapped_scalar_tensor((*s)[1].toScalar());
  c10::Scalar alpha = (*s)[2].toScalar();
  at::Tensor out = Reverse ? F(other, self, alpha) : F(self, other, alpha);
  s->clear();
  s->push_back(std::move(out));
}
at::Tensor MetaMul(T a, T b) { return at::meta::mul(a, b); }
at::Tensor MetaDiv(T a, T b) { return at::meta::div(a, b); }
at::Tensor MetaAdd(T a, T b, S alpha) { return at::meta::add(a, b, alpha); }
at::Tensor MetaSub(T a, T b, S alpha) { return at::meta::sub(a, b, alpha); }

const std::unordered_map<std::string, c10::KernelFunction>& CppRules() {
  static const auto* rules = new std::unordered_map<std::string, c10::KernelFunction>{
      // binary elementwise
      {"aten::add.Tensor", Fn<at::Tensor(T, T, S), &at::meta::add>()},
      {"aten::sub.Tensor", Fn<at::Tensor(T, T, S), &at::meta::sub>()},
      {"aten::mul.Tensor", Fn<at::Tensor(T, T), &at::meta::mul>()},
      {"aten::div.Tensor", Fn<at::Tensor(T, T), &at::meta::div>()},
      {"aten::maximum", Fn<at::Tensor(T, T), &at::meta::maximum>()},
      {"aten::minimum", Fn<at::Tensor(T, T), &at::meta::minimum>()},
      {"aten::pow.Tensor_Tensor", Fn<at::Tensor(T, T), &at::meta::pow>()},
      {"aten::pow.Tensor_Scalar", Fn<at::Tensor(T, S), &at::meta::pow>()},
      {"aten::add.Scalar", c10::KernelFunction::makeFromBoxedFunction<&ScalarAlphaRule<&MetaAdd, false>>()},
      {"aten::sub.Scalar", c10::KernelFunction::makeFromBoxedFunction<&ScalarAlphaRule<&MetaSub, false>>()},
      {"aten::rsub.Scalar", c10::KernelFunction::makeFromBoxedFunction<&ScalarAlphaRule<&MetaSub, true>>()},
      {"aten::mul.Scalar", c10::KernelFunction::makeFromBoxedFunction<&ScalarBinaryRule<&MetaMul>>()},
      {"aten::div.Scalar", c10::KernelFunction::makeFromBoxedFunction<&ScalarBinaryRule<&MetaDiv>>()},
      {"aten::eq.Tensor", Fn<at::Tensor(T, T), &at::meta::eq>()},
      {"aten::ne.Tensor", Fn<at::Tensor(T, T), &at::meta::ne>()},
      {"aten::lt.Tensor", Fn<at::Tensor(T, T), &at::meta::lt>()},
      {"aten::le.Tensor", Fn<at::Tensor(T, T), &at::meta::le>()},
      {"aten::gt.Tensor", Fn<at::Tensor(T, T), &at::meta::gt>()},
      {"aten::ge.Tensor", Fn<at::Tensor(T, T), &at::meta::ge>()},
      {"aten::eq.Scalar", Fn<at::Tensor(T, S), &at::meta::eq>()},
      {"aten::ne.Scalar", Fn<at::Tensor(T, S), &at::meta::ne>()},
      {"aten::lt.Scalar", Fn<at::Tensor(T, S), &at::meta::lt>()},
      {"aten::le.Scalar", Fn<at::Tensor(T, S), &at::meta::le>()},
      {"aten::gt.Scalar", Fn<at::Tensor(T, S), &at::meta::gt>()},
      {"aten::ge.Scalar", Fn<at::Tensor(T, S), &at::meta::ge>()},
      {"aten::add_.Tensor", Fn<at::Tensor&(at::Tensor&, T, S), &at::meta::add_>()},
      {"aten::sub_.Tensor", Fn<at::Tensor&(at::Tensor&, T, S), &at::meta::sub_>()},
      {"aten::mul_.Tensor", Fn<at::Tensor&(at::Tensor&, T), &at::meta::mul_>()},
      {"aten::div_.Tensor", Fn<at::Tensor&(at::Tensor&, T), &at::meta::div_>()},
      {"aten::lerp.Scalar", Fn<at::Tensor(T, T, S), &at::meta::lerp>()},
      {"aten::addcmul", Fn<at::Tensor(T, T, T, S), &at::meta::addcmul>()},
      {"aten::addcdiv", Fn<at::Tensor(T, T, T, S), &at::meta::addcdiv>()},
      {"aten::clamp", Fn<at::Tensor(T, OptS, OptS), &at::meta::clamp>()},
      // unary elementwise and activations
      {"aten::exp", Fn<at::Tensor(T), &at::meta::exp>()},
      {"aten::log", Fn<at::Tensor(T), &at::meta::log>()},
      {"aten::tanh", Fn<at::Tensor(T), &at::meta::tanh>()},
      {"aten::sigmoid", Fn<at::Tensor(T), &at::meta::sigmoid>()},
      {"aten::sqrt", Fn<at::Tensor(T), &at::meta::sqrt>()},
      {"aten::rsqrt", Fn<at::Tensor(T), &at::meta::rsqrt>()},
      {"aten::neg", Fn<at::Tensor(T), &at::meta::neg>()},
      {"aten::sin", Fn<at::Tensor(T), &at::meta::sin>()},
      {"aten::cos", Fn<at::Tensor(T), &at::meta::cos>()},
      {"aten::erf", Fn<at::Tensor(T), &at::meta::erf>()},
      {"aten::reciprocal", Fn<at::Tensor(T), &at::meta::reciprocal>()},
      {"aten::silu", Fn<at::Tensor(T), &at::meta::silu>()},
      {"aten::gelu", Fn<at::Tensor(T, c10::string_view), &at::meta::gelu>()},
      {"aten::gelu_backward", Fn<at::Tensor(T, T, c10::string_view), &at::meta::gelu_backward>()},
      {"aten::silu_backward", Fn<at::Tensor(T, T), &at::meta::silu_backward>()},
      {"aten::tanh_backward", Fn<at::Tensor(T, T), &at::meta::tanh_backward>()},
      {"aten::sigmoid_backward", Fn<at::Tensor(T, T), &at::meta::sigmoid_backward>()},
      {"aten::threshold_backward", Fn<at::Tensor(T, T, S), &at::meta::threshold_backward>()},
      // matmul family
      {"aten::mm", Fn<at::Tensor(T, T), &at::meta::mm>()},
      {"aten::bmm", Fn<at::Tensor(T, T), &at::meta::bmm>()},
      {"aten::addmm", Fn<at::Tensor(T, T, T, S, S), &at::meta::addmm>()},
      {"aten::baddbmm", Fn<at::Tensor(T, T, T, S, S), &at::meta::baddbmm>()},
      // reductions, softmax, losses
      {"aten::sum.dim_IntList", Fn<at::Tensor(T, OptDims, bool, OptDtype), &at::meta::sum>()},
      {"aten::mean.dim", Fn<at::Tensor(T, OptDims, bool, OptDtype), &at::meta::mean>()},
      {"aten::amax", Fn<at::Tensor(T, at::IntArrayRef, bool), &at::meta::amax>()},
      {"aten::amin", Fn<at::Tensor(T, at::IntArrayRef, bool), &at::meta::amin>()},
      {"aten::argmax", Fn<at::Tensor(T, std::optional<int64_t>, bool), &at::meta::argmax>()},
      {"aten::max.dim", Fn<Pair(T, int64_t, bool), &at::meta::max>()},
      {"aten::cumsum", Fn<at::Tensor(T, int64_t, OptDtype), &at::meta::cumsum>()},
      {"aten::_softmax", Fn<at::Tensor(T, int64_t, bool), &at::meta::_softmax>()},
      {"aten::_log_softmax", Fn<at::Tensor(T, int64_t, bool), &at::meta::_log_softmax>()},
      {"aten::_softmax_backward_data",
       Fn<at::Tensor(T, T, int64_t, c10::ScalarType), &at::meta::_softmax_backward_data>()},
      {"aten::_log_softmax_backward_data",
       Fn<at::Tensor(T, T, int64_t, c10::ScalarType), &at::meta::_log_softmax_backward_data>()},
      {"aten::nll_loss_forward", Fn<Pair(T, T, OptT, int64_t, int64_t), &at::meta::nll_loss_forward>()},
      {"aten::nll_loss_backward",
       Fn<at::Tensor(T, T, T, OptT, int64_t, int64_t, T), &at::meta::nll_loss_backward>()},
      {"aten::any", Fn<at::Tensor(T), &at::meta::any>()},
      {"aten::any.dim", Fn<at::Tensor(T, int64_t, bool), &at::meta::any>()},
      {"aten::any.dims", Fn<at::Tensor(T, OptDims, bool), &at::meta::any>()},
      {"aten::all", Fn<at::Tensor(T), &at::meta::all>()},
      {"aten::all.dim", Fn<at::Tensor(T, int64_t, bool), &at::meta::all>()},
      {"aten::all.dims", Fn<at::Tensor(T, OptDims, bool), &at::meta::all>()},
      {"aten::isin.Tensor_Tensor", Fn<at::Tensor(T, T, bool, bool), &at::meta::isin>()},
      // indexing and joining
      {"aten::cat", Fn<at::Tensor(const at::ITensorListRef&, int64_t), &at::meta::cat>()},
      {"aten::index.Tensor",
       Fn<at::Tensor(T, const c10::List<std::optional<at::Tensor>>&), &at::meta::index>()},
      {"aten::scatter.src", Fn<at::Tensor(T, int64_t, T, T), &at::meta::scatter>()},
      {"aten::scatter.value", Fn<at::Tensor(T, int64_t, T, S), &at::meta::scatter>()},
      {"aten::scatter_.src", Fn<at::Tensor&(at::Tensor&, int64_t, T, T), &at::meta::scatter_>()},
      {"aten::scatter_.value", Fn<at::Tensor&(at::Tensor&, int64_t, T, S), &at::meta::scatter_>()},
      {"aten::gather", Fn<at::Tensor(T, int64_t, T, bool), &at::meta::gather>()},
      {"aten::topk", Fn<Pair(T, int64_t, int64_t, bool, bool), &at::meta::topk>()},
      {"aten::bitwise_and.Tensor", Fn<at::Tensor(T, T), &at::meta::bitwise_and>()},
      {"aten::bitwise_or.Tensor", Fn<at::Tensor(T, T), &at::meta::bitwise_or>()},
      {"aten::bitwise_not", Fn<at::Tensor(T), &at::meta::bitwise_not>()},
      {"aten::ceil", Fn<at::Tensor(T), &at::meta::ceil>()},
      {"aten::floor", Fn<at::Tensor(T), &at::meta::floor>()},
      {"aten::trunc", Fn<at::Tensor(T), &at::meta::trunc>()},
      {"aten::clamp_min", Fn<at::Tensor(T, S), &at::meta::clamp_min>()},
      {"aten::clamp_max", Fn<at::Tensor(T, S), &at::meta::clamp_max>()},
      {"aten::argmin", Fn<at::Tensor(T, std::optional<int64_t>, bool), &at::meta::argmin>()},
      {"aten::min.dim", Fn<Pair(T, int64_t, bool), &at::meta::min>()},
      {"aten::tril", Fn<at::Tensor(T, int64_t), &at::meta::tril>()},
      {"aten::triu", Fn<at::Tensor(T, int64_t), &at::meta::triu>()},
      {"aten::abs", c10::KernelFunction::makeFromBoxedFunction<&AbsRule>()},
      {"aten::relu", c10::KernelFunction::makeFromBoxedFunction<&AbsRule>()},
      {"aten::max", c10::KernelFunction::makeFromBoxedFunction<&FullReductionRule>()},
      {"aten::min", c10::KernelFunction::makeFromBoxedFunction<&FullReductionRule>()},
      // in-place fills
      {"aten::normal_", Fn<at::Tensor&(at::Tensor&, double, double, std::optional<at::Generator>),
                           &at::meta::normal_>()},
      {"aten::uniform_", Fn<at::Tensor&(at::Tensor&, double, double, std::optional<at::Generator>),
                            &at::meta::uniform_>()},
      {"aten::fill_.Scalar", Fn<at::Tensor&(at::Tensor&, S), &at::meta::fill_>()},
      {"aten::exponential_", c10::KernelFunction::makeFromBoxedFunction<&RandomFillRule>()},
      {"aten::log_normal_", c10::KernelFunction::makeFromBoxedFunction<&RandomFillRule>()},
      {"aten::cauchy_", c10::KernelFunction::makeFromBoxedFunction<&RandomFillRule>()},
      {"aten::geometric_", c10::KernelFunction::makeFromBoxedFunction<&RandomFillRule>()},
      {"aten::zero_", Fn<at::Tensor&(at::Tensor&), &at::meta::zero_>()},
  };
  return *rules;
}

// The C++ rule for op `name`, or nullptr (use PyTorch's meta kernel).
const c10::KernelFunction* CppRule(const std::string& name, const std::vector<c10::IValue>& args) {
  const auto& rules = CppRules();
  auto it = rules.find(name);
  if (it == rules.end()) return nullptr;
  if (name == "aten::abs" || name == "aten::relu") {
    const at::Tensor& t = args[0].toTensor();
    if (t.is_complex() || !t.is_non_overlapping_and_dense()) return nullptr;
    // dense but not contiguous: size-1 (or 0) dims make TensorIterator's
    // stride choice subtle; PyTorch's meta kernel decides
    if (!t.is_contiguous())
      for (int64_t d = 0; d < t.dim(); ++d)
        if (t.size(d) <= 1) return nullptr;
  }
  if ((name == "aten::max" || name == "aten::min") && args[0].toTensor().numel() == 0) return nullptr;
  if (name == "aten::index.Tensor") {
    // integer indices only (boolean masks become nonzero() indices before this,
    // ExpandMaskIndices; a mask left here takes PyTorch's meta kernel)
    auto l = args[1].toList();
    for (size_t k = 0; k < l.size(); ++k) {
      c10::IValue e = l.get(k);
      if (e.isTensor() && e.toTensor().defined() && !at::isIntegralType(e.toTensor().scalar_type(), false))
        return nullptr;
    }
  }
  return &it->second;
}

}  // namespace

namespace {

// The MetaResult of a meta kernel's results on `mstack` (mc made its inputs).
std::shared_ptr<MetaResult> SpecsOf(const torch::jit::Stack& mstack, const MetaConv& mc,
                                    const std::vector<at::Tensor>& flat_inputs, const std::string& name,
                                    const std::vector<c10::IValue>& args) {
  auto mr = std::make_shared<MetaResult>();
  std::unordered_map<const c10::TensorImpl*, int> ref;
  for (size_t k = 0; k < flat_inputs.size(); ++k) {
    auto it = mc.real_to_meta.find(flat_inputs[k].unsafeGetTensorImpl());
    if (it != mc.real_to_meta.end()) ref[it->second.unsafeGetTensorImpl()] = (int)k;
  }
  auto spec = [&](const at::Tensor& mt) {
    OutSpec o;
    auto it = ref.find(mt.unsafeGetTensorImpl());
    o.input = it == ref.end() ? -1 : it->second;
    o.sizes.assign(mt.sizes().begin(), mt.sizes().end());
    o.strides.assign(mt.strides().begin(), mt.strides().end());
    o.dtype = mt.scalar_type();
    return o;
  };
  for (const auto& m : mstack) {
    MetaRet r;
    if (m.isTensor() && !m.toTensor().defined()) {
      // masked-out output (e.g. native_layer_norm_backward's output_mask):
      // stays undefined; the lowering returns values for defined outputs only.
      r.kind = 2;
      r.other = m;
    } else if (m.isTensor()) {
      r.kind = 0;
      r.tensors.push_back(spec(m.toTensor()));
    } else if (m.isTensorList()) {
      r.kind = 1;
      for (const at::Tensor& mt : m.toTensorVector()) r.tensors.push_back(spec(mt));
    } else {
      r.kind = 2;
      r.other = m;
    }
    mr->rets.push_back(std::move(r));
  }
  EvalBatchNormStats(name, args, *mr);
  return mr;
}

// Runs the meta computation of op on meta versions of args: the C++ rule if
// there is one (unless python), else PyTorch's meta kernel.
std::shared_ptr<MetaResult> RunMeta(const c10::OperatorHandle& op, const std::string& name,
                                    const std::vector<c10::IValue>& args, const std::vector<at::Tensor>& flat_inputs,
                                    const c10::KernelFunction* rule) {
  MetaConv mc;
  torch::jit::Stack mstack;
  for (auto& a : args) mstack.push_back(mc.Convert(a));
  if (name == "aten::_thnn_fused_lstm_cell" && mstack.size() == 5 &&
      (mstack[3].isNone() || !mstack[3].toTensor().defined()) && mstack[0].isTensor() &&
      mstack[0].toTensor().dim() == 2) {
    // torch 2.13's meta function reads .device of absent biases
    // (nn.LSTM(bias=False)); zero meta biases give the same shapes.
    const at::Tensor& g = mstack[0].toTensor();
    mstack[3] = at::zeros({g.size(1)}, g.options());
    mstack[4] = mstack[3];
  }
  if ((name == "aten::masked_fill.Tensor" || name == "aten::masked_fill_.Tensor") && mstack.size() == 3 &&
      mstack[2].isTensor() && mstack[2].toTensor().is_cpu() && mstack[2].toTensor().dim() == 0) {
    // torch's reference allows a CPU 0-d value only for cuda/xpu/hpu tensors
    // (_refs masked_fill); CUDA's rule is ours (CheckDevices), so the meta
    // computation sees a value on self's (meta) device.
    const at::Tensor& v = mstack[2].toTensor();
    mstack[2] = at::empty({}, v.options().device(c10::kMeta));
  }
  if (rule) rule->callBoxed(op, c10::DispatchKeySet(c10::DispatchKey::Meta), &mstack);
  else op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &mstack);
  return SpecsOf(mstack, mc, flat_inputs, name, args);
}

}  // namespace

std::shared_ptr<MetaResult> OutputMeta(const c10::OperatorHandle& op, const std::string& name,
                                       const std::vector<c10::IValue>& args, const std::string& key,
                                       const std::vector<at::Tensor>& flat_inputs, bool debug) {
  std::shared_ptr<MetaResult> mr = debug ? nullptr : LookupMeta(key);
  if (mr) return mr;
  if (op.schema().returns().empty() && !op.hasKernelForDispatchKey(c10::DispatchKey::Meta)) {
    // An op that only writes its arguments and has no meta kernel (e.g.
    // _fused_adam_.tensor_lr): its outputs are those arguments, and the
    // lowering validates the lists.
    return std::make_shared<MetaResult>();
  }
  mr = OwnMeta(name, args);
  if (mr) return mr;
  CheckPackedFp4(name, flat_inputs);
  const c10::KernelFunction* rule = CppRule(name, args);
  if (debug) {
    // PyTorch's meta kernel decides; the cache and the C++ rule must agree with it.
    mr = RunMeta(op, name, args, flat_inputs, nullptr);
    DebugCompareMeta(name, LookupMeta(key), *mr, "the cached output metadata (a meta cache key collision)");
    if (rule) DebugCompareMeta(name, RunMeta(op, name, args, flat_inputs, rule), *mr, "its C++ output-metadata rule");
  } else {
    mr = RunMeta(op, name, args, flat_inputs, rule);
    if (rule) GetMetrics().cpp_meta_rules++;
    else GetMetrics().PythonMeta(name);
  }
  StoreMeta(key, mr);
  return mr;
}

}  // namespace tt
