// Index-bounds checks in every mode, and debug mode's checks.
//
// XLA clamps out-of-range gather/scatter indices silently. Debug mode checks
// the bounds before each indexing op and raises CPU PyTorch's error at the op.
// Strict and defer_and_fuse check them the way CUDA reports device-side
// asserts: the op's program also computes the min/max of each index argument
// (RecordBoundsCheck), and the next synchronization point (a read to the
// host, torch.tpu.synchronize(), a stream or event synchronize) raises CPU's
// error for the first op whose indices were out of range (RaisePendingChecks).
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/pjrt.h"

namespace tt {

class Region;
struct BoundsCheck;

// Strict / defer_and_fuse: records the bounds check of `schema`'s op (if it
// has index arguments) into region r, reading the arguments' current values,
// so call it before the op writes its outputs. Index tensors on the CPU
// (allowed for indexing) are checked at once. Returns the check to attach
// with Region::AddCheck once the op lowered successfully (null: none).
struct PendingCheckValue;
std::shared_ptr<PendingCheckValue> RecordBoundsCheck(Region& r, const c10::FunctionSchema& schema,
                                                     const std::vector<c10::IValue>& args);
// Attaches a recorded check to its region (after the op lowered).
void AttachBoundsCheck(Region& r, const std::shared_ptr<PendingCheckValue>& c);
// A launched program's check result (min/max pairs), read at the next sync.
void AddPendingCheck(pjrt::BufferPtr buf, std::shared_ptr<const BoundsCheck> what);
// Raises the error of the first pending check (in program order) whose
// indices were out of range, among those of the launches numbered up to
// `upto` (pjrt::Buffer::seq; waiting for them) and those already finished.
// kAllChecks: every pending check (a full synchronization).
constexpr int64_t kAllChecks = INT64_MAX;
void RaisePendingChecks(int64_t upto);
// Bytes of one check result (for replays that size their results).
int64_t BoundsCheckBytes(const BoundsCheck& c);

// NaN/Inf detection after each op (TORCHTPU_DEBUG_NANS=1 or
// torchtpu.set_mode("debug", check_nans=True)).
bool DebugNans();
void SetDebugNans(bool on);

// Raises IndexError/RuntimeError with CPU PyTorch's wording when an index
// argument of `schema`'s op is out of range (XLA would clamp silently). The
// min/max of each index tensor are computed on the device and read back.
void DebugBoundsCheck(const c10::FunctionSchema& schema, const std::vector<c10::IValue>& args);

// Debug-mode end of an op: optional NaN/Inf check of the float outputs, then
// a synchronous flush (device errors surface from the op's own call).
void DebugFinish(const std::string& name, const std::vector<at::Tensor>& outs);

}  // namespace tt
