#include "executor.h"

#include <torch/version.h>

#include <ATen/ATen.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <c10/util/Exception.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <thread>
#include <cstring>

#include "debug.h"
#include "events.h"
#include "core/device/generator.h"
#include "runtime/runtime.h"
#include "runtime/tpu_check.h"

namespace tt {

using hlo::ET;
using hlo::Type;
using hlo::Value;

namespace {
std::atomic<int> g_mode{0};
thread_local int t_mode = -1;
std::atomic<uint64_t> g_epoch{1};
}  // namespace

// The thread mode (torchtpu.mode(...)) also lives in c10's ThreadLocalDebugInfo,
// which the autograd engine propagates to its device threads: backward runs
// in the mode of the thread that called .backward().
namespace {
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 13
// Before torch 2.13 DebugInfoKind is a closed enum: builds against an older
// torch (tools/device_check.sh on the GPU image's 2.11) take a kind that
// torch uses only in its own tests.
const c10::DebugInfoKind kModeInfo = c10::DebugInfoKind::TEST_INFO_2;
#else
constexpr std::string_view kModeInfoName = "TORCHTPU_MODE";
const c10::DebugInfoKind kModeInfo(&kModeInfoName);
#endif
struct ModeInfo : c10::DebugInfoBase {
  explicit ModeInfo(int m) : mode(m) {}
  int mode;
};
}  // namespace

Mode GetMode() {
  if (t_mode >= 0) return (Mode)t_mode;
  if (auto* i = c10::ThreadLocalDebugInfo::get(kModeInfo)) {
    int m = static_cast<ModeInfo*>(i)->mode;
    if (m >= 0) return (Mode)m;
  }
  return (Mode)g_mode.load();
}

int GetThreadMode() { return t_mode; }

void PushThreadMode(int m) {
  {
    std::lock_guard<std::recursive_mutex> g(Region::Lock());
    if (!Region::Current().empty()) Region::Current().Flush();
  }
  c10::ThreadLocalDebugInfo::_push(kModeInfo, std::make_shared<ModeInfo>(m));
  t_mode = m;
}

void PopThreadMode() {
  {
    std::lock_guard<std::recursive_mutex> g(Region::Lock());
    if (!Region::Current().empty()) Region::Current().Flush();
  }
  c10::ThreadLocalDebugInfo::_pop(kModeInfo);
  auto* i = c10::ThreadLocalDebugInfo::get(kModeInfo);
  t_mode = i ? static_cast<ModeInfo*>(i)->mode : -1;
}

void SetMode(Mode m) {
  {
    std::lock_guard<std::recursive_mutex> g(Region::Lock());
    if (!Region::Current().empty()) Region::Current().Flush();
  }
  g_mode = (int)m;
}

void SetThreadMode(int m) {
  {
    std::lock_guard<std::recursive_mutex> g(Region::Lock());
    if (!Region::Current().empty()) Region::Current().Flush();
  }
  t_mode = m;
}

ET ToET(c10::ScalarType t) {
  switch (t) {
    case c10::kBool: return ET::PRED;
    case c10::kChar: return ET::S8;
    case c10::kShort: return ET::S16;
    case c10::kInt: return ET::S32;
    case c10::kLong: return ET::S64;
    case c10::kByte: return ET::U8;
    case c10::kUInt16: return ET::U16;
    case c10::kUInt32: return ET::U32;
    case c10::kUInt64: return ET::U64;
    case c10::kHalf: return ET::F16;
    case c10::kBFloat16: return ET::BF16;
    case c10::kFloat: return ET::F32;
    case c10::kDouble: return ET::F64;
    case c10::kComplexFloat: return ET::C64;
    case c10::kComplexDouble: return ET::C128;
    case c10::kFloat8_e4m3fn: return ET::F8E4M3FN;
    case c10::kFloat8_e5m2: return ET::F8E5M2;
    case c10::kFloat8_e8m0fnu: return ET::F8E8M0FNU;
    case c10::kFloat8_e4m3fnuz: return ET::F8E4M3FNUZ;
    case c10::kFloat8_e5m2fnuz: return ET::F8E5M2FNUZ;
    case c10::kFloat4_e2m1fn_x2: return ET::U8;  // packed pairs: bytes
    default:
      TORCH_CHECK_TYPE(false, "torchtpu: dtype ", t, " is not supported on the tpu device");
  }
}

c10::ScalarType ToScalarType(ET t) {
  switch (t) {
    case ET::PRED: return c10::kBool;
    case ET::S8: return c10::kChar;
    case ET::S16: return c10::kShort;
    case ET::S32: return c10::kInt;
    case ET::S64: return c10::kLong;
    case ET::U8: return c10::kByte;
    case ET::U16: return c10::kUInt16;
    case ET::U32: return c10::kUInt32;
    case ET::U64: return c10::kUInt64;
    case ET::F16: return c10::kHalf;
    case ET::BF16: return c10::kBFloat16;
    case ET::F32: return c10::kFloat;
    case ET::F64: return c10::kDouble;
    case ET::C64: return c10::kComplexFloat;
    case ET::C128: return c10::kComplexDouble;
    case ET::F8E4M3FN: return c10::kFloat8_e4m3fn;
    case ET::F8E5M2: return c10::kFloat8_e5m2;
    case ET::F8E8M0FNU: return c10::kFloat8_e8m0fnu;
    case ET::F8E4M3FNUZ: return c10::kFloat8_e4m3fnuz;
    case ET::F8E5M2FNUZ: return c10::kFloat8_e5m2fnuz;
    default: TORCH_CHECK(false, "torchtpu: no torch dtype for ", hlo::ETName(t));
  }
}

PJRT_Buffer_Type ToPjrt(ET t) {
  switch (t) {
    case ET::PRED: return PJRT_Buffer_Type_PRED;
    case ET::S8: return PJRT_Buffer_Type_S8;
    case ET::S16: return PJRT_Buffer_Type_S16;
    case ET::S32: return PJRT_Buffer_Type_S32;
    case ET::S64: return PJRT_Buffer_Type_S64;
    case ET::U8: return PJRT_Buffer_Type_U8;
    case ET::U16: return PJRT_Buffer_Type_U16;
    case ET::U32: return PJRT_Buffer_Type_U32;
    case ET::U64: return PJRT_Buffer_Type_U64;
    case ET::F16: return PJRT_Buffer_Type_F16;
    case ET::BF16: return PJRT_Buffer_Type_BF16;
    case ET::F32: return PJRT_Buffer_Type_F32;
    case ET::F64: return PJRT_Buffer_Type_F64;
    case ET::C64: return PJRT_Buffer_Type_C64;
    case ET::C128: return PJRT_Buffer_Type_C128;
    case ET::F8E4M3FN: return PJRT_Buffer_Type_F8E4M3FN;
    case ET::F8E5M2: return PJRT_Buffer_Type_F8E5M2;
    case ET::F8E8M0FNU: return PJRT_Buffer_Type_F8E8M0FNU;
    case ET::F4E2M1FN: return PJRT_Buffer_Type_F4E2M1FN;
    case ET::F8E4M3FNUZ: return PJRT_Buffer_Type_F8E4M3FNUZ;
    case ET::F8E5M2FNUZ: return PJRT_Buffer_Type_F8E5M2FNUZ;
  }
  return PJRT_Buffer_Type_INVALID;
}

// ---------------------------------------------------------------- Region
Region::Region() { Reset(); }

Region& Region::Current() {
  static Region* r = new Region();
  return *r;
}

std::recursive_mutex& Region::Lock() {
  static std::recursive_mutex* m = new std::recursive_mutex();
  return *m;
}

void Region::Reset() {
  b_ = std::make_unique<hlo::Builder>();
  b_->set_tpu_target(GetConfig().plugin_name == "tpu" || TpuCheckOn());
  b_->set_cpu_target(GetConfig().plugin_name == "cpu" && !TpuCheckOn());
  args_.clear();
  arg_src_.clear();
  buf_args_.clear();
  op_scalars_.clear();
  slots_.clear();
  extra_.clear();
  check_vals_.clear();
  check_what_.clear();
  ops_ = 0;
  cut_pending_ = nullptr;
  epoch_ = g_epoch.fetch_add(1);
}

void Region::Abandon() {
  rec_ = nullptr;
  for (auto& s : slots_)
    if (auto st = s.st.lock()) st->slot = -1;
  Reset();
}

void Region::Recover(bool op_was_writing) {
  if (ops_ > 0 && !op_was_writing) {
    // The failed op wrote nothing: what it emitted is dead code, its reads
    // unused arguments; the earlier ops' writes are the program's results.
    Flush(false, "error_recovery");
    return;
  }
  Abandon();
}

Value Region::NewBufferArg(const pjrt::BufferPtr& buf, const Type& t) {
  Value v = b_->Arg(t);
  args_.push_back(buf);
  arg_src_.push_back({});
  arg_src_.back().constant = buf;
  return v;
}

Value Region::BufferArg(const pjrt::BufferPtr& buf, const Type& t) {
  auto it = buf_args_.find(buf.get());
  if (it != buf_args_.end() && it->second.type == t) return it->second;
  return buf_args_[buf.get()] = NewBufferArg(buf, t);
}

int Region::SlotFor(const StatePtr& st, ET want) {
  if (st->region_epoch == epoch_ && st->slot >= 0) return st->slot;
  Slot s;
  s.st = st;
  if (st->buf) {
    size_t n_args = args_.size();
    s.v = BufferArg(st->buf, Type(st->et, {st->numel}));
    s.arg = s.v.id;
    if (args_.size() > n_args) {
      arg_src_.back().constant.reset();
      arg_src_.back().st = st.get();
    }
  } else {
    int64_t n = st->nbytes / hlo::ETBytes(want);
    s.v = b_->Zeros(Type(want, {n}));
  }
  st->region_epoch = epoch_;
  st->slot = (int)slots_.size();
  slots_.push_back(s);
  return st->slot;
}

static hlo::ViewSpec SpecOf(const at::Tensor& t) {
  hlo::ViewSpec s;
  s.sizes.assign(t.sizes().begin(), t.sizes().end());
  s.strides.assign(t.strides().begin(), t.strides().end());
  s.offset = t.storage_offset();
  return s;
}

// Flat value of the storage in element type et, grown to cover `need` elements.
static Value FlatAs(hlo::Builder& b, Value flat, ET et, int64_t need) {
  flat = hlo::FlatBitcast(b, flat, et);
  int64_t n = flat.dims()[0];
  if (n < need) flat = b.Pad(flat, b.Zeros(Type(et, {})), {0}, {need - n}, {0});
  return flat;
}

// A contiguous view starting past the storage's first element is read and written at an
// offset that is a program argument, not a constant: a view that moves from call to call
// (a ring buffer's window, a slice at a step counter) reuses one compiled program.
static bool DynamicOffset(const hlo::ViewSpec& spec, int64_t flat_len) {
  static const bool on = [] {
    const char* e = std::getenv("TORCHTPU_DYNAMIC_VIEW_OFFSETS");
    return !(e && std::string(e) == "0");
  }();
  if (!on) return false;
  int64_t n = spec.numel();
  return spec.offset != 0 && n > 0 && n < flat_len && spec.contiguous();
}

static int64_t Extent(const at::Tensor& t) {
  if (t.numel() == 0) return 0;
  int64_t e = t.storage_offset() + 1;
  for (int64_t i = 0; i < t.dim(); ++i) e += (t.size(i) - 1) * t.stride(i);
  return e;
}

static bool SameValue(const Value& a, const Value& b) {
  return a.id == b.id && a.idx == b.idx && a.arg == b.arg && a.type == b.type;
}

bool Region::CachedRead(const Slot& s, ET et, const hlo::ViewSpec& spec, Value* out) const {
  if (!s.read_valid || s.read_et != et || !SameValue(s.read_src, s.v) || s.read_spec.offset != spec.offset ||
      s.read_spec.sizes != spec.sizes || s.read_spec.strides != spec.strides)
    return false;
  *out = s.read_view;
  return true;
}

void Region::RememberRead(Slot& s, ET et, const hlo::ViewSpec& spec, const Value& view) {
  s.read_src = s.v;
  s.read_et = et;
  s.read_spec = spec;
  s.read_view = view;
  s.read_valid = true;
}

Value Region::Read(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "torchtpu: expected a tpu tensor");
  ET et = ToET(t.scalar_type());
  StatePtr st = GetState(t.storage().unsafeGetStorageImpl());
  int si = SlotFor(st, et);
  hlo::ViewSpec spec = SpecOf(t);
  Value out;
  if (CachedRead(slots_[si], et, spec, &out)) return out;
  Value flat = FlatAs(*b_, slots_[si].v, et, Extent(t));
  Value off;
  bool dyn = DynamicOffset(spec, flat.dims()[0]);
  if (dyn) off = Scalar(c10::Scalar(spec.offset), ET::S64);
  out = hlo::ReadView(*b_, flat, spec, dyn ? &off : nullptr);
  RememberRead(slots_[si], et, spec, out);
  return out;
}

