// Output metadata of tpu ops: what NativeKernel allocates before lowering.
// Sources, in order: the cache (per argument metadata, see MetaKey), C++
// rules (PyTorch's own C++ meta functions for the commonest ops, called
// directly, so a process's first ops never reach Python), per-op rules for
// ops whose PyTorch meta encodes another backend's limits, and PyTorch's meta
// kernels (mostly Python) as the fallback. Debug mode computes it uncached
// through PyTorch's meta kernels and checks the cached or C++ result against it.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <memory>
#include <string>
#include <vector>

#include "hlo/builder.h"

namespace tt {

struct OutSpec {
  int input = -1;  // index into the flattened tpu tensor inputs, or -1 for a new tensor
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype = c10::kFloat;
};
struct MetaRet {
  int kind = 0;  // 0 tensor, 1 tensor list, 2 other
  std::vector<OutSpec> tensors;
  c10::IValue other;
};
struct MetaResult {
  std::vector<MetaRet> rets;
};

// The cache key of op `name` called with `args`: tensor dtypes, sizes,
// strides and aliasing; Scalars by type (not value); other arguments by
// value. `flat` receives the distinct tpu tensor arguments in order.
void MetaKey(const c10::FunctionSchema& schema, const std::string& name, const std::vector<c10::IValue>& args,
             std::string& key, std::vector<at::Tensor>& flat);

// Output metadata for op with args (key and flat from MetaKey).
std::shared_ptr<MetaResult> OutputMeta(const c10::OperatorHandle& op, const std::string& name,
                                       const std::vector<c10::IValue>& args, const std::string& key,
                                       const std::vector<at::Tensor>& flat, bool debug);

// Debug mode: the lowering's values and the allocated outputs must match mr.
void DebugValidateOutputs(const std::string& name, const MetaResult& mr, const std::vector<at::Tensor>& outs,
                          size_t n_returned, const std::vector<hlo::Value>& vals);


}  // namespace tt
