// The one registry of op lowerings, shared by every eager mode and by
// torch.compile. Torch-free: a lowering sees HLO values and plain attributes.
//
// Adding an op: write `std::vector<Value> fn(LowerCtx& c)` in the family file
// and register it with TT_LOWERING("aten::name.overload", fn) — or add a row
// to a table (elementwise, reductions).
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "../hlo/builder.h"

namespace tt::ops {

using hlo::Builder;
using hlo::Dims;
using hlo::ET;
using hlo::Type;
using hlo::Value;

// One schema argument as the lowering sees it.
struct Arg {
  enum Kind : uint8_t {
    None, Tensor, TensorList, OptTensorList, Scalar, Int, Double, Bool, IntList, DoubleList,
    BoolList, String, Other,
    ScalarList  // Scalar[]: each a 0-d program argument in vs (values in doubles)
  };
  Kind kind = None;
  Value v;                          // Tensor; Scalar (a 0-d program argument)
  std::vector<Value> vs;            // TensorList
  std::vector<std::optional<Value>> ovs;  // OptTensorList (index)
  int64_t i = 0;                    // Int (also dtype / layout / memory_format codes)
  double d = 0;                     // Double
  bool b = false;                   // Bool
  bool scalar_is_float = false, scalar_is_int = false, scalar_is_bool = false,
       scalar_is_complex = false;  // Scalar: the Python type it came from
  // A Scalar's value (a CPU 0-d tensor's too). Read it through hint(): a
  // lowering that bakes a value into the program marks the argument `used`,
  // so strict mode's op plans replay that program only for the same value.
  double scalar_value = 0;
  mutable bool used = false;  // the lowering read this Scalar/float's value
  double hint() const { used = true; return scalar_value; }
  std::vector<int64_t> ints;       // IntList
  std::vector<double> doubles;     // DoubleList
  std::vector<bool> bools;         // BoolList
  std::string s;                   // String
  bool is_none() const { return kind == None; }
};

class LowerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct LowerCtx {
  Builder& b;
  const std::string& op;                 // "aten::add.Tensor"
  std::vector<Arg> args;                 // schema order
  const std::vector<std::string>& names; // schema argument names
  std::vector<Type> outs;         // output types (logical shapes, from meta)
  // Random ops: a u64[2] key value; the executor provides it on request.
  std::function<Value()> rng_key;
  // A host number as a 0-d program argument (never program text), so a
  // changing value (a learning rate given as a schema `float`) does not
  // recompile. Unset (a lowering outside a region): a constant.
  std::function<Value(double, ET)> host_scalar;
  Value scalar_arg(double d, ET et) const {
    return host_scalar ? host_scalar(d, et) : b.Splat(Type(et, {}), d);
  }
  // Schema float argument i (a learning rate) as a 0-d program argument
  // whose value may change from call to call with no new lowering (strict
  // mode's op plans substitute the new value).
  std::function<Value(size_t, ET)> float_arg_input;
  Value num_arg(size_t i, ET et) const {
    if (float_arg_input && arg(i).kind == Arg::Double) return float_arg_input(i, et);
    return scalar_arg(f64(i), et);
  }