void Region::Write(const at::Tensor& t, Value v) {
  ET et = ToET(t.scalar_type());
  v = b_->Convert(v, et);
  hlo::Dims sizes(t.sizes().begin(), t.sizes().end());
  if (v.dims() != sizes) {
    TORCH_CHECK(v.type.numel() == t.numel(), "torchtpu: internal shape mismatch writing ",
                v.type.str(), " into a tensor of shape ", t.sizes());
    v = b_->Reshape(v, sizes);
  }
  StatePtr st = GetState(t.storage().unsafeGetStorageImpl());
  int64_t total = st->nbytes / hlo::ETBytes(et);
  hlo::ViewSpec spec = SpecOf(t);
  Value base;
  if (spec.offset == 0 && spec.contiguous() && t.numel() == total &&
      total * hlo::ETBytes(et) == st->nbytes) {
    // Whole-storage write: the old value is not needed.
    int si = SlotFor(st, et);
    slots_[si].v = b_->Reshape(v, {total});
    slots_[si].written = true;
    RememberRead(slots_[si], et, spec, v);
    return;
  }
  int si = SlotFor(st, et);
  base = FlatAs(*b_, slots_[si].v, et, std::max(total, Extent(t)));
  Value off;
  bool dyn = DynamicOffset(spec, base.dims()[0]);
  if (dyn) off = Scalar(c10::Scalar(spec.offset), ET::S64);
  slots_[si].v = hlo::WriteView(*b_, base, v, spec, dyn ? &off : nullptr);
  slots_[si].written = true;
}

