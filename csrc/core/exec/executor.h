// The executor: ops are recorded into a Region (one StableHLO function under
// construction); a flush compiles (cached) and runs it, then rebinds the
// storages it wrote. Strict mode flushes after every op (asynchronously),
// debug mode flushes and waits; defer_and_fuse keeps recording.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "hlo/builder.h"
#include "hlo/views.h"
#include "runtime/runtime.h"
#include "core/device/storage.h"

namespace tt {

// What an op's asynchronous index-bounds check result means (debug.h).
struct BoundsCheck;

enum class Mode { Strict = 0, Debug = 1, DeferAndFuse = 2 };
Mode GetMode();
void SetMode(Mode m);          // flushes pending work
void SetThreadMode(int m);     // -1 = follow the global mode
// Scoped thread mode (torchtpu.mode): propagated to autograd's threads.
void PushThreadMode(int m);
void PopThreadMode();
int GetThreadMode();

// Launches queued behind compiles (see LaunchQueue in executor.cpp).
bool LaunchesQueued();
// Waits until every queued launch has been made; throws the first error a
// queued launch met since the last drain (asynchronous errors, as CUDA's).
void DrainLaunches();
// References to buf held by the program's own values (storages, recorded
// arguments), not by queued launches.
inline long OwnRefs(const pjrt::BufferPtr& buf) {
  long n = buf.use_count();  // before queued_refs (the launch queue drops its ref after)
  return n - buf->queued_refs.load();
}

hlo::ET ToET(c10::ScalarType t);
c10::ScalarType ToScalarType(hlo::ET t);
PJRT_Buffer_Type ToPjrt(hlo::ET t);

// Strict mode's host tier (see kernels.cpp): host copies of small storages.
// Largest storage kept whole as a host copy.
constexpr int64_t kMirrorBytes = 256 << 10;
// The bytes of st's buffer if a valid host copy exists, else nullptr.
const std::string* HostMirror(const StorageState& st);
// Keeps a host copy of st's current buffer (small storages only).
void SetHostMirror(StorageState& st, const void* data, int64_t nbytes);
void SetHostMirror(StorageState& st, std::shared_ptr<const std::string> bytes);
// The host copy of bytes [lo, hi) of st's current buffer if a valid host copy
// (whole or partial) covers them, else nullptr.
const char* HostBytes(const StorageState& st, int64_t lo, int64_t hi);
// Whether bytes [lo, hi) of st's current buffer are on the host, or as good
// as: a small range of a large buffer already computed, which ReadToHost
// fetches with one small raw transfer, without waiting (printing's slices).
bool HostReadable(const StorageState& st, int64_t lo, int64_t hi);
// Bytes [lo, hi) of t's storage that t's elements lie in (lo == hi if empty).
void ViewByteRange(const at::Tensor& t, int64_t& lo, int64_t& hi);
// Largest input (elements) an op may have to run in strict mode's host tier:
// below ATen's parallel grain size, so the CPU kernel runs on this thread
// (whose float environment HostTierFloatEnv sets).
constexpr int64_t kHostTierMaxElements = 1 << 15;
// True while this thread runs an op in the host tier: its uploads keep a host copy.
bool& InHostTier();
// While alive: this thread runs host-tier work (InHostTier(), and the device's
// treatment of subnormals; see HostTierFloatEnv).
class HostTierScope {
 public:
  HostTierScope() : prev_(InHostTier()) { InHostTier() = true; }
  ~HostTierScope() { InHostTier() = prev_; }
  HostTierScope(const HostTierScope&) = delete;
  HostTierScope& operator=(const HostTierScope&) = delete;
 private:
  HostTierFloatEnv fenv_;
  bool prev_;
};

// torchtpu.aot: the text of every program flushed while capturing (plans and
// compiled-graph plans are bypassed meanwhile, so each program is built).
void StartProgramCapture();
std::vector<std::string> StopProgramCapture();
bool CapturingPrograms();

class Region {
 public:
  static Region& Current();  // the process-wide region (guarded by Lock())
  static std::recursive_mutex& Lock();
  hlo::Builder& b() { return *b_; }
  // torch.get_float32_matmul_precision() now, as the builder's float32
  // dot/convolution precision for the next lowering; its key letter ('h'
  // highest, 'H' high, 'm' medium) goes into op-plan and graph-plan keys
  // (the program text carries the attribute, so the executable caches key
  // on it already).
  static char MatmulPrecisionKey();
  void FollowMatmulPrecision() { ApplyMatmulPrecision(*b_); }
  // Sets b's float32 dot precision from torch.get_float32_matmul_precision().
  static void ApplyMatmulPrecision(hlo::Builder& b);

