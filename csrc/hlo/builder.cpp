#include "builder.h"

#include <charconv>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace tt::hlo {

const char* ETName(ET t) {
  switch (t) {
    case ET::PRED: return "i1";
    case ET::S8: return "i8";
    case ET::S16: return "i16";
    case ET::S32: return "i32";
    case ET::S64: return "i64";
    case ET::U8: return "ui8";
    case ET::U16: return "ui16";
    case ET::U32: return "ui32";
    case ET::U64: return "ui64";
    case ET::F16: return "f16";
    case ET::BF16: return "bf16";
    case ET::F32: return "f32";
    case ET::F64: return "f64";
    case ET::C64: return "complex<f32>";
    case ET::C128: return "complex<f64>";
    case ET::F8E4M3FN: return "f8E4M3FN";
    case ET::F8E5M2: return "f8E5M2";
    case ET::F8E8M0FNU: return "f8E8M0FNU";
    case ET::F4E2M1FN: return "f4E2M1FN";
    case ET::F8E4M3FNUZ: return "f8E4M3FNUZ";
    case ET::F8E5M2FNUZ: return "f8E5M2FNUZ";
  }
  return "?";
}

int ETBytes(ET t) {
  switch (t) {
    case ET::PRED: case ET::S8: case ET::U8: case ET::F8E4M3FN: case ET::F8E5M2:
    case ET::F8E8M0FNU: case ET::F4E2M1FN: case ET::F8E4M3FNUZ: case ET::F8E5M2FNUZ:
      return 1;
    case ET::S16: case ET::U16: case ET::F16: case ET::BF16: return 2;
    case ET::S32: case ET::U32: case ET::F32: return 4;
    case ET::S64: case ET::U64: case ET::F64: case ET::C64: return 8;
    case ET::C128: return 16;
  }
  return 0;
}

bool IsFloat(ET t) {
  switch (t) {
    case ET::F16: case ET::BF16: case ET::F32: case ET::F64: case ET::F8E4M3FN:
    case ET::F8E5M2: case ET::F8E8M0FNU: case ET::F4E2M1FN: case ET::F8E4M3FNUZ:
    case ET::F8E5M2FNUZ:
      return true;
    default: return false;
  }
}
bool IsComplex(ET t) { return t == ET::C64 || t == ET::C128; }
bool IsUnsigned(ET t) { return t == ET::U8 || t == ET::U16 || t == ET::U32 || t == ET::U64; }
bool IsInt(ET t) {
  return IsUnsigned(t) || t == ET::S8 || t == ET::S16 || t == ET::S32 || t == ET::S64;
}
ET ComplexPart(ET t) { return t == ET::C128 ? ET::F64 : ET::F32; }

int64_t Type::numel() const {
  int64_t n = 1;
  for (auto d : dims) n *= d;
  return n;
}

static void AppendInt(std::string& s, int64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  s.append(buf, r.ptr - buf);
}

void Type::AppendTo(std::string& s) const {
  s += "tensor<";
  for (auto d : dims) {
    AppendInt(s, d);
    s += 'x';
  }
  s += ETName(et);
  s += '>';
}

std::string Type::str() const {
  std::string s;
  AppendTo(s);
  return s;
}

static void AppendName(std::string& s, const Value& v) {
  s += v.arg ? "%arg" : "%";
  AppendInt(s, v.id);
  if (v.idx >= 0) {
    s += '#';
    AppendInt(s, v.idx);
  }
}

std::string Value::name() const {
  std::string s;
  AppendName(s, *this);
  return s;
}

std::string I64Array(const Dims& v) {
  std::string s = "array<i64";
  for (size_t i = 0; i < v.size(); ++i) {
    s += i ? ", " : ": ";
    s += std::to_string(v[i]);
  }
  return s + ">";
}

std::string IntList(const Dims& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  return s + "]";
}

// The body of the last program finished on this thread: a new builder
// reserves that much, so recording a region of the same size (the next step
// of a loop) never regrows and recopies its text.
static thread_local size_t t_body_hint = 0;