std::string Region::ScalarKeyOf(const c10::Scalar& s, ET et) {
  char bytes[16] = {0};
  int nb = hlo::ETBytes(et);
  switch (et) {
    case ET::PRED: bytes[0] = s.toBool(); break;
    case ET::F32: { float f = s.toFloat(); std::memcpy(bytes, &f, 4); break; }
    case ET::F64: { double d = s.toDouble(); std::memcpy(bytes, &d, 8); break; }
    case ET::S64: { int64_t i = s.toLong(); std::memcpy(bytes, &i, 8); break; }
    case ET::S32: { int32_t i = s.toInt(); std::memcpy(bytes, &i, 4); break; }
    case ET::U64: { uint64_t i = (uint64_t)s.toLong(); std::memcpy(bytes, &i, 8); break; }
    case ET::C64: { auto c = s.toComplexFloat(); std::memcpy(bytes, &c, 8); break; }
    case ET::C128: { auto c = s.toComplexDouble(); std::memcpy(bytes, &c, 16); break; }
    default: TORCH_CHECK(false, "torchtpu: unsupported scalar argument type ", hlo::ETName(et));
  }
  std::string key(1, (char)et);
  key.append(bytes, nb);
  return key;
}

// Cached one-element device buffers, by ScalarKeyOf.
pjrt::BufferPtr Region::KeyedScalarBuffer(const std::string& key, ET et) {
  static std::unordered_map<std::string, pjrt::BufferPtr> cache;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  pjrt::BufferPtr buf = Runtime::Get().Upload(key.data() + 1, ToPjrt(et), {}, (int64_t)key.size() - 1);
  if (cache.size() > 4096) cache.clear();
  cache[key] = buf;
  return buf;
}

pjrt::BufferPtr Region::ScalarBuffer(const c10::Scalar& s, ET et) { return KeyedScalarBuffer(ScalarKeyOf(s, et), et); }

Value Region::Scalar(const c10::Scalar& s, ET et) {
  std::string key = ScalarKeyOf(s, et);
  auto it = op_scalars_.find(key);
  if (it != op_scalars_.end()) return it->second;
  return op_scalars_[key] = NewBufferArg(KeyedScalarBuffer(key, et), Type(et, {}));
}

Value Region::ScalarInput(const c10::Scalar& s, ET et, int index) {
  Value v = b_->Arg(Type(et, {}));
  args_.push_back(ScalarBuffer(s, et));
  arg_src_.push_back({});
  arg_src_.back().scalar_input = index;
  return v;
}