  // Logical value of a tpu tensor (its view of the storage).
  hlo::Value Read(const at::Tensor& t);
  // Writes v (t's shape, any dtype: converted) through t's view.
  void Write(const at::Tensor& t, hlo::Value v);
  // A 0-d program argument holding s as element type et.
  hlo::Value Scalar(const c10::Scalar& s, hlo::ET et);
  // A program argument bound to an existing device buffer.
  hlo::Value BufferArg(const pjrt::BufferPtr& buf, const hlo::Type& t);
  // u64[2] key for a random op (seed, offset) from the tpu generator.
  hlo::Value RngKey(const c10::optional<at::Generator>& gen, int64_t numel);
  // Extra program results that are not storages (host reads of views).
  int AddResult(hlo::Value v);
  // An op's index-bounds check result (an S64 vector of min/max pairs): not
  // returned by Flush, but handed to the pending checks read at the next
  // synchronization (debug.h, RaisePendingChecks).
  void AddCheck(hlo::Value v, std::shared_ptr<const BoundsCheck> what);

  // Compiles and runs what was recorded. Returns the extra results.
  std::vector<pjrt::BufferPtr> Flush(bool wait = false, const char* reason = "explicit");
  // Called after each recorded op with a structural signature; applies the
  // mode's flush policy (strict: flush now; debug: flush and wait;
  // defer_and_fuse: flush at detected loop boundaries or the size threshold).
  void AfterOp(uint64_t signature);
  // Called before an op records: performs a loop-boundary cut that AfterOp
  // left pending. The cut waits for the next iteration's first op so that
  // temporaries the finished iteration's Python frames still held (the
  // optimizer's intermediate lists) are dead by then and never materialized.
  void BeginOp() {
    op_scalars_.clear();
    if (cut_pending_) {
      const char* reason = cut_pending_;
      cut_pending_ = nullptr;
      if (!empty()) Flush(false, reason);
    }
  }
  bool empty() const { return ops_ == 0 && extra_.empty() && check_vals_.empty(); }
  // Nothing recorded at all, not even an argument (op plans start only then).
  bool pristine() const { return empty() && args_.empty() && slots_.empty(); }
  uint64_t epoch() const { return epoch_; }
  void CountOp() { ops_++; }
  // Discards the recording (after an error while lowering).
  void Abandon();
  // After an error while lowering one op: the region's earlier ops (a
  // defer_and_fuse region) still run, flushed now, unless the failed op had
  // begun writing its outputs; the failed op's partial recording is dropped.
  void Recover(bool op_was_writing);

  // Where each argument and result of a flushed program came from, so that a
  // caller that lowers the same structure again and again (a compiled graph)
  // can replay the executable with new buffers instead of lowering again.
  struct Record {
    struct Arg {
      const StorageState* st = nullptr;  // the initial buffer of this storage
      pjrt::BufferPtr constant;           // a fixed buffer (a scalar constant)
      int64_t rng_numel = -1;             // a fresh generator key for this many elements
      int scalar_input = -1;              // the value of ScalarInput(.., index)
    };
    struct Target {
      const StorageState* st;
      hlo::ET et;
      int64_t numel;
    };
    Runtime::ExeFuture exe;  // possibly still compiling
    std::vector<Arg> args;
    std::vector<Target> targets;  // storage results, in result order
    std::vector<int> donated;     // argument indices donated to results
    size_t num_extra = 0;
    // bounds-check results, after the extra results (see AddCheck)
    std::vector<std::shared_ptr<const BoundsCheck>> checks;
  };
  // The next Flush fills *rec (nullptr: stop recording).
  void RecordNextFlush(Record* rec) { rec_ = rec; }
  // A 0-d argument that is never shared with another argument (its value may
  // change from call to call of a replayed program).
  hlo::Value ScalarInput(const c10::Scalar& s, hlo::ET et, int index);
  // Uploads the u64[2] key for a random op (replay of an Arg::rng_numel).
  static pjrt::BufferPtr RngKeyBuffer(const c10::optional<at::Generator>& gen, int64_t numel);
  static pjrt::BufferPtr ScalarBuffer(const c10::Scalar& s, hlo::ET et);
  // (type, bits) of s as element type et: the key of its cached device buffer.
  static std::string ScalarKeyOf(const c10::Scalar& s, hlo::ET et);
  // The cached one-element device buffer of a ScalarKeyOf key.
  static pjrt::BufferPtr KeyedScalarBuffer(const std::string& key, hlo::ET et);
  // Runs an executable on raw arguments (asynchronous unless wait), counting
  // it. An executable still compiling, or any launch while one is queued,
  // goes through the launch queue: the results are pending buffers of
  // out_nbytes bytes each (see LaunchQueue in executor.cpp).
  static std::vector<pjrt::BufferPtr> Launch(const Runtime::ExeFuture& exe,
                                             const std::vector<pjrt::BufferPtr>& args, bool wait,
                                             const std::vector<int64_t>& out_nbytes);