Builder::Builder() { body_.reserve(std::min<size_t>(t_body_hint, size_t(64) << 20)); }

Value Builder::Arg(const Type& t) {
  Value v;
  v.id = (int32_t)arg_types_.size();
  v.arg = true;
  v.type = t;
  arg_types_.push_back(t);
  arg_attrs_.emplace_back();
  return v;
}

std::vector<Value> Builder::Op(std::string_view name, const std::vector<Value>& operands,
                               const std::vector<Type>& results, std::string_view attrs,
                               const std::vector<Region>& regions) {
  int id = Emit({}, name, operands.data(), operands.size(), results.data(), results.size(), attrs,
                regions.empty() ? nullptr : &regions);
  std::vector<Value> out;
  out.reserve(results.size());
  for (size_t i = 0; i < results.size(); ++i) {
    out.push_back(Value::Of(id, results[i]));
    if (results.size() > 1) out.back().idx = (int32_t)i;
  }
  return out;
}

Value Builder::Op1(std::string_view name, const std::vector<Value>& operands, const Type& result,
                   std::string_view attrs, const std::vector<Region>& regions) {
  return Value::Of(Emit({}, name, operands.data(), operands.size(), &result, 1, attrs,
                        regions.empty() ? nullptr : &regions),
                   result);
}

int Builder::Emit(std::string_view prefix, std::string_view name, const Value* operands, size_t n_operands,
                  const Type* results, size_t n_results, std::string_view attrs,
                  const std::vector<Region>* regions) {
  for (size_t i = 0; i < n_operands; ++i)
    if (!operands[i].valid())
      throw std::runtime_error("hlo: invalid operand to " + std::string(prefix) + std::string(name));
  int id = next_++;
  // Regions are emitted into their own text first (their ops take ids before
  // this op's line is complete), then the line is appended in one piece.
  std::string region_text;
  if (regions) {
    region_text += " (";
    for (size_t r = 0; r < regions->size(); ++r) {
      const Region& rg = (*regions)[r];
      if (r) region_text += ", ";
      region_text += "{\n";
      std::string saved_body;
      saved_body.swap(body_);
      std::string saved_indent = indent_;
      indent_ += "  ";
      std::vector<Value> bargs;
      std::string header = indent_.substr(0, indent_.size() - 2) + "^bb0(";
      for (size_t i = 0; i < rg.arg_types.size(); ++i) {
        Value v = Value::Of(next_++, rg.arg_types[i]);
        bargs.push_back(v);
        if (i) header += ", ";
        AppendName(header, v);
        header += ": ";
        v.type.AppendTo(header);
      }
      header += "):\n";
      std::vector<Value> rets = rg.body(*this, bargs);
      std::string ret = indent_ + "\"stablehlo.return\"(";
      for (size_t i = 0; i < rets.size(); ++i) {
        if (i) ret += ", ";
        AppendName(ret, rets[i]);
      }
      ret += ") : (";
      for (size_t i = 0; i < rets.size(); ++i) {
        if (i) ret += ", ";
        rets[i].type.AppendTo(ret);
      }
      ret += ") -> ()\n";
      std::string inner = header + body_ + ret;
      body_.swap(saved_body);
      indent_ = saved_indent;
      region_text += inner + indent_ + "}";
    }
    region_text += ")";
  }
  std::string& s = body_;
  s += indent_;
  if (n_results) {
    s += '%';
    AppendInt(s, id);
    if (n_results > 1) {
      s += ':';
      AppendInt(s, (int64_t)n_results);
    }
    s += " = ";
  }
  s += '"';
  s += prefix;
  s += name;
  s += "\"(";
  for (size_t i = 0; i < n_operands; ++i) {
    if (i) s += ", ";
    AppendName(s, operands[i]);
  }
  s += ')';
  s += region_text;
  if (!attrs.empty()) {
    s += " {";
    s += attrs;
    s += '}';
  }
  s += " : (";
  for (size_t i = 0; i < n_operands; ++i) {
    if (i) s += ", ";
    operands[i].type.AppendTo(s);
  }
  s += ") -> ";
  if (n_results != 1) s += '(';
  for (size_t i = 0; i < n_results; ++i) {
    if (i) s += ", ";
    results[i].AppendTo(s);
  }
  if (n_results != 1) s += ')';
  s += '\n';
  return id;
}