pjrt::BufferPtr Region::RngKeyBuffer(const c10::optional<at::Generator>& gen, int64_t numel) {
  at::Generator g = gen.has_value() && gen->defined() ? *gen : DefaultGenerator(0);
  std::pair<uint64_t, uint64_t> so;
  {
    std::lock_guard<std::mutex> lock(g.mutex());
    so = g.get<TpuGenerator>()->Next((uint64_t)std::max<int64_t>(numel, 1));
  }
  uint64_t key[2] = {so.first, so.second};
  return Runtime::Get().Upload(key, PJRT_Buffer_Type_U64, {2}, 16);
}

Value Region::RngKey(const c10::optional<at::Generator>& gen, int64_t numel) {
  pjrt::BufferPtr buf = RngKeyBuffer(gen, numel);
  Value v = b_->Arg(Type(ET::U64, {2}));
  args_.push_back(buf);
  arg_src_.push_back({});
  // a replay draws from the default generator (compiled graphs use no other)
  arg_src_.back().rng_numel = gen.has_value() && gen->defined() ? -2 : numel;
  return v;
}

int Region::AddResult(Value v) {
  extra_.push_back(v);
  return (int)extra_.size() - 1;
}

namespace {
std::atomic<bool> g_capturing{false};
std::vector<std::string> g_captured;  // under Region::Lock()
}  // namespace

void StartProgramCapture() {
  std::lock_guard<std::recursive_mutex> g(Region::Lock());
  g_captured.clear();
  g_capturing = true;
}

std::vector<std::string> StopProgramCapture() {
  std::lock_guard<std::recursive_mutex> g(Region::Lock());
  g_capturing = false;
  return std::move(g_captured);
}

bool CapturingPrograms() { return g_capturing.load(std::memory_order_relaxed); }

char Region::MatmulPrecisionKey() {
  switch (at::globalContext().float32MatmulPrecision()) {
    case at::Float32MatmulPrecision::HIGH: return 'H';
    case at::Float32MatmulPrecision::MEDIUM: return 'm';
    default: return 'h';
  }
}

void Region::ApplyMatmulPrecision(hlo::Builder& b) {
  using P = hlo::Builder::F32Precision;
  char k = MatmulPrecisionKey();
  b.set_f32_precision(k == 'h' ? P::kHighest : k == 'H' ? P::kHigh : P::kDefault);
}

void Region::AddCheck(Value v, std::shared_ptr<const BoundsCheck> what) {
  check_vals_.push_back(v);
  check_what_.push_back(std::move(what));
}

DeferStats& GetDeferStats() {
  static DeferStats s;
  return s;
}

int64_t DeferThreshold() {
  static int64_t t = [] {
    const char* e = std::getenv("TORCHTPU_DEFER_MAX_OPS");
    return e && *e ? std::max<int64_t>(1, std::atoll(e)) : 1024;
  }();
  return t;
}

constexpr size_t kTinyLoopOps = 32;

// A loop that reads the host every iteration (loss.item()) runs its whole
// iteration after recording it, so the device idles while the host records
// and the host waits while the device runs. Such an iteration is cut into
// parts of about TORCHTPU_DEFER_CHUNK_OPS ops (0: no parts), each flushed at
// the same phase every time (each a cache hit), so the device runs one part
// while the host records the next. A loop that does not sync every iteration
// overlaps whole iterations already and stays one region per iteration.
std::atomic<int64_t>& DeferChunkOpsVar() {
  static std::atomic<int64_t> t{[] {
    const char* e = std::getenv("TORCHTPU_DEFER_CHUNK_OPS");
    return e && *e ? std::max<int64_t>(0, std::atoll(e)) : 48;
  }()};
  return t;
}
int64_t SetDeferChunkOps(int64_t n) {
  TORCH_CHECK(n >= 0, "torchtpu: defer chunk ops must be >= 0, got ", n);
  return DeferChunkOpsVar().exchange(n);
}

// Ops per part of an iteration of `period` ops (0: one part).
size_t ChunkOps(size_t period) {
  constexpr size_t kMaxParts = 16;
  size_t target = (size_t)DeferChunkOpsVar().load();
  if (target == 0 || period < 2 * target) return 0;
  size_t parts = std::min(kMaxParts, (period + target / 2) / target);
  return (period + parts - 1) / parts;
}

