// Matrix products: mm, bmm, addmm, baddbmm, addbmm, addmv, matmul, dot, vdot,
// _addmm_activation. f16/bf16 products accumulate in f32 and round once
// (operands stay narrow: dot_general with an f32 result type). einsum,
// tensordot, outer, linear, addr decompose above us into these.
#include <cmath>

#include "registry.h"
#include "sort_util.h"

namespace tt::ops {
namespace {

std::vector<Value> Mm(LowerCtx& c) {
  return {Matmul(c.b, c.t(0), c.t(1), c.out().et)};
}
TT_LOWERINGS(({"aten::mm", "aten::mm.out", "aten::bmm", "aten::bmm.out", "aten::matmul",
               "aten::matmul.out", "aten::dot", "aten::dot.out", "aten::mv", "aten::mv.out"}), Mm);

// vdot: conj(self) . other
std::vector<Value> Vdot(LowerCtx& c) {
  Builder& b = c.b;
  ET et = c.out().et;
  Value x = Cast(b, c.t(0), et);
  if (hlo::IsComplex(et)) {
    Type pt = x.type.with_et(hlo::ComplexPart(et));
    Value re = b.Op1("stablehlo.real", {x}, pt), im = b.Op1("stablehlo.imag", {x}, pt);
    x = b.Op1("stablehlo.complex", {re, b.Unary("negate", im)}, x.type);
  }
  return {Matmul(b, x, c.t(1), et)};
}
TT_LOWERINGS(({"aten::vdot", "aten::vdot.out"}), Vdot);

// beta * self + alpha * p, in the compute type; beta = 0 ignores self (even NaN)
Value AddScaled(LowerCtx& c, Value p, ET ct) {
  Builder& b = c.b;
  const Dims& d = p.dims();
  if (c.has(4) && c.arg(4).kind == Arg::Scalar && c.arg(4).hint() != 1.0)
    p = b.Mul(p, Bcast(b, c.t(4), d, ct));
  if (c.has(3) && c.arg(3).kind == Arg::Scalar) {
    if (c.arg(3).hint() == 0.0) return p;
    Value s = Bcast(b, c.t(0), d, ct);
    if (c.arg(3).hint() != 1.0) s = b.Mul(s, Bcast(b, c.t(3), d, ct));
    return b.Add(s, p);
  }
  return b.Add(Bcast(b, c.t(0), d, ct), p);
}

std::vector<Value> Addmm(LowerCtx& c) {
  ET et = c.out().et;
  ET ct = ComputeType(et);
  Value p = Matmul(c.b, c.t(1), c.t(2), et, /*wide=*/true);
  return {Cast(c.b, AddScaled(c, p, ct), et)};
}
TT_LOWERINGS(({"aten::addmm", "aten::addmm_", "aten::addmm.out", "aten::baddbmm", "aten::baddbmm_",
               "aten::baddbmm.out", "aten::addmv", "aten::addmv_", "aten::addmv.out"}), Addmm);

// addbmm: beta * self + alpha * sum_b (batch1[b] @ batch2[b])
std::vector<Value> Addbmm(LowerCtx& c) {
  Builder& b = c.b;
  ET et = c.out().et;
  ET ct = ComputeType(et);
  Value b1 = Cast(b, c.t(1), et), b2 = Cast(b, c.t(2), et);
  const Dims& d1 = b1.dims();
  const Dims& d2 = b2.dims();
  // contract over the batch and k dims at once
  Value p = b.DotGeneral(b1, b2, {}, {}, {0, 2}, {0, 1}, Type(ct, {d1[1], d2[2]}));
  return {Cast(b, AddScaled(c, p, ct), et)};
}
TT_LOWERINGS(({"aten::addbmm", "aten::addbmm_", "aten::addbmm.out"}), Addbmm);

// addmm followed by relu or gelu
std::vector<Value> AddmmActivation(LowerCtx& c) {
  Builder& b = c.b;
  ET et = c.out().et;
  ET ct = ComputeType(et);
  Value y = AddScaled(c, Matmul(b, c.t(1), c.t(2), et, true), ct);
  bool gelu = c.flag(5);
  if (gelu) {  // CPU applies the exact (erf) gelu
    Value x = y;
    auto S = [&](double v) { return b.Splat(x.type, v); };
    Value erf = b.Op1("chlo.erf", {b.Mul(x, S(0.70710678118654752440))}, x.type);
    y = b.Mul(b.Mul(x, S(0.5)), b.Add(S(1), erf));
  } else {
    y = b.Max(y, b.Zeros(y.type));
  }
  return {Cast(b, y, et)};
}
TT_LOWERINGS(({"aten::_addmm_activation", "aten::_addmm_activation.out"}), AddmmActivation);

}  // namespace
}  // namespace tt::ops