  const Arg& arg(size_t i) const {
    if (i >= args.size()) throw LowerError(op + ": missing argument " + std::to_string(i));
    return args[i];
  }
  bool has(size_t i) const { return i < args.size() && !args[i].is_none(); }
  const Value& t(size_t i) const;         // tensor argument (lives as long as the ctx)
  std::vector<Value> tl(size_t i) const;   // tensor list argument
  Value scalar(size_t i, ET et) const;     // scalar/tensor argument converted to et
  int64_t i64(size_t i) const;
  int64_t i64_or(size_t i, int64_t dflt) const { return has(i) ? i64(i) : dflt; }
  double f64(size_t i) const;
  double f64_or(size_t i, double dflt) const { return has(i) ? f64(i) : dflt; }
  bool flag(size_t i, bool dflt = false) const;
  std::vector<int64_t> ints(size_t i) const;
  const Type& out(size_t i = 0) const { return outs.at(i); }
  [[noreturn]] void fail(const std::string& why) const { throw LowerError(op + ": " + why); }
};

using LowerFn = std::vector<Value> (*)(LowerCtx&);

struct Lowering {
  LowerFn fn = nullptr;
  // True if the lowering reads the rng key (random ops).
  bool random = false;
  // Graph-only: view and factory ops in functionalized (torch.compile)
  // graphs. Never bound as eager kernels (eager views must alias storage).
  bool graph_only = false;
};

std::unordered_map<std::string, Lowering>& Registry();
// Adds a lowering; a second lowering for the same op is recorded in
// DuplicateLowerings() (a unit test keeps that list empty).
void Register(const char* name, LowerFn fn, bool random, bool graph_only = false);
std::vector<std::string>& DuplicateLowerings();
const Lowering* Find(const std::string& op);
std::vector<std::string> RegisteredOps();

struct Registrar {
  Registrar(const char* name, LowerFn fn, bool random = false) { Register(name, fn, random); }
};
#define TT_CAT2(a, b) a##b
#define TT_CAT(a, b) TT_CAT2(a, b)
#define TT_LOWERING(name, fn) static ::tt::ops::Registrar TT_CAT(tt_reg_, __COUNTER__)(name, fn)
#define TT_RANDOM_LOWERING(name, fn) \
  static ::tt::ops::Registrar TT_CAT(tt_reg_, __COUNTER__)(name, fn, true)

// ---- shared helpers for lowerings (ops/common.cpp) ----
int64_t NormDim(int64_t d, int64_t rank);
Dims NormDims(const std::vector<int64_t>& ds, int64_t rank);
// Broadcast v (converted to et) to `dims`, numpy-style.
Value Bcast(Builder& b, Value v, const Dims& dims, ET et);
// Result of elementwise math: compute dtype for an output dtype (f16/bf16 upcast to f32).
ET ComputeType(ET out);
Value Cast(Builder& b, Value v, ET et);
// torch.matmul semantics; f16/bf16 accumulate in f32 (wide: return the f32 result).
Value Matmul(Builder& b, Value a, Value c, ET out_et, bool wide = false);
Value SumDims(Builder& b, Value v, const Dims& dims, bool keepdim, ET acc);

}  // namespace tt::ops

namespace tt::ops {
// Registers one lowering under several op names (functional, in-place, out=).
struct MultiRegistrar {
  MultiRegistrar(std::initializer_list<const char*> names, LowerFn fn, bool random = false,
                 bool graph_only = false) {
    for (auto n : names) Register(n, fn, random, graph_only);
  }
};
// Usage: TT_LOWERINGS(({"aten::add.Tensor", "aten::add_.Tensor"}), fn);
#define TT_LOWERINGS(names, fn) \
  static ::tt::ops::MultiRegistrar TT_CAT(tt_mreg_, __COUNTER__)(std::initializer_list<const char*> names, fn)
// Random ops (the lowering calls c.rng_key()) under several names.
#define TT_RANDOM_LOWERINGS(names, fn)                                                        \
  static ::tt::ops::MultiRegistrar TT_CAT(tt_mreg_, __COUNTER__)(std::initializer_list<const char*> names, \
                                                                 fn, true)

// Lowerings for functionalized graphs only (views, factories): see Lowering.
#define TT_GRAPH_LOWERINGS(names, fn)                                                         \
  static ::tt::ops::MultiRegistrar TT_CAT(tt_mreg_, __COUNTER__)(std::initializer_list<const char*> names, \
                                                                 fn, false, true)

// Rows of x (dim 0) at idx (any int type, any shape; clamped as XLA's gather): [K, ...].
Value RowGather(Builder& b, Value x, Value idx);
// Negative indices wrap: idx < 0 ? idx + size : idx (as s64).
Value WrapIndex(Builder& b, Value idx, int64_t size);
// Scatter update region: "add", "multiply", "max", "min", or replace.
hlo::Region ScatterCombiner(ET et, const std::string& how);
// XLA simplifies a scatter with a single update window into a
// dynamic-update-slice that it does not do in place: a one-row write copied
// the whole operand (36 ms for one row of a 32 MB KV cache on XLA:CPU, 0.03 ms
// for two rows). When `windows` is 1 (coords' and upd's dim 0 being the scatter
// batch dim, every batch dim of size 1), this appends a second window that
// leaves the result as it was: the same window again for replace/max/min, the
// combiner's identity (-0.0, 0, false; 1 for multiply) otherwise.
void AvoidSingleWindow(Builder& b, Value& coords, Value& upd, int64_t windows, const std::string& how);
// padding attribute text: dense<[[lo0, hi0], ...]> : tensor<Nx2xi64>
std::string PadAttr(const Dims& lo, const Dims& hi);

// torch.result_type over the given argument positions (tensors, scalars).
ET CommonType(const LowerCtx& c, std::initializer_list<size_t> idx);
ET PromoteET(ET a, ET b);
}  // namespace tt::ops