void Region::AfterOp(uint64_t sig) {
  ops_++;
  Mode m = GetMode();
  if (m != Mode::DeferAndFuse) {
    Flush(m == Mode::Debug, m == Mode::Debug ? "debug" : "strict");
    return;
  }
  if (period_) {
    // Following a detected loop: cut every `period_` ops, at the same phase,
    // so every region has the same program text (a cache hit).
    if (period_sigs_[period_pos_ % period_sigs_.size()] != sig) {
      period_ = 0;  // the sequence changed: detect again
      ResetDetection();
    } else if (++period_pos_ == period_) {
      period_pos_ = 0;
      cut_pending_ = "loop_boundary";
      return;
    } else if (period_chunk_ && period_pos_ % period_chunk_ == 0) {
      // a cut inside the iteration, at the same phase every time: the device
      // runs this part while the host records the next
      cut_pending_ = "loop_part";
      return;
    }
  }
  if (!period_ && sigs_.empty() && !known_loop_.empty() && sig == known_loop_[0]) {
    period_ = known_loop_.size();
    period_chunk_ = ChunkOps(period_);
    period_sigs_ = known_loop_;
    period_pos_ = 1;
  } else if (!period_ && sigs_.empty() && !overlap_loop_.empty() && sig == overlap_loop_[0]) {
    // the loop that ran whole iterations before a host read at its boundary
    // (logging every N steps) goes on: the same cuts, no new detection region
    period_ = overlap_period_;
    period_chunk_ = 0;
    period_sigs_ = overlap_loop_;
    period_pos_ = 1;
  } else if (!period_) {
    if (sigs_.size() >= 16384) ResetDetection();
    if (anchors_.empty()) anchors_.push_back({sigs_.size(), {}});
    sigs_.push_back(sig);
    const size_t i = sigs_.size() - 1;  // this op's index
    // the first op's signature again, at least twice as far as the last
    // anchor: likely the next iteration's start, so a later anchor
    if (i > 0 && sig == sigs_[0] && i >= 2 * anchors_.back().start) anchors_.push_back({i, {}});
    for (Anchor& a : anchors_) {
      const size_t n = i + 1 - a.start;  // ops since the anchor, this one included
      if (n > 1 && sig == sigs_[a.start]) a.candidates.push_back(n - 1);
      a.candidates.erase(std::remove_if(a.candidates.begin(), a.candidates.end(),
                                        [n](size_t p) { return 2 * p < n; }),
                         a.candidates.end());
      for (size_t p : a.candidates) {
        if (2 * p != n) continue;
        auto first = sigs_.begin() + a.start;
        if (!std::equal(first, first + p, first + p)) continue;
        // Cut every iteration, always at the same phase. A tiny body (an
        // elementwise chain) is cut every k iterations instead, so a region
        // holds enough work; a body of tens of ops or more stays one
        // iteration per region, the program a loop that syncs every step
        // (loss.item()) has compiled already: grouping iterations would cost
        // a second, bigger compile for no fusion gain.
        period_ = p < kTinyLoopOps ? p * std::max<size_t>(1, (size_t)DeferThreshold() / 2 / p) : p;
        period_chunk_ = 0;  // iterations overlap already: no parts
        period_pos_ = (2 * p) % period_;  // phase origin: the anchor's op
        period_sigs_.assign(first, first + p);
        GetDeferStats().periods_detected++;
        ResetDetection();
        if (period_pos_ == 0) {
          cut_pending_ = "loop_boundary";
          return;
        }
        break;
      }
      if (period_) break;
    }
  }
  if (ops_ >= DeferThreshold()) Flush(false, "size_threshold");
}

std::vector<pjrt::BufferPtr> Region::Flush(bool wait, const char* reason) {
  if (GetMode() == Mode::DeferAndFuse || std::strcmp(reason, "strict") != 0) {
    auto& ds = GetDeferStats();
    ds.flushes++;
    ds.ops_flushed += ops_;
    ds.flush_reasons[reason]++;
    bool boundary = !std::strcmp(reason, "loop_boundary");
    // an iteration ended with no host read: iterations overlap now, so the
    // following ones run whole (parts are for loops syncing every iteration)
    if (boundary) period_chunk_ = 0;
    if (!boundary && std::strcmp(reason, "loop_part") && std::strcmp(reason, "loop_detected") &&
        std::strcmp(reason, "size_threshold")) {
      // a host read or sync inside a loop: restart detection from here
      overlap_loop_.clear();
      if (period_ && !period_chunk_ && period_pos_ == 0) {
        overlap_loop_ = period_sigs_;
        overlap_period_ = period_;
      }
      if (sigs_.size() >= kTinyLoopOps) {
        if (sigs_ == last_sigs_) known_loop_ = sigs_;
        last_sigs_ = std::move(sigs_);
      }
      ResetDetection();
      period_ = 0;
    }
  }
  Record* rec = rec_;
  rec_ = nullptr;
  std::vector<Value> results;
  std::vector<StatePtr> targets;
  std::vector<int> donated;
  for (auto& s : slots_) {
    StatePtr st = s.st.lock();
    if (st) st->slot = -1;
    if (!s.written || !st) continue;
    int out_idx = (int)results.size();
    results.push_back(s.v);
    // Donate the old buffer when nothing else can observe it.
    if (s.arg >= 0 && st->buf && OwnRefs(st->buf) == 2 &&
        b_->num_args() > s.arg && Type(st->et, {st->numel}) == s.v.type) {
      b_->SetArgAttr(s.arg, "tf.aliasing_output = " + std::to_string(out_idx) + " : i32");
      donated.push_back(s.arg);
    }
    targets.push_back(st);
  }
  size_t n_storage = results.size();
  for (auto& v : extra_) results.push_back(v);
  const size_t n_extra = extra_.size();
  for (auto& v : check_vals_) results.push_back(v);
  std::vector<std::shared_ptr<const BoundsCheck>> checks = std::move(check_what_);
  std::vector<pjrt::BufferPtr> extra_out;
  if (results.empty()) {
    Reset();
    return extra_out;
  }
  GetDeferStats().programs++;
  Metrics& mt = GetMetrics();
  int64_t t0 = NowNs();
  std::string text = b_->Finish(results);
  if (g_capturing.load(std::memory_order_relaxed)) g_captured.push_back(text);
  std::vector<pjrt::BufferPtr> args = std::move(args_);
  std::vector<Record::Arg> arg_src = std::move(arg_src_);
  Reset();
  Runtime& rt = Runtime::Get();
  int64_t t1 = NowNs();
  // debug mode and waiting flushes compile here; the rest may queue behind a compile
  // one eager op's program (strict, debug) may take cheaper compile options
  const bool op_program = !std::strcmp(reason, "strict") || !std::strcmp(reason, "debug");
  Runtime::ExeFuture exe = wait ? Runtime::Ready(rt.Executable(text, op_program)) : rt.ExecutableAsync(text, op_program);
  mt.finish_ns += t1 - t0;
  mt.lookup_ns += NowNs() - t1;
  if (rec) {
    rec->exe = exe;
    rec->args = std::move(arg_src);
    rec->targets.clear();
    for (size_t i = 0; i < targets.size(); ++i)
      rec->targets.push_back({targets[i].get(), results[i].et(), results[i].dims()[0]});
    rec->donated = donated;
    rec->num_extra = n_extra;
    rec->checks = checks;
  }
  std::vector<int64_t> out_nbytes;
  out_nbytes.reserve(results.size());
  for (auto& v : results) {
    int64_t n = (int64_t)pjrt::ElementSize(ToPjrt(v.et()));
    for (int64_t d : v.dims()) n *= d;
    out_nbytes.push_back(n);
  }
  std::vector<pjrt::BufferPtr> outs = Launch(exe, args, wait, out_nbytes);
  TORCH_CHECK(outs.size() == results.size(), "torchtpu: program returned ", outs.size(),
              " results, expected ", results.size());
  for (size_t i = 0; i < n_storage; ++i) {
    StatePtr& st = targets[i];
    st->buf = outs[i];
    st->et = results[i].et();
    st->numel = results[i].dims()[0];
  }
  for (size_t i = n_storage; i < n_storage + n_extra; ++i) extra_out.push_back(outs[i]);
  for (size_t i = 0; i < checks.size(); ++i) AddPendingCheck(outs[n_storage + n_extra + i], std::move(checks[i]));
  return extra_out;
}

