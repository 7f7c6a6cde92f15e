// A small StableHLO builder that prints the textual (generic) form the PJRT
// plugins parse. Torch-free. Values are SSA names inside one function;
// regions (reduce, sort, scatter, ...) are built by callbacks.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace tt::hlo {

enum class ET : uint8_t {
  PRED, S8, S16, S32, S64, U8, U16, U32, U64, F16, BF16, F32, F64, C64, C128,
  F8E4M3FN, F8E5M2, F8E8M0FNU, F4E2M1FN, F8E4M3FNUZ, F8E5M2FNUZ,
};
const char* ETName(ET t);   // "f32", "i1", "complex<f32>", ...
int ETBytes(ET t);          // storage bytes per element (bool: 1)
bool IsFloat(ET t);         // real floating point (incl. f8/bf16)
bool IsComplex(ET t);
bool IsInt(ET t);           // signed or unsigned integer (not bool)
bool IsUnsigned(ET t);
inline bool IsBool(ET t) { return t == ET::PRED; }
ET ComplexPart(ET t);       // c64 -> f32, c128 -> f64

using Dims = std::vector<int64_t>;

struct Type {
  ET et = ET::F32;
  Dims dims;
  Type() = default;
  Type(ET e, Dims d) : et(e), dims(std::move(d)) {}
  int rank() const { return (int)dims.size(); }
  int64_t numel() const;
  std::string str() const;  // tensor<2x3xf32>
  void AppendTo(std::string& s) const;
  Type with_et(ET e) const { return Type(e, dims); }
  Type with_dims(Dims d) const { return Type(et, std::move(d)); }
  bool operator==(const Type& o) const { return et == o.et && dims == o.dims; }
  bool operator!=(const Type& o) const { return !(*this == o); }
};

struct Value {
  int32_t id = -1;   // >= 0: %N ; < -1 never
  int32_t idx = -1;  // result index of a multi-result op, -1 if single
  Type type;
  bool arg = false;  // function argument %argN
  bool valid() const { return id >= 0; }
  std::string name() const;
  static Value Of(int32_t id, const Type& t) {
    Value v;
    v.id = id;
    v.type = t;
    return v;
  }
  const Dims& dims() const { return type.dims; }
  ET et() const { return type.et; }
  int rank() const { return type.rank(); }
};

class Builder;
// A region body: receives the block arguments, returns the values to return.
using RegionFn = std::function<std::vector<Value>(Builder&, const std::vector<Value>&)>;
struct Region {
  std::vector<Type> arg_types;
  RegionFn body;
};

std::string I64Array(const Dims& v);   // array<i64: 1, 2>
std::string IntList(const Dims& v);    // [1, 2]

class Builder {
 public:
  Builder();

  // Function arguments (in order). `attrs` e.g. "tf.aliasing_output = 0 : i32".
  Value Arg(const Type& t);
  int num_args() const { return (int)arg_types_.size(); }
  void SetArgAttr(int i, const std::string& attr) { arg_attrs_.at(i) = attr; }

  // Generic op emission. `attrs` is the inner text of the attribute dict.
  std::vector<Value> Op(std::string_view name, const std::vector<Value>& operands,
                        const std::vector<Type>& results, std::string_view attrs = {},
                        const std::vector<Region>& regions = {});
  Value Op1(std::string_view name, const std::vector<Value>& operands, const Type& result,
            std::string_view attrs = {}, const std::vector<Region>& regions = {});

  // Module text with the given results; `name` is the module symbol.
  std::string Finish(const std::vector<Value>& results, const std::string& name = "torchtpu") const;
  const std::string& body() const { return body_; }

