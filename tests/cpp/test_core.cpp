// C++ unit tests for the torch-free core: StableHLO builder, view lowering
// and the PJRT runtime wrappers (run against the XLA CPU plugin).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "hlo/builder.h"
#include "hlo/views.h"
#include "ops/registry.h"
#include "runtime/pjrt.h"

using namespace tt;
using hlo::ET;
using hlo::Type;
using hlo::Value;

namespace {

pjrt::Client& CpuClient() {
  static pjrt::Client* c = [] {
    const pjrt::Api* api = pjrt::Api::Load(TT_CPU_PLUGIN);
    pjrt::CreateOption o;
    o.name = "cpu_device_count";
    o.kind = pjrt::CreateOption::kInt;
    o.i = 1;
    return new pjrt::Client(api, {o});
  }();
  return *c;
}

std::vector<float> RunF32(const std::string& text, const std::vector<std::vector<float>>& inputs,
                          const std::vector<std::vector<int64_t>>& dims, size_t out_numel) {
  auto& c = CpuClient();
  auto exe = c.Compile(text, pjrt::DefaultCompileOptions());
  std::vector<pjrt::BufferPtr> bufs;
  std::vector<PJRT_Buffer*> raw;
  for (size_t i = 0; i < inputs.size(); ++i) {
    bufs.push_back(c.FromHost(inputs[i].data(), PJRT_Buffer_Type_F32, dims[i], c.devices()[0],
                              inputs[i].size() * 4));
    raw.push_back(bufs.back()->get());
  }
  auto outs = exe->Execute(c.devices()[0], raw, {}, true);
  std::vector<float> r(out_numel);
  outs.at(0)->ToHost(r.data(), out_numel * 4);
  return r;
}

}  // namespace

TEST(Builder, TypeStrings) {
  EXPECT_EQ(Type(ET::F32, {2, 3}).str(), "tensor<2x3xf32>");
  EXPECT_EQ(Type(ET::PRED, {}).str(), "tensor<i1>");
  EXPECT_EQ(Type(ET::C64, {4}).str(), "tensor<4xcomplex<f32>>");
  EXPECT_EQ(Type(ET::BF16, {1}).str(), "tensor<1xbf16>");
  EXPECT_EQ(Type(ET::F32, {2, 3}).numel(), 6);
}

TEST(Builder, PrintsGenericOpsAndRegions) {
  hlo::Builder b;
  Value x = b.Arg(Type(ET::F32, {4}));
  Value s = b.Reduce(x, b.ScalarConst(ET::F32, 0), {0}, "add");
  std::string text = b.Finish({s});
  EXPECT_NE(text.find("func.func public @main(%arg0: tensor<4xf32>) -> (tensor<f32>)"), std::string::npos);
  EXPECT_NE(text.find("\"stablehlo.reduce\"(%arg0, %0)"), std::string::npos);
  EXPECT_NE(text.find("^bb0("), std::string::npos);
  EXPECT_NE(text.find("dimensions = array<i64: 0>"), std::string::npos);
  // Structural key: the same construction prints the same text.
  hlo::Builder b2;
  Value x2 = b2.Arg(Type(ET::F32, {4}));
  EXPECT_EQ(b2.Finish({b2.Reduce(x2, b2.ScalarConst(ET::F32, 0), {0}, "add")}), text);
}

TEST(Builder, SpecialFloatLiterals) {
  hlo::Builder b;
  b.ScalarConst(ET::F32, std::numeric_limits<double>::infinity());
  b.ScalarConst(ET::F32, -std::numeric_limits<double>::infinity());
  b.ScalarConst(ET::BF16, std::nan(""));
  EXPECT_NE(b.body().find("0x7F800000"), std::string::npos);
  EXPECT_NE(b.body().find("0xFF800000"), std::string::npos);
  EXPECT_NE(b.body().find("0x7FC0"), std::string::npos);
}

TEST(Runtime, CompilesAndRunsAdd) {
  hlo::Builder b;
  Value x = b.Arg(Type(ET::F32, {3}));
  Value y = b.Arg(Type(ET::F32, {3}));
  auto r = RunF32(b.Finish({b.Add(x, y)}), {{1, 2, 3}, {10, 20, 30}}, {{3}, {3}}, 3);
  EXPECT_EQ(r, (std::vector<float>{11, 22, 33}));
}

TEST(Runtime, PlatformAndAttributes) {
  auto& c = CpuClient();
  EXPECT_EQ(c.platform_name(), "cpu");
  EXPECT_EQ(c.devices().size(), 1u);
  EXPECT_EQ(c.api()->major(), PJRT_API_MAJOR);
}

TEST(Runtime, CompileErrorCarriesPluginMessage) {
  auto& c = CpuClient();
  try {
    c.Compile("module { this is not mlir }", pjrt::DefaultCompileOptions());
    FAIL() << "expected an error";
  } catch (const pjrt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("PJRT_Client_Compile"), std::string::npos);
    EXPECT_GT(std::string(e.what()).size(), 30u);
  }
}

TEST(Runtime, LoadMissingPluginThrows) {
  EXPECT_THROW(pjrt::Api::Load("/nonexistent/plugin.so"), pjrt::Error);
}