namespace {
// Runs exe on args now (asynchronous unless wait), its completion tracked on `stream`.
std::vector<pjrt::BufferPtr> ExecuteNow(pjrt::Executable& exe, const std::vector<pjrt::BufferPtr>& args,
                                        bool wait, int64_t stream) {
  int64_t t0 = NowNs();
  std::vector<PJRT_Buffer*> raw;
  raw.reserve(args.size());
  for (auto& a : args) raw.push_back(a->get());
  std::shared_ptr<pjrt::Event> done;
  std::vector<pjrt::BufferPtr> outs = exe.Execute(Runtime::Get().device(), raw, {}, wait, &done);
  if (done) TrackCompletion(std::move(done), stream);
  GetMetrics().launch_ns += NowNs() - t0;
  return outs;
}

// ---------------------------------------------------------------- launch queue
// A program still compiling does not hold up the host: its launch is queued,
// its results are pending buffers (pjrt::Buffer's third form), and the host
// goes on recording and dispatching the ops that follow, whose own programs
// compile meanwhile on the other compile threads. Whatever reads a pending
// buffer waits for it. Once a launch is queued, every later launch queues
// behind it until the queue empties, so launches keep program order: a
// donation never overtakes an earlier read of the buffer it consumes.
class LaunchQueue {
 public:
  static LaunchQueue& Get() {
    static LaunchQueue* q = [] {
      auto* n = new LaunchQueue();  // never destroyed (see the atexit drain)
      created.store(n);
      return n;
    }();
    return *q;
  }
  // The queue if anything ever used it (no thread is started to answer "empty").
  static std::atomic<LaunchQueue*> created;
  struct Task {
    Runtime::ExeFuture exe;
    std::vector<pjrt::BufferPtr> args;
    // results: weak, so that a result nobody holds any more is not kept
    // (and the donation checks' reference counts stay the program's own)
    std::vector<std::weak_ptr<pjrt::Buffer>> outs;
    int64_t stream = 0;
  };
  bool busy() const { return queued_.load(std::memory_order_acquire) > 0; }
  void Push(Task t) {
    for (auto& a : t.args) a->queued_refs++;
    std::unique_lock<std::mutex> l(mu_);
    // bounded: the host may run this many launches ahead of the compiles
    space_cv_.wait(l, [this] { return q_.size() < kMaxQueued; });
    q_.push_back(std::move(t));
    queued_++;
    cv_.notify_one();
  }
  void Drain() {
    if (busy()) {
      int64_t t0 = NowNs();
      std::unique_lock<std::mutex> l(mu_);
      idle_cv_.wait(l, [this] { return queued_.load() == 0; });
      GetMetrics().queue_wait_ns += NowNs() - t0;
    }
    std::string err;
    {
      std::lock_guard<std::mutex> g(mu_);
      err.swap(error_);
    }
    if (!err.empty()) throw pjrt::Error(err);
  }