std::string Builder::Finish(const std::vector<Value>& results, const std::string& name) const {
  t_body_hint = body_.size() + body_.size() / 8;
  std::string s;
  s.reserve(body_.size() + 128 * (arg_types_.size() + 2 * results.size()) + 512);
  s += "module @" + name +
                  " attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {\n"
                  "  func.func public @main(";
  for (size_t i = 0; i < arg_types_.size(); ++i) {
    if (i) s += ", ";
    s += "%arg" + std::to_string(i) + ": " + arg_types_[i].str();
    if (!arg_attrs_[i].empty()) s += " {" + arg_attrs_[i] + "}";
  }
  s += ") -> (";
  for (size_t i = 0; i < results.size(); ++i) {
    if (i) s += ", ";
    s += results[i].type.str();
  }
  s += ") {\n" + body_ + "    \"func.return\"(";
  for (size_t i = 0; i < results.size(); ++i) {
    if (i) s += ", ";
    s += results[i].name();
  }
  s += ") : (";
  for (size_t i = 0; i < results.size(); ++i) {
    if (i) s += ", ";
    s += results[i].type.str();
  }
  s += ") -> ()\n  }\n}\n";
  return s;
}

// ---------------------------------------------------------------- helpers
static std::string FloatLiteral(ET et, double v) {
  char buf[64];
  if (std::isfinite(v)) {
    // Shortest round-trip form (std::to_chars is several times faster than
    // printf("%.17e"), which ran for every constant a lowering emits); MLIR
    // wants a '.' in a float literal: "1e+00" becomes "1.0e+00".
    auto r = std::to_chars(buf, buf + sizeof buf - 4, v, std::chars_format::scientific);
    std::string out(buf, r.ptr);
    if (out.find('.') == std::string::npos) out.insert(out.find('e'), ".0");
    return out;
  }
  bool neg = std::signbit(v);
  uint64_t bits = 0;
  int width = 0;
  switch (et) {
    case ET::F64: bits = std::isnan(v) ? 0x7FF8000000000000ull : 0x7FF0000000000000ull;
      if (neg) bits |= 0x8000000000000000ull; width = 16; break;
    case ET::F32: bits = std::isnan(v) ? 0x7FC00000u : 0x7F800000u; if (neg) bits |= 0x80000000u;
      width = 8; break;
    case ET::F16: bits = std::isnan(v) ? 0x7E00 : 0x7C00; if (neg) bits |= 0x8000; width = 4; break;
    case ET::BF16: bits = std::isnan(v) ? 0x7FC0 : 0x7F80; if (neg) bits |= 0x8000; width = 4; break;
    default: throw std::runtime_error("hlo: non-finite literal for this type");
  }
  std::snprintf(buf, sizeof buf, "0x%0*llX", width, (unsigned long long)bits);
  return buf;
}

Value Builder::Constant(const Type& t, const std::string& literal) {
  return Op1("stablehlo.constant", {}, t, "value = dense<" + literal + "> : " + t.str());
}

Value Builder::ScalarConst(ET et, double v) { return Splat(Type(et, {}), v); }

Value Builder::Splat(const Type& t, double v) {
  ET et = t.et;
  if (et == ET::PRED) return Constant(t, v != 0 ? "true" : "false");
  if (IsInt(et)) {
    char buf[32];
    if (IsUnsigned(et)) std::snprintf(buf, sizeof buf, "%llu", (unsigned long long)(v < 0 ? 0 : v));
    else std::snprintf(buf, sizeof buf, "%lld", (long long)v);
    return Constant(t, buf);
  }
  if (IsComplex(et)) {
    ET p = ComplexPart(et);
    return Constant(t, "(" + FloatLiteral(p, v) + ", " + FloatLiteral(p, 0.0) + ")");
  }
  if (et == ET::F32 || et == ET::F64 || et == ET::F16 || et == ET::BF16)
    return Constant(t, FloatLiteral(et, v));
  // Narrow float formats: build in f32 and convert.
  return Convert(Constant(t.with_et(ET::F32), FloatLiteral(ET::F32, v)), et);
}