  // ---- helpers for common ops (all emit stablehlo.*) ----
  Value Constant(const Type& t, const std::string& literal);  // dense<literal>
  Value ScalarConst(ET et, double v);
  Value Zeros(const Type& t) { return Splat(t, 0.0); }
  Value Splat(const Type& t, double v);
  Value Convert(Value v, ET et);
  Value BitcastConvert(Value v, const Type& t);
  Value Reshape(Value v, const Dims& dims);
  Value Broadcast(Value v, const Dims& dims, const Dims& bdims);  // broadcast_in_dim
  Value BroadcastTo(Value v, const Dims& dims);  // numpy-style right-aligned
  Value Transpose(Value v, const Dims& perm);
  Value Slice(Value v, const Dims& start, const Dims& limit, const Dims& strides);
  // Slice of one dimension [start, limit) with step; the others whole.
  Value SliceDim(Value v, int64_t dim, int64_t start, int64_t limit, int64_t step = 1);
  Value Concat(const std::vector<Value>& vs, int64_t dim);
  Value Iota(const Type& t, int64_t dim);
  Value Pad(Value v, Value pad_value, const Dims& low, const Dims& high, const Dims& interior);
  Value Select(Value pred, Value a, Value b);
  Value Compare(Value a, Value b, const char* dir);  // EQ NE LT LE GT GE
  Value Unary(const char* op, const Value& a) {
    return Value::Of(Emit("stablehlo.", op, &a, 1, &a.type, 1, {}, nullptr), a.type);
  }
  Value Binary(const char* op, const Value& a, const Value& b) {
    const Value ab[2] = {a, b};
    return Value::Of(Emit("stablehlo.", op, ab, 2, &a.type, 1, {}, nullptr), a.type);
  }
  Value Add(const Value& a, const Value& b) { return Binary("add", a, b); }
  Value Sub(const Value& a, const Value& b) { return Binary("subtract", a, b); }
  Value Mul(const Value& a, const Value& b) { return Binary("multiply", a, b); }
  Value Div(const Value& a, const Value& b) { return Binary("divide", a, b); }
  Value Max(const Value& a, const Value& b) { return Binary("maximum", a, b); }
  Value Min(const Value& a, const Value& b) { return Binary("minimum", a, b); }
  // Reduce `v` over `dims` with a binary region op ("add", "maximum", ...).
  Value Reduce(Value v, Value init, const Dims& dims, const char* op);
  std::vector<Value> ReduceMulti(const std::vector<Value>& vs, const std::vector<Value>& inits,
                                 const Dims& dims, const RegionFn& body);
  // Float32 (and complex64) dots and convolutions carry the precision the
  // caller set (torch.get_float32_matmul_precision(): "highest" -> HIGHEST,
  // "high" -> HIGH, "medium" -> DEFAULT, which on TPU is one bfloat16 pass);
  // an op's internal dot that stands for exact arithmetic (a cumulative sum,
  // a pooling window's mean) asks for kExact: HIGHEST whatever the setting.
  enum class Prec : uint8_t { kUser, kExact };
  enum class F32Precision : uint8_t { kHighest, kHigh, kDefault };
  void set_f32_precision(F32Precision p) { f32_precision_ = p; }
  // The program is meant for (or also checked on) a TPU: lowerings refuse
  // what XLA's TPU compiler rejects, by name, instead of a compile failure.
  void set_tpu_target(bool on) { tpu_target_ = on; }
  bool tpu_target() const { return tpu_target_; }
  // The program runs on the XLA CPU plugin and is not also checked for a TPU: lowerings may
  // pick the form that suits a CPU (a loop of small products where a TPU wants one batch).
  void set_cpu_target(bool on) { cpu_target_ = on; }
  bool cpu_target() const { return cpu_target_; }
  F32Precision f32_precision() const { return f32_precision_; }
  // ", precision_config = [...]" for operands of these types, or "".
  std::string PrecisionAttr(ET a, ET b, Prec p = Prec::kUser) const;
  Value DotGeneral(Value a, Value b, const Dims& lb, const Dims& rb, const Dims& lc,
                   const Dims& rc, const Type& result, Prec p = Prec::kUser);
  Value DynamicSlice(Value operand, const std::vector<Value>& starts, const Dims& sizes);
  Value DynamicUpdateSlice(Value operand, Value update, const std::vector<Value>& starts);

 private:
  friend class RegionScope;
  // Appends one op ("prefix+name"(operands) ... : type) to the body; returns its id.
  int Emit(std::string_view prefix, std::string_view name, const Value* operands, size_t n_operands,
           const Type* results, size_t n_results, std::string_view attrs, const std::vector<Region>* regions);
  int next_ = 0;
  std::vector<Type> arg_types_;
  std::vector<std::string> arg_attrs_;
  std::string body_;
  std::string indent_ = "    ";
  F32Precision f32_precision_ = F32Precision::kHighest;
  bool tpu_target_ = false;
  bool cpu_target_ = false;
};

}  // namespace tt::hlo
