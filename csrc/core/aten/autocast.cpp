// Autocast (AMP) policies for the tpu device: the AutocastPrivateUse1 key
// gets the same cast policies as CUDA (lower_precision_fp for matmuls and
// convolutions, fp32 for numerically sensitive ops, promote for mixed-input
// ops); every other op falls through.
#include <ATen/Operators.h>
#include <ATen/autocast_mode.h>
#include <torch/library.h>

// The policy tables name unqualified ATen types (Tensor, ScalarType, ...), so
// they are expanded inside at::autocast as PyTorch does.
namespace at::autocast {
namespace {

Tensor tt_binary_cross_entropy_banned(const Tensor&, const Tensor&, const std::optional<Tensor>&,
                                      int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
              "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
              "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
              "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
              "safe to autocast.");
}

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define TT_KERNEL_LOW_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(TT_KERNEL_LOW_PRECISION_FP)
#undef TT_KERNEL_LOW_PRECISION_FP

#define TT_KERNEL_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(TT_KERNEL_FP32)
#undef TT_KERNEL_FP32

#define TT_KERNEL_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(TT_KERNEL_FP32_SET_OPT_DTYPE)
#undef TT_KERNEL_FP32_SET_OPT_DTYPE

  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)

#define TT_KERNEL_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(TT_KERNEL_PROMOTE)
#undef TT_KERNEL_PROMOTE

  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"),
         TORCH_FN((&tt_binary_cross_entropy_banned)));
}

}  // namespace
}  // namespace at::autocast
