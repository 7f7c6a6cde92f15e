// The generic tpu kernel of every op in the lowering registry (kernels.cpp).
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace tt {

// Runs the op's lowering (strict: its own program; defer_and_fuse: into the
// current region). A backend kernel registered elsewhere for an op that has a
// lowering (sparse.cpp) calls it for the cases the lowering covers;
// RegisterNativeKernels then leaves that op to it.
void NativeKernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);

}  // namespace tt