Value Builder::Convert(Value v, ET et) {
  if (v.et() == et) return v;
  return Op1("stablehlo.convert", {v}, v.type.with_et(et));
}

Value Builder::BitcastConvert(Value v, const Type& t) {
  return Op1("stablehlo.bitcast_convert", {v}, t);
}

Value Builder::Reshape(Value v, const Dims& dims) {
  if (v.dims() == dims) return v;
  return Op1("stablehlo.reshape", {v}, v.type.with_dims(dims));
}

Value Builder::Broadcast(Value v, const Dims& dims, const Dims& bdims) {
  return Op1("stablehlo.broadcast_in_dim", {v}, v.type.with_dims(dims),
             "broadcast_dimensions = " + I64Array(bdims));
}

Value Builder::BroadcastTo(Value v, const Dims& dims) {
  if (v.dims() == dims) return v;
  int r = v.rank(), n = (int)dims.size();
  if (r > n) throw std::runtime_error("hlo: cannot broadcast to a lower rank");
  Dims bd;
  for (int i = 0; i < r; ++i) bd.push_back(n - r + i);
  return Broadcast(v, dims, bd);
}

Value Builder::Transpose(Value v, const Dims& perm) {
  bool ident = true;
  for (size_t i = 0; i < perm.size(); ++i) ident &= perm[i] == (int64_t)i;
  if (ident) return v;
  Dims d;
  for (auto p : perm) d.push_back(v.dims()[p]);
  return Op1("stablehlo.transpose", {v}, v.type.with_dims(d), "permutation = " + I64Array(perm));
}

Value Builder::Slice(Value v, const Dims& start, const Dims& limit, const Dims& strides) {
  Dims d;
  bool ident = true;
  for (size_t i = 0; i < start.size(); ++i) {
    d.push_back((limit[i] - start[i] + strides[i] - 1) / strides[i]);
    if (d.back() < 0) d.back() = 0;
    ident &= start[i] == 0 && limit[i] == v.dims()[i] && strides[i] == 1;
  }
  if (ident) return v;
  return Op1("stablehlo.slice", {v}, v.type.with_dims(d),
             "start_indices = " + I64Array(start) + ", limit_indices = " + I64Array(limit) +
                 ", strides = " + I64Array(strides));
}

Value Builder::SliceDim(Value v, int64_t dim, int64_t start, int64_t limit, int64_t step) {
  int r = v.rank();
  Dims st(r, 0), lim = v.dims(), strides(r, 1);
  st[dim] = start;
  lim[dim] = limit;
  strides[dim] = step;
  return Slice(v, st, lim, strides);
}

Value Builder::Concat(const std::vector<Value>& vs, int64_t dim) {
  if (vs.size() == 1) return vs[0];
  Dims d = vs[0].dims();
  d[dim] = 0;
  for (auto& v : vs) d[dim] += v.dims()[dim];
  return Op1("stablehlo.concatenate", vs, vs[0].type.with_dims(d),
             "dimension = " + std::to_string(dim) + " : i64");
}

Value Builder::Iota(const Type& t, int64_t dim) {
  return Op1("stablehlo.iota", {}, t, "iota_dimension = " + std::to_string(dim) + " : i64");
}

Value Builder::Pad(Value v, Value pad_value, const Dims& low, const Dims& high, const Dims& interior) {
  Dims d = v.dims();
  for (size_t i = 0; i < d.size(); ++i)
    d[i] = low[i] + high[i] + d[i] + (d[i] > 0 ? (d[i] - 1) * interior[i] : 0);
  return Op1("stablehlo.pad", {v, pad_value}, v.type.with_dims(d),
             "edge_padding_low = " + I64Array(low) + ", edge_padding_high = " + I64Array(high) +
                 ", interior_padding = " + I64Array(interior));
}

