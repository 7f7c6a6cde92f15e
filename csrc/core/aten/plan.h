// Strict mode's op plans: the second call of an op with the same argument
// metadata replays what the first call produced (output metadata, the
// compiled executable, where each program argument comes from, which
// storages its results rebind) with no lowering, no program text and no
// executable lookup.
//
// A plan is keyed by the op's output-metadata key (op, tensor dtypes, sizes,
// strides, aliasing; Scalars by type; other arguments by value) plus each
// tensor's storage state (offset, size, buffer type and length, whether the
// buffer may be donated, which tensors share a storage). Values the lowering
// baked into the program (a Scalar it read, e.g. alpha == 1) are checked
// before a replay; other Scalars are program arguments and take the call's
// value, so a new learning rate never re-lowers.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <memory>
#include <string>
#include <vector>

#include "ops/registry.h"
#include "core/exec/executor.h"
#include "meta.h"

namespace tt {

// Where a 0-d program argument's value comes from.
struct ScalarSource {
  int arg = -1;   // schema argument index; -1: computed by the lowering (a constant)
  int elem = -1;  // element of a Scalar[] argument, else -1
  hlo::ET et = hlo::ET::F32;
};



// Collects, while an op lowers for the first time, what a plan needs.
class PlanRecorder {
 public:
  // Whether this call may record a plan (strict mode, nothing pending).
  bool active = false;
  // A 0-d program argument (Value v, from Region::Scalar) and its source.
  void Scalar(const hlo::Value& v, const ScalarSource& src) { scalars_.push_back({v.id, src}); }
  // Builds and stores the plan after a successful flush recorded in rec.
  void Finish(const std::string& key, const std::shared_ptr<MetaResult>& mr, const Region::Record& rec,
              const std::vector<c10::IValue>& args, const std::vector<ops::Arg>& lowered,
              const std::vector<at::Tensor>& flat_inputs, const std::vector<at::Tensor>& outs);

 private:
  std::vector<std::pair<int, ScalarSource>> scalars_;
};

// Appends the storage part of a plan key to the output-metadata key `key`.
void PlanKey(const std::vector<at::Tensor>& flat_inputs, std::string& key);

// Replays the plan stored for key, if one matches args: pushes the op's
// results onto stack (after dropping its arguments) and returns true.
bool ReplayPlan(const std::string& key, const c10::FunctionSchema& schema, const std::string& name,
                const std::vector<c10::IValue>& args, const std::vector<at::Tensor>& flat_inputs,
                torch::jit::Stack* stack);

// Whether strict mode uses op plans (TORCHTPU_OP_PLANS=0 turns them off).
bool PlansEnabled();
bool SetPlansEnabled(bool on);  // returns the previous setting

// Drops every plan (the executable caches were cleared).
void ClearPlans();

}  // namespace tt