TEST(Runtime, DonationConsumesInput) {
  auto& c = CpuClient();
  hlo::Builder b;
  Value x = b.Arg(Type(ET::F32, {2}));
  b.SetArgAttr(0, "tf.aliasing_output = 0 : i32");
  auto exe = c.Compile(b.Finish({b.Mul(x, x)}), pjrt::DefaultCompileOptions());
  float in[2] = {3, 4};
  auto buf = c.FromHost(in, PJRT_Buffer_Type_F32, {2}, c.devices()[0], 8);
  auto outs = exe->Execute(c.devices()[0], {buf->get()}, {}, true);
  float out[2];
  outs[0]->ToHost(out, 8);
  EXPECT_EQ(out[0], 9);
  EXPECT_EQ(out[1], 16);
  EXPECT_TRUE(buf->IsDeleted());
}

// Views: compare ReadView/WriteView against a host reference for several layouts.
struct ViewCase {
  std::vector<int64_t> sizes, strides;
  int64_t offset;
};

class Views : public ::testing::TestWithParam<ViewCase> {};

TEST_P(Views, ReadAndWriteMatchReference) {
  const ViewCase& vc = GetParam();
  const int64_t S = 64;
  std::vector<float> base(S);
  std::iota(base.begin(), base.end(), 0.f);
  hlo::ViewSpec spec{vc.sizes, vc.strides, vc.offset};
  int64_t n = spec.numel();
  // reference read
  std::vector<float> ref(n);
  std::vector<int64_t> idx(vc.sizes.size(), 0);
  std::vector<int64_t> flat_index(n);
  for (int64_t k = 0; k < n; ++k) {
    int64_t off = vc.offset;
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * vc.strides[d];
    flat_index[k] = off;
    ref[k] = base[off];
    for (int d = (int)idx.size() - 1; d >= 0; --d) {
      if (++idx[d] < vc.sizes[d]) break;
      idx[d] = 0;
    }
  }
  {
    hlo::Builder b;
    Value x = b.Arg(Type(ET::F32, {S}));
    Value v = hlo::ReadView(b, x, spec);
    auto got = RunF32(b.Finish({b.Reshape(v, {n})}), {base}, {{S}}, n);
    EXPECT_EQ(got, ref);
  }
  {
    // write -(k+1) through the view; later elements win on overlap
    std::vector<float> upd(n);
    for (int64_t k = 0; k < n; ++k) upd[k] = -(float)(k + 1);
    std::vector<float> expect = base;
    for (int64_t k = 0; k < n; ++k) expect[flat_index[k]] = upd[k];
    hlo::Builder b;
    Value x = b.Arg(Type(ET::F32, {S}));
    Value u = b.Arg(Type(ET::F32, {n}));
    Value w = hlo::WriteView(b, x, b.Reshape(u, vc.sizes), spec);
    auto got = RunF32(b.Finish({w}), {base, upd}, {{S}, {n}}, S);
    bool has_zero_stride = false;
    for (size_t d = 0; d < vc.sizes.size(); ++d) has_zero_stride |= vc.strides[d] == 0 && vc.sizes[d] > 1;
    if (!has_zero_stride) EXPECT_EQ(got, expect);
  }
}

static std::string ViewName(const ::testing::TestParamInfo<ViewCase>& info) {
  static const char* names[] = {"contiguous", "transpose", "strided_offset", "permuted", "step",
                                "overlapping", "expanded", "odd_strides", "scalar"};
  return names[info.index];
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Views,
    ::testing::Values(ViewCase{{4, 8}, {8, 1}, 0},      // contiguous
                      ViewCase{{8, 4}, {1, 8}, 0},      // transpose
                      ViewCase{{3, 4}, {8, 2}, 1},      // strided slice with offset
                      ViewCase{{2, 3, 4}, {1, 16, 4}, 2},  // permuted
                      ViewCase{{5}, {3}, 4},            // step slice
                      ViewCase{{4, 3}, {2, 1}, 0},      // overlapping windows (unfold)
                      ViewCase{{3, 4}, {0, 1}, 5},      // expanded
                      ViewCase{{2, 1, 3}, {20, 7, 5}, 1},
                      ViewCase{{}, {}, 9}),             // scalar
    ViewName);

TEST(Views, FlatBitcastRoundTrip) {
  hlo::Builder b;
  Value x = b.Arg(Type(ET::F32, {4}));
  Value bytes = hlo::FlatBitcast(b, x, ET::U8);
  Value back = hlo::FlatBitcast(b, bytes, ET::F32);
  auto r = RunF32(b.Finish({back}), {{1.5f, -2.f, 3.25f, 0.f}}, {{4}}, 4);
  EXPECT_EQ(r, (std::vector<float>{1.5f, -2.f, 3.25f, 0.f}));
}

TEST(Registry, HasCoreLowerings) {
  EXPECT_NE(ops::Find("aten::add.Tensor"), nullptr);
  EXPECT_NE(ops::Find("aten::mm"), nullptr);
  EXPECT_EQ(ops::Find("aten::definitely_not_an_op"), nullptr);
}

TEST(Registry, OneLoweringPerOp) {
  std::string dups;
  for (auto& d : ops::DuplicateLowerings()) dups += d + " ";
  EXPECT_TRUE(ops::DuplicateLowerings().empty()) << "registered twice: " << dups;
}