 private:
  Region();
  struct Slot {
    std::weak_ptr<StorageState> st;
    hlo::Value v;
    bool written = false;
    int arg = -1;  // argument index holding its initial buffer
    // The last view read of (or written whole to) `v`: reading the same view
    // of the same value again reuses it instead of emitting the reshape or
    // slice a second time (a weight read in forward and backward).
    hlo::Value read_src, read_view;
    hlo::ET read_et = hlo::ET::F32;
    hlo::ViewSpec read_spec;
    bool read_valid = false;
  };
  // `t`'s view of slot `si` when the slot's read cache holds it.
  bool CachedRead(const Slot& s, hlo::ET et, const hlo::ViewSpec& spec, hlo::Value* out) const;
  static void RememberRead(Slot& s, hlo::ET et, const hlo::ViewSpec& spec, const hlo::Value& view);
  int SlotFor(const StatePtr& st, hlo::ET want);
  void Reset();

  std::unique_ptr<hlo::Builder> b_;
  std::vector<pjrt::BufferPtr> args_;
  std::vector<Record::Arg> arg_src_;  // parallel to args_
  Record* rec_ = nullptr;
  // A new program argument bound to buf (BufferArg: one per buffer).
  hlo::Value NewBufferArg(const pjrt::BufferPtr& buf, const hlo::Type& t);
  std::unordered_map<const pjrt::Buffer*, hlo::Value> buf_args_;
  // This op's scalar arguments by (type, value): equal values share one
  // argument within an op, never across ops, so that values coinciding by
  // chance (a bias correction reaching 1.0) cannot change a region's
  // structure and recompile it.
  std::unordered_map<std::string, hlo::Value> op_scalars_;
  std::vector<Slot> slots_;
  std::vector<hlo::Value> extra_;
  std::vector<hlo::Value> check_vals_;
  std::vector<std::shared_ptr<const BoundsCheck>> check_what_;
  uint64_t epoch_ = 0;
  int ops_ = 0;
  // defer_and_fuse loop detection (see AfterOp)
  std::vector<uint64_t> sigs_;
  // Where a repetition is looked for: from each anchor (an index into sigs_),
  // candidate periods p (the anchor's signature seen again p ops later),
  // checked once 2p ops followed the anchor. The first anchor is the first op;
  // each later one is that op's signature seen again, at least twice as far
  // in (at most log2 of the ops anchors), so a loop whose first iteration
  // differs (an optimizer creating its state, a warm-up step) is found from
  // the second iteration's start (issue 39: a loop that never read the host
  // was left to the size threshold, regions at shifting phases, each a new
  // compile).
  struct Anchor {
    size_t start;
    std::vector<size_t> candidates;
  };
  std::vector<Anchor> anchors_;
  void ResetDetection() {
    sigs_.clear();
    anchors_.clear();
  }
  size_t period_ = 0;       // detected iteration length in ops (0 = none)
  size_t period_pos_ = 0;   // ops since the last periodic flush
  size_t period_chunk_ = 0; // cut also every this many ops inside a period (0: no)
  std::vector<uint64_t> period_sigs_;
  // The op sequence of the last region a host read or sync ended, and a loop
  // body seen twice that way (a loop reading the loss every step): a later
  // sequence starting with that body is cut after it at once, with no
  // two-iteration detection region and its extra compile.
  std::vector<uint64_t> last_sigs_, known_loop_;
  // A detected loop running whole iterations (no host read in them) whose
  // iteration boundary a host read met: followed again at once after it.
  std::vector<uint64_t> overlap_loop_;
  size_t overlap_period_ = 0;
  const char* cut_pending_ = nullptr;  // the reason of a cut at the next op
};

struct DeferStats {
  std::map<std::string, int64_t> flush_reasons;
  int64_t flushes = 0, ops_flushed = 0, programs = 0, periods_detected = 0;
};
DeferStats& GetDeferStats();
int64_t DeferThreshold();
// Sets the ops per part of an iteration of a loop that syncs every iteration
// (0: no parts; initially TORCHTPU_DEFER_CHUNK_OPS, else 48); returns the old value.
int64_t SetDeferChunkOps(int64_t n);

// What an input's storage contributes to the structure of a program that
// reads t (a compiled graph's or a replayed op's): the view offset, the
// storage's byte size, its buffer's element type and length, whether the
// buffer may be donated (only the storage holds it), and which of the
// `n_earlier` earlier inputs shares its storage or buffer (those share one
// program argument; null entries are not tensors). Appended to key.
void AppendStorageKey(std::string& key, const at::Tensor& t, const StatePtr& st, const StatePtr* earlier,
                      size_t n_earlier);

// Materialized contiguous copy of a tpu tensor into host memory `dst`.
void ReadToHost(const at::Tensor& src, void* dst);
// torch.tpu.set_sync_debug_mode: 0 nothing, 1 warn, 2 raise at each read of
// device memory to the host (.item(), .cpu(), printing), as CUDA does.
std::atomic<int>& SyncDebugMode();

}  // namespace tt