 private:
  static constexpr size_t kMaxQueued = 256;
  LaunchQueue() {
    std::thread([this] { Run(); }).detach();
    std::atexit([] {
      try {
        Runtime::CancelCompiles();  // queued launches of programs not compiled yet fail at once
        LaunchQueue::Get().Drain();
      } catch (...) {
      }
    });
  }
  void Run() {
    for (;;) {
      Task t;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [this] { return !q_.empty(); });
        t = std::move(q_.front());
        q_.pop_front();
      }
      space_cv_.notify_one();
      Execute(t);
      for (auto& a : t.args) a->queued_refs--;  // before the references go (see OwnRefs)
      t.args.clear();
      {
        std::lock_guard<std::mutex> g(mu_);
        queued_--;
      }
      idle_cv_.notify_all();
    }
  }
  void Execute(Task& t) {
    try {
      // the compile's error, or an argument's launch's error, if any
      std::vector<pjrt::BufferPtr> outs = ExecuteNow(*t.exe.get(), t.args, false, t.stream);
      if (outs.size() != t.outs.size())
        throw pjrt::Error("program returned " + std::to_string(outs.size()) + " results, expected " +
                          std::to_string(t.outs.size()));
      for (size_t i = 0; i < outs.size(); ++i)
        if (auto o = t.outs[i].lock()) o->Resolve(outs[i]->Release());
    } catch (const std::exception& e) {
      int code = 2;
      if (auto* pe = dynamic_cast<const pjrt::Error*>(&e)) code = pe->code();
      for (auto& w : t.outs)
        if (auto o = w.lock())
          if (o->pending()) o->Fail(e.what(), code);
      std::lock_guard<std::mutex> g(mu_);
      if (error_.empty()) error_ = e.what();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_, space_cv_;
  std::deque<Task> q_;
  std::atomic<int64_t> queued_{0};  // pushed and not yet launched
  std::string error_;                // the first error since the last drain
};
std::atomic<LaunchQueue*> LaunchQueue::created{nullptr};

bool AsyncLaunches() {
  static const bool on = [] {
    const char* e = std::getenv("TORCHTPU_ASYNC_COMPILE");
    return Runtime::CompileThreads() > 0 && !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}
}  // namespace

bool LaunchesQueued() {
  LaunchQueue* q = LaunchQueue::created.load();
  return q && q->busy();
}
void DrainLaunches() {
  if (LaunchQueue* q = LaunchQueue::created.load()) q->Drain();
}

std::atomic<int64_t> g_launch_seq{0};

std::vector<pjrt::BufferPtr> Region::Launch(const Runtime::ExeFuture& exe_f,
                                            const std::vector<pjrt::BufferPtr>& args, bool wait,
                                            const std::vector<int64_t>& out_nbytes) {
  const int64_t seq = ++g_launch_seq;
  LaunchQueue& q = LaunchQueue::Get();
  bool ready = exe_f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  if (!wait && AsyncLaunches() && (!ready || q.busy())) {
    Metrics& mt = GetMetrics();
    mt.queued_launches++;
    mt.executions++;  // counted when dispatched, as a direct launch is
    LaunchQueue::Task t;
    t.exe = exe_f;
    t.args = args;
    t.stream = CurrentStreamId();
    std::vector<pjrt::BufferPtr> outs;
    outs.reserve(out_nbytes.size());
    const pjrt::Api* api = Runtime::Get().client().api();
    for (int64_t n : out_nbytes) {
      outs.push_back(std::make_shared<pjrt::Buffer>(api, n, pjrt::Buffer::Pending{}));
      outs.back()->seq = seq;
      t.outs.push_back(outs.back());
    }
    q.Push(std::move(t));
    return outs;
  }
  if (q.busy()) q.Drain();  // (a synchronous launch keeps program order too)
  pjrt::ExecutablePtr exe;
  if (ready) {
    exe = exe_f.get();
  } else {
    int64_t t0 = NowNs();
    exe = exe_f.get();
    GetMetrics().queue_wait_ns += NowNs() - t0;
  }
  GetMetrics().executions++;
  std::vector<pjrt::BufferPtr> outs = ExecuteNow(*exe, args, wait, CurrentStreamId());
  for (auto& o : outs) o->seq = seq;
  return outs;
}

void AppendStorageKey(std::string& key, const at::Tensor& t, const StatePtr& st, const StatePtr* earlier,
                      size_t n_earlier) {
  auto put = [&key](int64_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(t.storage_offset());
  put(st->nbytes);
  put(st->buf ? (int64_t)st->et : -1);
  put(st->buf ? st->numel : -1);
  put(st->buf && OwnRefs(st->buf) == 1);
  int64_t same = -1;
  for (size_t j = 0; j < n_earlier; ++j)
    if (earlier[j] && (earlier[j] == st || (st->buf && earlier[j]->buf == st->buf))) {
      same = (int64_t)j;
      break;
    }
  put(same);
}

static bool MirrorValid(const StorageState& st) {
  if (st.mirror.empty() || !st.buf) return false;
  auto of = st.mirror_of.lock();
  return of && of == st.buf;
}

const std::string* HostMirror(const StorageState& st) {
  if (!MirrorValid(st) || st.mirror[0].lo != 0 || (int64_t)st.mirror[0].bytes->size() != st.nbytes)
    return nullptr;
  return st.mirror[0].bytes.get();
}

const char* HostBytes(const StorageState& st, int64_t lo, int64_t hi) {
  if (!MirrorValid(st)) return nullptr;
  for (const auto& m : st.mirror)
    if (lo >= m.lo && hi <= m.lo + (int64_t)m.bytes->size()) return m.bytes->data() + (lo - m.lo);
  return nullptr;
}

void SetHostMirror(StorageState& st, std::shared_ptr<const std::string> bytes) {
  if (!st.buf || (int64_t)bytes->size() != st.nbytes || st.nbytes > kMirrorBytes) return;
  st.mirror.assign(1, {0, std::move(bytes)});
  st.mirror_of = st.buf;
}

void SetHostMirror(StorageState& st, const void* data, int64_t nbytes) {
  if (!st.buf || nbytes != st.nbytes || nbytes > kMirrorBytes) return;
  SetHostMirror(st, std::make_shared<const std::string>(static_cast<const char*>(data), nbytes));
}

// Keeps bytes [lo, lo + size) of st's current buffer as a host copy, with the
// most recent others, up to kMirrorRanges ranges and kRangeBytes in all.
constexpr int64_t kRangeBytes = 1 << 20;
static void AddHostRange(StorageState& st, int64_t lo, std::shared_ptr<const std::string> bytes) {
  constexpr size_t kMirrorRanges = 64;
  if (!MirrorValid(st)) st.mirror.clear();
  st.mirror.push_back({lo, std::move(bytes)});
  st.mirror_of = st.buf;
  int64_t total = 0;
  for (const auto& m : st.mirror) total += (int64_t)m.bytes->size();
  size_t drop = 0;
  while (drop + 1 < st.mirror.size() && (st.mirror.size() - drop > kMirrorRanges || total > kRangeBytes))
    total -= (int64_t)st.mirror[drop++].bytes->size();
  st.mirror.erase(st.mirror.begin(), st.mirror.begin() + drop);
}

// Whether bytes of a 1-D buffer can be read raw (PJRT_Buffer_CopyRawToHost):
// plugins whose 1-D arrays are laid out linearly (XLA:CPU, CUDA); TPU tiles them.
static bool RawReadsLinear() {
  static const bool ok = [] {
    const std::string p = Runtime::Get().client().platform_name();
    return p == "cpu" || p == "cuda" || p == "gpu";
  }();
  return ok;
}

bool HostReadable(const StorageState& st, int64_t lo, int64_t hi) {
  if (HostBytes(st, lo, hi)) return true;
  constexpr int64_t kSmallView = 64 << 10;
  return st.buf && hi - lo <= kSmallView && st.nbytes > kMirrorBytes && RawReadsLinear() &&
         (MirrorValid(st) || st.buf->IsReady());
}

void ViewByteRange(const at::Tensor& t, int64_t& lo, int64_t& hi) {
  const int64_t es = t.element_size();
  lo = hi = t.storage_offset() * es;
  if (t.numel() == 0) return;
  int64_t last = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);  // strides are >= 0
  hi = (last + 1) * es;
}


bool& InHostTier() {
  thread_local bool in = false;
  return in;
}

namespace {
int64_t ReadToHostImpl(const at::Tensor& src, void* dst);
}  // namespace

// A host read is a synchronization point: the bounds checks of the programs
// up to the one that produced the value read (and any finished since) report
// their op's error (RaisePendingChecks). Later programs (a step's parts still
// running while its loss is read) are checked at the next sync.
std::atomic<int>& SyncDebugMode() {
  static std::atomic<int> m{0};
  return m;
}

void ReadToHost(const at::Tensor& src, void* dst) {
  // torch.tpu.set_sync_debug_mode, as torch.cuda's: warn or raise on an
  // operation that waits for the device
  if (int m = SyncDebugMode().load(std::memory_order_relaxed)) {
    TORCH_CHECK(m != 2, "called a synchronizing tpu operation");
    TORCH_WARN("called a synchronizing tpu operation");
  }
  RaisePendingChecks(ReadToHostImpl(src, dst));
}

namespace {
// Returns the launch sequence number of the buffer read (see pjrt::Buffer::seq).
int64_t ReadToHostImpl(const at::Tensor& src, void* dst) {
  int64_t nbytes = src.numel() * src.element_size();
  if (nbytes == 0) return 0;
  std::lock_guard<std::recursive_mutex> g(Region::Lock());
  Region& r = Region::Current();
  StatePtr st = GetState(src.storage().unsafeGetStorageImpl());
  ET et = ToET(src.scalar_type());
  pjrt::BufferPtr buf;
  bool whole = src.storage_offset() == 0 && src.is_contiguous() && src.numel() * src.element_size() == st->nbytes;
  if (whole && !r.empty()) {
    // A whole storage: flush first (a host read ends the region). If the
    // region writes the storage, the flush materializes it anyway (no extra
    // copy as a separate result); if not, its buffer comes from an earlier
    // program, and the read waits for that program only, not for the one
    // just launched (a loss computed in a step's first part is read while
    // the step's later parts still run).
    r.Flush(false, "host_read");
  }
  // A storage the region does not hold: read from a host copy covering the
  // view; else download a small storage whole (keeping a host copy), or the
  // byte range a view of a larger one covers (kept as a partial host copy),
  // and take the view on the host, instead of compiling a program per view
  // (tensor printing reads many slices: one transfer, whatever the size).
  constexpr int64_t kHostViewBytes = 8 << 20;
  const bool plain = st->slot < 0 && st->buf && st->et == et && st->numel * hlo::ETBytes(et) == st->nbytes;
  if (plain) {
    int64_t lo, hi;
    ViewByteRange(src, lo, hi);
    const int64_t es = src.element_size();
    // the view, from host bytes [base, base + len) of the storage
    auto from = [&](const char* p, int64_t base, int64_t len) {
      at::Tensor host = at::from_blob(const_cast<char*>(p), {len / es}, src.options().device(c10::kCPU));
      at::from_blob(dst, src.sizes(), src.options().device(c10::kCPU))
          .copy_(host.as_strided(src.sizes(), src.strides(), src.storage_offset() - base / es));
    };
    if (const char* p = HostBytes(*st, lo, hi)) {
      from(p, lo, hi - lo);
      return st->buf->seq;
    }
    if (!whole && st->nbytes > kMirrorBytes && hi - lo <= kMirrorBytes && RawReadsLinear()) {
      // whole 4 KB pages around the view: the neighbouring views and elements
      // a printout reads next come from the same copy
      constexpr int64_t kPage = 4096;
      const int64_t plo = lo / kPage * kPage, phi = std::min(st->nbytes, (hi + kPage - 1) / kPage * kPage);
      auto bytes = std::make_shared<std::string>(phi - plo, '\0');
      if (plo % es == 0 && st->buf->RawToHost(bytes->data(), plo, phi - plo)) {
        GetMetrics().d2h_bytes += phi - plo;
        from(bytes->data(), plo, phi - plo);
        AddHostRange(*st, plo, std::move(bytes));
        return st->buf->seq;
      }
    }
    if (!whole && st->nbytes <= kHostViewBytes) {  // the whole storage (a host copy if small)
      at::Tensor host = at::empty({st->numel}, src.options().device(c10::kCPU));
      GetMetrics().d2h_bytes += st->nbytes;
      st->buf->ToHost(host.data_ptr(), st->nbytes);
      SetHostMirror(*st, host.data_ptr(), st->nbytes);
      from(static_cast<const char*>(host.data_ptr()), 0, st->nbytes);
      return st->buf->seq;
    }
  }
  if (r.empty() && st->buf && st->et == et && src.storage_offset() == 0 && src.is_contiguous() &&
      st->numel == src.numel()) {
    buf = st->buf;
  } else {
    Value v = r.Read(src);
    if (et == ET::PRED) v = r.b().Convert(v, ET::U8);
    r.AddResult(r.b().Reshape(v, {src.numel()}));
    auto extra = r.Flush(false, "host_read");
    buf = extra.back();
  }
  GetMetrics().d2h_bytes += nbytes;
  buf->ToHost(dst, nbytes);
  if (buf == st->buf) SetHostMirror(*st, dst, nbytes);
  return buf->seq;
}
}  // namespace

}  // namespace tt