Value Builder::Select(Value pred, Value a, Value b) {
  return Op1("stablehlo.select", {pred, a, b}, a.type);
}

Value Builder::Compare(Value a, Value b, const char* dir) {
  const char* ct = IsFloat(a.et()) || IsComplex(a.et()) ? "FLOAT"
                   : (IsUnsigned(a.et()) || IsBool(a.et())) ? "UNSIGNED"
                                                            : "SIGNED";
  if (IsComplex(a.et())) ct = "FLOAT";
  return Op1("stablehlo.compare", {a, b}, a.type.with_et(ET::PRED),
             std::string("comparison_direction = #stablehlo<comparison_direction ") + dir +
                 ">, compare_type = #stablehlo<comparison_type " + ct + ">");
}

std::vector<Value> Builder::ReduceMulti(const std::vector<Value>& vs, const std::vector<Value>& inits,
                                        const Dims& dims, const RegionFn& body) {
  Dims out;
  const Dims& in = vs[0].dims();
  for (int64_t i = 0; i < (int64_t)in.size(); ++i) {
    bool red = false;
    for (auto d : dims) red |= d == i;
    if (!red) out.push_back(in[i]);
  }
  std::vector<Value> operands = vs;
  operands.insert(operands.end(), inits.begin(), inits.end());
  std::vector<Type> rtypes;
  Region reg;
  for (auto& v : vs) rtypes.push_back(v.type.with_dims(out));
  for (int k = 0; k < 2; ++k)
    for (auto& v : vs) reg.arg_types.push_back(Type(v.et(), {}));
  reg.body = body;
  return Op("stablehlo.reduce", operands, rtypes, "dimensions = " + I64Array(dims), {reg});
}

Value Builder::Reduce(Value v, Value init, const Dims& dims, const char* op) {
  std::string name = std::string("stablehlo.") + op;
  return ReduceMulti({v}, {init}, dims, [name](Builder& b, const std::vector<Value>& a) {
    return std::vector<Value>{b.Op1(name, {a[0], a[1]}, a[0].type)};
  })[0];
}

std::string Builder::PrecisionAttr(ET a, ET b, Prec p) const {
  auto wide = [](ET t) { return t == ET::F32 || t == ET::C64; };
  if (!wide(a) && !wide(b)) return "";
  F32Precision f = p == Prec::kExact ? F32Precision::kHighest : f32_precision_;
  if (f == F32Precision::kDefault) return "";
  const char* name = f == F32Precision::kHighest ? "HIGHEST" : "HIGH";
  return std::string(", precision_config = [#stablehlo<precision ") + name + ">, #stablehlo<precision " + name +
         ">]";
}

Value Builder::DotGeneral(Value a, Value b, const Dims& lb, const Dims& rb, const Dims& lc,
                          const Dims& rc, const Type& result, Prec p) {
  return Op1("stablehlo.dot_general", {a, b}, result,
             "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = " + IntList(lb) +
                 ", rhs_batching_dimensions = " + IntList(rb) +
                 ", lhs_contracting_dimensions = " + IntList(lc) +
                 ", rhs_contracting_dimensions = " + IntList(rc) + ">" + PrecisionAttr(a.et(), b.et(), p));
}

Value Builder::DynamicSlice(Value operand, const std::vector<Value>& starts, const Dims& sizes) {
  std::vector<Value> ops{operand};
  ops.insert(ops.end(), starts.begin(), starts.end());
  return Op1("stablehlo.dynamic_slice", ops, operand.type.with_dims(sizes), "slice_sizes = " + I64Array(sizes));
}

Value Builder::DynamicUpdateSlice(Value operand, Value update, const std::vector<Value>& starts) {
  std::vector<Value> ops{operand, update};
  ops.insert(ops.end(), starts.begin(), starts.end());
  return Op1("stablehlo.dynamic_update_slice", ops, operand.type);
}

}  // namespace tt::hlo