namespace tt::ops {
namespace {

// torch._grouped_mm: products of groups cut by offs (cumulative group ends,
// int32), in every float dtype, f16/bf16 accumulating in f32.
//   2D x 3D: rows of a in group g times b[g]          -> (M, N)
//   3D x 2D: a[:, :, ...] times columns of b in group g -> (M, N)
//   2D x 2D: a[:, K in g] @ b[K in g, :] for each g    -> (G, M, N)
//   3D x 3D: bmm (no offs)                             -> (G, M, N)
// Rows (columns, K) past offs[-1] give 0.
//
// Two lowerings, the cheaper by work for the shapes (both exact):
// * dense: every group's product, then a one-hot select of each row's group:
//   G times the work of the product itself. Cheapest for few groups or few rows
//   (decode steps of a served MoE).
// * tiled (2D x 3D and 2D x 2D, the forms of an MoE layer's forward and both its
//   gradients): the grouped positions are cut into tiles of T that never cross a
//   group (a group of n positions takes ceil(n / T) tiles; at most M / T + G
//   tiles in all, a static count), each tile is one batched product against its
//   group's weight, and each position reads its result back from its tile. Work
//   ~ (M + G * T) / M of the product itself, for T about M / G: ~2x instead of Gx
//   (torchtitan's debug MoE, 64 experts: 32x less).
//   On the XLA CPU plugin (Builder::cpu_target) the same tiles run as a loop, one
//   product per tile against a slice of its group's weight: the batched form's
//   per-tile weight gather (G + M/T copies of K x N) costs more there than the
//   products (10x at the debug MoE's shapes).
namespace {

// (n): how many of `ends` (G, s64, non-decreasing) are <= each position 0..n-1: the group of
// each position (G past the last end).
Value GroupOf(Builder& b, Value ends, int64_t n) {
  const int64_t g = ends.dims()[0];
  const Type ng(ET::S64, {n, g});
  return SumDims(b, Cast(b, b.Compare(b.Broadcast(ends, {n, g}, {1}), b.Iota(ng, 0), "LE"), ET::S64), {1}, false,
                 ET::S64);
}

struct Tiles {
  int64_t t = 0, n = 0;  // tile size, tile count (static)
  Value starts, tbegin;  // (G) s64: each group's first position, its first tile
  Value group;           // (n) s64: each tile's group, clamped to [0, G)
  Value valid_pos;       // (n, t) pred: the tile position holds a grouped position
  Value pos;             // (n, t) s64: that position, clamped to [0, M)
  Value first;           // (n) s64: each tile's first position (past M for unused tiles)
  Value count;           // () s64: the tiles in use (the others follow them)
};

// The tile schedule of M positions in groups ending at offs (G, s64).
Tiles TileSchedule(Builder& b, Value offs, int64_t m, int64_t t) {
  const int64_t g = offs.dims()[0];
  const Type gs(ET::S64, {g});
  Tiles r;
  r.t = t;
  r.n = (m + t - 1) / t + g;
  r.starts = b.Concat({b.Zeros(Type(ET::S64, {1})), b.SliceDim(offs, 0, 0, g - 1)}, 0);
  Value sizes = b.Max(b.Sub(offs, r.starts), b.Zeros(gs));
  Value ntile = b.Div(b.Add(sizes, b.Splat(gs, double(t - 1))), b.Splat(gs, double(t)));
  Value tend = PrefixSum(b, ntile, 0);  // (G) cumulative tile ends
  r.tbegin = b.Sub(tend, ntile);
  Value gj = GroupOf(b, tend, r.n);  // (n): the group of tile j (G past the last tile)
  Value tile_ok = b.Compare(gj, b.Splat(gj.type, double(g)), "LT");
  r.group = b.Min(gj, b.Splat(gj.type, double(g - 1)));
  Value first = b.Add(RowGather(b, r.starts, r.group),
                      b.Mul(b.Sub(b.Iota(gj.type, 0), RowGather(b, r.tbegin, r.group)), b.Splat(gj.type, double(t))));
  r.first = first;
  r.count = b.Reshape(b.SliceDim(tend, 0, g - 1, g), {});
  const Type nt(ET::S64, {r.n, t});
  Value p = b.Add(b.Broadcast(first, {r.n, t}, {0}), b.Iota(nt, 1));
  Value end = b.Broadcast(RowGather(b, offs, r.group), {r.n, t}, {0});
  r.valid_pos = b.Binary("and", b.Broadcast(tile_ok, {r.n, t}, {0}), b.Compare(p, end, "LT"));
  r.pos = b.Min(p, b.Splat(nt, double(m - 1)));
  return r;
}

// For each position 0..m-1 its index into the flattened (n * t) tiles and whether it is grouped.
std::pair<Value, Value> TileOfPosition(Builder& b, const Tiles& tl, Value offs, int64_t m) {
  const int64_t g = offs.dims()[0];
  Value gm = GroupOf(b, offs, m);
  Value grouped = b.Compare(gm, b.Splat(gm.type, double(g)), "LT");
  Value gc = b.Min(gm, b.Splat(gm.type, double(g - 1)));
  Value rel = b.Sub(b.Iota(gm.type, 0), RowGather(b, tl.starts, gc));
  Value ts = b.Splat(rel.type, double(tl.t));
  Value flat = b.Add(b.Mul(b.Add(RowGather(b, tl.tbegin, gc), b.Div(rel, ts)), ts), b.Binary("remainder", rel, ts));
  return {flat, grouped};
}

// Tile size for m positions in g groups: about m / g, a power of two in [8, 256].
int64_t TileSize(int64_t m, int64_t g) {
  int64_t t = 8;
  while (t < 256 && t * g < m) t *= 2;
  return t;
}

// v[i] of a 1-D vector at a 0-d s64 index, as a 0-d value.
Value At(Builder& b, Value v, Value i) { return b.Reshape(b.DynamicSlice(v, {i}, {1}), {}); }

// A loop over the tiles in use: state (tile index, acc); body(j, acc) -> acc.
Value ForTiles(Builder& b, const Tiles& tl, Value acc, const std::function<Value(Builder&, Value, Value)>& body) {
  const Type s64(ET::S64, {});
  hlo::Region cond, step;
  cond.arg_types = {s64, acc.type};
  cond.body = [&](Builder& b, const std::vector<Value>& a) {
    return std::vector<Value>{b.Compare(a[0], tl.count, "LT")};
  };
  step.arg_types = cond.arg_types;
  step.body = [&](Builder& b, const std::vector<Value>& a) {
    return std::vector<Value>{b.Add(a[0], b.Splat(s64, 1.0)), body(b, a[0], a[1])};
  };
  return b.Op("stablehlo.while", {b.Zeros(s64), acc}, {s64, acc.type}, "", {cond, step})[1];
}

// 2D x 3D as a loop over tiles (the CPU plugin): x (M, K), w (G, K, N) -> (M, N) in ct. Tiles
// run in position order; a group's last tile also writes past the group's end, rows that a later
// tile (or the final mask of rows past offs[-1]) overwrites.
Value GroupedRowsLoop(Builder& b, Value x, Value w, Value offs, ET in, ET ct) {
  const int64_t m = x.dims()[0], k = x.dims()[1], n = w.dims()[2], g = offs.dims()[0];
  const int64_t t = TileSize(m, g);
  Tiles tl = TileSchedule(b, offs, m, t);
  Value zero = b.Zeros(Type(ET::S64, {}));
  // the operands are widened to ct once (exact): XLA:CPU then slices each tile's weight without
  // a copy (a bf16 weight's tiles were converted one by one: 2x slower)
  Value xp = Cast(b, b.Pad(Cast(b, x, in), b.Zeros(Type(in, {})), {0, 0}, {t, 0}, {0, 0}), ct);  // (M + T, K)
  Value wi = Cast(b, Cast(b, w, in), ct);
  Value out = ForTiles(b, tl, b.Zeros(Type(ct, {m + t, n})), [&](Builder& b, Value j, Value acc) {
    Value first = At(b, tl.first, j), grp = At(b, tl.group, j);
    Value xs = b.DynamicSlice(xp, {first, zero}, {t, k});
    Value ws = b.Reshape(b.DynamicSlice(wi, {grp, zero, zero}, {1, k, n}), {k, n});
    return b.DynamicUpdateSlice(acc, b.DotGeneral(xs, ws, {}, {}, {1}, {0}, Type(ct, {t, n})), {first, zero});
  });
  Value y = b.SliceDim(out, 0, 0, m);
  Value grouped = b.Compare(GroupOf(b, offs, m), b.Splat(Type(ET::S64, {m}), double(g)), "LT");
  return b.Select(b.Broadcast(grouped, {m, n}, {0}), y, b.Zeros(y.type));
}

// 2D x 2D, K grouped, as a loop over tiles (the CPU plugin): x (M, K), w (K, N) -> (G, M, N) in
// ct; each tile's product is added to its group's slice, positions past the group's end masked.
Value GroupedKLoop(Builder& b, Value x, Value w, Value offs, ET in, ET ct) {
  const int64_t m = x.dims()[0], k = x.dims()[1], n = w.dims()[1], g = offs.dims()[0];
  const int64_t t = TileSize(k, g);
  Tiles tl = TileSchedule(b, offs, k, t);
  Value zero = b.Zeros(Type(ET::S64, {}));
  Value xp = Cast(b, b.Pad(Cast(b, x, in), b.Zeros(Type(in, {})), {0, 0}, {0, t}, {0, 0}), ct);  // (M, K + T)
  Value wp = Cast(b, b.Pad(Cast(b, w, in), b.Zeros(Type(in, {})), {0, 0}, {t, 0}, {0, 0}), ct);  // (K + T, N)
  return ForTiles(b, tl, b.Zeros(Type(ct, {g, m, n})), [&](Builder& b, Value j, Value acc) {
    Value first = At(b, tl.first, j), grp = At(b, tl.group, j);
    Value end = At(b, offs, grp);
    const Type ts(ET::S64, {t});
    Value in_group = b.Compare(b.Add(b.Broadcast(first, {t}, {}), b.Iota(ts, 0)), b.Broadcast(end, {t}, {}), "LT");
    Value ws = b.DynamicSlice(wp, {first, zero}, {t, n});
    ws = b.Select(b.Broadcast(in_group, {t, n}, {0}), ws, b.Zeros(ws.type));
    Value xs = b.DynamicSlice(xp, {zero, first}, {m, t});
    Value p = b.DotGeneral(xs, ws, {}, {}, {1}, {0}, Type(ct, {m, n}));
    Value cur = b.DynamicSlice(acc, {grp, zero, zero}, {1, m, n});
    return b.DynamicUpdateSlice(acc, b.Add(cur, b.Reshape(p, {1, m, n})), {grp, zero, zero});
  });
}

// Tiled 2D x 3D: x (M, K), w (G, K, N) -> (M, N) in ct.
Value GroupedRowsTiled(Builder& b, Value x, Value w, Value offs, ET in, ET ct) {
  const int64_t m = x.dims()[0], k = x.dims()[1], n = w.dims()[2];
  Tiles tl = TileSchedule(b, offs, m, TileSize(m, offs.dims()[0]));
  Value xt = b.Reshape(RowGather(b, x, tl.pos), {tl.n, tl.t, k});
  Value wt = RowGather(b, w, tl.group);  // (n, K, N)
  {  // gathered once, not re-gathered inside the dot (XLA:CPU fused them: 1.4x slower)
    auto bar = b.Op("stablehlo.optimization_barrier", {xt, wt}, {xt.type, wt.type});
    xt = bar[0];
    wt = bar[1];
  }
  Value yt = b.DotGeneral(Cast(b, xt, in), Cast(b, wt, in), {0}, {0}, {2}, {1}, Type(ct, {tl.n, tl.t, n}));
  auto [flat, grouped] = TileOfPosition(b, tl, offs, m);
  Value y = RowGather(b, b.Reshape(yt, {tl.n * tl.t, n}), flat);  // (M, N)
  return b.Select(b.Broadcast(grouped, {m, n}, {0}), y, b.Zeros(y.type));
}

// Tiled 2D x 2D, K grouped: x (M, K), w (K, N) -> (G, M, N) in ct.
Value GroupedKTiled(Builder& b, Value x, Value w, Value offs, ET in, ET ct) {
  const int64_t m = x.dims()[0], k = x.dims()[1], n = w.dims()[1], g = offs.dims()[0];
  Tiles tl = TileSchedule(b, offs, k, TileSize(k, g));
  // w's rows and x's columns of each tile; positions outside a group are zeroed in w
  Value wt = b.Reshape(RowGather(b, w, tl.pos), {tl.n, tl.t, n});
  wt = b.Select(b.Broadcast(tl.valid_pos, {tl.n, tl.t, n}, {0, 1}), wt, b.Zeros(wt.type));
  Value xt = b.Reshape(RowGather(b, b.Transpose(x, {1, 0}), tl.pos), {tl.n, tl.t, m});
  Value pt = b.DotGeneral(Cast(b, xt, in), Cast(b, wt, in), {0}, {0}, {1}, {1}, Type(ct, {tl.n, m, n}));
  // sum the tiles of each group (scatter-add by tile group)
  Value base = b.Zeros(Type(ct, {g, m, n}));
  Value coords = b.Reshape(tl.group, {tl.n, 1});
  return b.Op1("stablehlo.scatter", {base, coords, pt}, base.type,
               "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1, 2], "
               "inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, "
               "indices_are_sorted = true, unique_indices = false",
               {ScatterCombiner(ct, "add")});
}

}  // namespace

std::vector<Value> GroupedMm(LowerCtx& c) {
  Builder& b = c.b;
  const ET et = c.out().et;
  const ET ct = ComputeType(et);
  Value x = c.t(0), w = c.t(1);
  ET in = x.et();
  if (!c.has(2)) return {Matmul(b, x, w, et)};
  Value offs = Cast(b, c.t(2), ET::S64);
  const int64_t g = offs.dims()[0];
  // tiled when it does less work than dense: (M + G*T) rows against M*G
  auto tiled_pays = [&](int64_t m) { return g >= 4 && m + g * TileSize(m, g) < m * g / 2; };
  const bool loop = b.cpu_target();
  if (x.rank() == 2 && w.rank() == 3 && tiled_pays(x.dims()[0]))
    return {Cast(b, (loop ? GroupedRowsLoop : GroupedRowsTiled)(b, x, w, offs, in, ct), et)};
  if (x.rank() == 2 && w.rank() == 2 && tiled_pays(x.dims()[1]))
    return {Cast(b, (loop ? GroupedKLoop : GroupedKTiled)(b, x, w, offs, in, ct), et)};
  // Group of each position 0..n-1 along the grouped dimension: #ends <= pos.
  auto group_of = [&](int64_t n) { return GroupOf(b, offs, n); };
  // one-hot (n, g): position n is in group g
  auto onehot = [&](int64_t n) {
    Value gid = b.Broadcast(group_of(n), {n, g}, {0});
    return b.Compare(gid, b.Iota(Type(ET::S64, {n, g}), 1), "EQ");
  };
  auto Dot = [&](Value l, Value r, const Dims& lb, const Dims& rb, const Dims& lc, const Dims& rc, Dims od) {
    return b.DotGeneral(Cast(b, l, in), Cast(b, r, in), lb, rb, lc, rc, Type(ct, std::move(od)));
  };
  const Dims& xd = x.dims();
  const Dims& wd = w.dims();
  Value r;
  if (x.rank() == 2 && w.rank() == 3) {  // (M, K) x (G, K, N)
    int64_t m = xd[0], n = wd[2];
    Value all = Dot(x, w, {}, {}, {1}, {1}, {m, g, n});  // (M, G, N)
    Value mask = b.Broadcast(onehot(m), {m, g, n}, {0, 1});
    r = SumDims(b, b.Select(mask, all, b.Zeros(all.type)), {1}, false, ct);
  } else if (x.rank() == 3 && w.rank() == 2) {  // (G, M, K) x (K, N)
    int64_t m = xd[1], n = wd[1];
    Value all = Dot(x, w, {}, {}, {2}, {0}, {g, m, n});  // (G, M, N)
    Value mask = b.Broadcast(onehot(n), {g, m, n}, {2, 0});
    r = SumDims(b, b.Select(mask, all, b.Zeros(all.type)), {0}, false, ct);
  } else {  // (M, K) x (K, N): K grouped -> (G, M, N)
    int64_t m = xd[0], k = xd[1], n = wd[1];
    Value mask = b.Broadcast(onehot(k), {g, m, k}, {2, 0});
    Value xg = b.Broadcast(x, {g, m, k}, {1, 2});
    xg = b.Select(mask, xg, b.Zeros(xg.type));
    r = Dot(xg, w, {}, {}, {2}, {0}, {g, m, n});
  }
  return {Cast(b, r, et)};
}
TT_LOWERING("aten::_grouped_mm", GroupedMm);

}  // namespace
}  // namespace tt::ops
