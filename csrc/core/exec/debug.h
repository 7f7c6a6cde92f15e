// Debug-mode checks (torchtpu.set_mode("debug")): strict mode never calls these.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

namespace tt {

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
