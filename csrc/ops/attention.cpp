// Attention: scaled_dot_product_attention takes the math path on the tpu
// device (it is CompositeImplicit and decomposes into bmm / _safe_softmax /
// where / native_dropout / sum). Softmax, sum and tril live in their family
// files (nn.cpp, reduce.cpp, shape.cpp); this file adds _safe_softmax and
// the flash-attention ATen ops (_flash_attention_forward/_backward) that
// torch.nn.attention.varlen (torchtitan's "varlen" backend) and SDPA's flash
// path call: computed densely with a mask built from the cumulative sequence
// lengths (block-diagonal over packed documents), so cost is O(T^2) in the
// packed token count T; above kDenseMaxScores scores (a few hundred tokens)
// the tiled form below: flash attention's loops, memory
// of one tile pair, work only on the tile pairs that share a document.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>

#include "registry.h"

namespace tt::ops {
namespace {

Value Softmax(Builder& b, Value x, int64_t dim, bool safe) {
  ET ct = x.et();
  Dims kd = x.dims();
  kd[dim] = 1;
  Value ninf = b.Splat(Type(ct, {}), -std::numeric_limits<double>::infinity());
  Value mx = b.Reshape(b.Reduce(x, ninf, {dim}, "maximum"), kd);
  Value mxb = b.BroadcastTo(mx, x.dims());
  Value finite_mx = b.Select(b.Op1("stablehlo.is_finite", {mxb}, mxb.type.with_et(ET::PRED)), mxb,
                             b.Zeros(mxb.type));
  Value e = b.Unary("exponential", b.Sub(x, finite_mx));
  Value s = b.BroadcastTo(b.Reshape(b.Reduce(e, b.Zeros(Type(ct, {})), {dim}, "add"), kd), x.dims());
  Value y = b.Div(e, s);
  if (safe) {
    Value all_ninf = b.Compare(mxb, b.Splat(mxb.type, -std::numeric_limits<double>::infinity()), "EQ");
    y = b.Select(all_ninf, b.Zeros(y.type), y);
  }
  return y;
}

template <bool Safe>
std::vector<Value> SoftmaxL(LowerCtx& c) {
  const Type& ot = c.out();
  ET ct = ComputeType(ot.et);
  Value x = Cast(c.b, c.t(0), ct);
  if (x.rank() == 0) return {c.b.Splat(ot, 1.0)};
  int64_t dim = NormDim(c.i64(1), x.rank());
  return {Softmax(c.b, x, dim, Safe)};
}
TT_LOWERINGS(({"aten::_safe_softmax"}), SoftmaxL<true>);

// ---- flash attention (varlen: packed documents; and the padded 4-D form) ----

// dot_general with the result type computed: batch dims, then lhs free, then rhs free.
Value DotG(Builder& b, Value l, Value r, const Dims& lb, const Dims& rb, const Dims& lc, const Dims& rc, ET et) {
  Dims out;
  for (int64_t d : lb) out.push_back(l.dims()[d]);
  for (int64_t d = 0; d < l.rank(); ++d)
    if (std::find(lb.begin(), lb.end(), d) == lb.end() && std::find(lc.begin(), lc.end(), d) == lc.end())
      out.push_back(l.dims()[d]);
  for (int64_t d = 0; d < r.rank(); ++d)
    if (std::find(rb.begin(), rb.end(), d) == rb.end() && std::find(rc.begin(), rc.end(), d) == rc.end())
      out.push_back(r.dims()[d]);
  return b.DotGeneral(l, r, lb, rb, lc, rc, Type(et, out));
}

// Per-token document structure (each [T], s64): document id (n_docs: no
// document, e.g. tokens past cu[-1]), position inside it, the document's own
// length and the length of the same document on the other side (k for q).
struct Docs {
  Value doc, rel, len, other_len, other_start;  // other_start: the document's first token on the other side
};

// cu: [n+1] cumulative offsets (any int type). other: the other side's cu.
// A token's document is the last j with cu[j] <= position (n: past cu[n], no
// document), found by a binary search of ceil(log2(n+1)) gathers: O(T log n),
// so offsets padded to T + 1 entries (compiled graphs) cost no [T, n] tensor.
Docs VarlenDocs(Builder& b, Value cu, Value other, int64_t T) {
  cu = b.Convert(cu, ET::S64);
  other = b.Convert(other, ET::S64);
  const int64_t n = cu.dims()[0] - 1;
  const Type t(ET::S64, {T});
  Value pos = b.Iota(t, 0);
  Value doc = b.Zeros(t);
  int64_t step = 1;
  while (step * 2 <= n) step *= 2;
  for (; step >= 1 && n > 0; step /= 2) {
    Value cand = b.Add(doc, b.Splat(t, (double)step));
    Value in = b.Compare(cand, b.Splat(t, (double)n), "LE");
    Value at = RowGather(b, cu, b.Min(cand, b.Splat(t, (double)n)));
    doc = b.Select(b.Binary("and", in, b.Compare(at, pos, "LE")), cand, doc);
  }
  // cu with its last entry repeated: entry n + 1 makes document n (none) empty
  auto ext = [&](Value c) { return b.Concat({c, b.SliceDim(c, 0, n, n + 1)}, 0); };
  Value cux = ext(cu), otx = ext(other);
  Value next = b.Add(doc, b.Splat(t, 1.0));
  Docs d;
  d.doc = doc;
  Value start = RowGather(b, cux, doc);
  d.rel = b.Sub(pos, start);
  d.len = b.Sub(RowGather(b, cux, next), start);
  d.other_start = RowGather(b, otx, doc);
  d.other_len = b.Sub(RowGather(b, otx, next), d.other_start);
  return d;
}

// Padded [B, L] layout flattened to T = B * L tokens: document = batch row.
Docs PaddedDocs(Builder& b, int64_t B, int64_t L, int64_t other_L) {
  int64_t T = B * L;
  Value pos = b.Iota(Type(ET::S64, {T}), 0);
  Value Ls = b.Splat(Type(ET::S64, {T}), (double)L);
  Docs d;
  d.doc = b.Div(pos, Ls);
  d.rel = b.Binary("remainder", pos, Ls);
  d.len = Ls;
  d.other_len = b.Splat(Type(ET::S64, {T}), (double)other_L);
  d.other_start = b.Mul(d.doc, b.Splat(Type(ET::S64, {T}), (double)other_L));
  return d;
}

struct FlashGeom {
  bool padded = false;  // 4-D (B, L, H, D) inputs
  int64_t B = 0, Lq = 0, Lk = 0, Tq = 0, Tk = 0, Hq = 0, Hk = 0, g = 1, D = 0, Dv = 0;
  double scale = 1;
};

// mask [Tq, Tk]: same document, inside the (causal / sliding) window.
// Windows are aligned bottom-right per document, as in flash attention.
Value FlashMask(Builder& b, const Docs& q, const Docs& k, int64_t n_docs, int64_t Tq, int64_t Tk, int64_t wl,
                int64_t wr) {
  Dims sh{Tq, Tk};
  auto Q = [&](Value v) { return b.Broadcast(v, sh, {0}); };
  auto K = [&](Value v) { return b.Broadcast(v, sh, {1}); };
  Value m = b.Compare(Q(q.doc), K(k.doc), "EQ");
  m = b.Binary("and", m, b.Compare(Q(q.doc), b.Splat(Type(ET::S64, sh), (double)n_docs), "LT"));
  if (wl >= 0 || wr >= 0) {
    // diff = k_rel - (q_rel + len_k - len_q)
    Value qpos = b.Add(q.rel, b.Sub(q.other_len, q.len));
    Value diff = b.Sub(K(k.rel), Q(qpos));
    if (wr >= 0) m = b.Binary("and", m, b.Compare(diff, b.Splat(Type(ET::S64, sh), (double)wr), "LE"));
    if (wl >= 0) m = b.Binary("and", m, b.Compare(diff, b.Splat(Type(ET::S64, sh), (double)-wl), "GE"));
  }
  return m;
}

// Scores [Hk, Tq, g, Tk] (f32, scaled) and the mask broadcast to them.
std::pair<Value, Value> FlashScores(Builder& b, Value q, Value k, Value mask, const FlashGeom& G) {
  Value q4 = b.Reshape(q, {G.Tq, G.Hk, G.g, G.D});
  Value s = DotG(b, q4, k, {1}, {1}, {3}, {2}, ET::F32);  // [Hk, Tq, g, Tk]
  s = b.Mul(s, b.Splat(s.type, G.scale));
  return {s, b.Broadcast(mask, s.dims(), {1, 3})};
}

void FlashWindow(const LowerCtx& c, size_t causal_i, size_t wl_i, size_t wr_i, int64_t& wl, int64_t& wr) {
  bool causal = c.flag(causal_i);
  wl = c.i64_or(wl_i, -1);
  wr = c.i64_or(wr_i, -1);
  if (causal) wr = 0;  // as ATen's flash kernel does
}

FlashGeom Geometry(LowerCtx& c, const Value& q, const Value& k, const Value& v, bool padded, size_t scale_i) {
  FlashGeom G;
  G.padded = padded;
  if (padded) {
    if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4) c.fail("expected 4-D (batch, seq, heads, dim) inputs");
    G.B = q.dims()[0];
    G.Lq = q.dims()[1];
    G.Lk = k.dims()[1];
    G.Tq = G.B * G.Lq;
    G.Tk = G.B * G.Lk;
  } else {
    if (q.rank() != 3 || k.rank() != 3 || v.rank() != 3) c.fail("expected 3-D (total, heads, dim) inputs with cum_seq");
    G.Tq = q.dims()[0];
    G.Tk = k.dims()[0];
  }
  G.Hq = q.dims()[q.rank() - 2];
  G.Hk = k.dims()[k.rank() - 2];
  G.D = q.dims()[q.rank() - 1];
  G.Dv = v.dims()[v.rank() - 1];
  if (G.Hk == 0 || G.Hq % G.Hk != 0)
    c.fail("the number of query heads (" + std::to_string(G.Hq) + ") must be a multiple of the key/value heads (" +
           std::to_string(G.Hk) + ")");
  G.g = G.Hq / G.Hk;
  G.scale = c.has(scale_i) ? c.f64(scale_i) : 1.0 / std::sqrt((double)G.D);
  return G;
}

// Flattens a 4-D (B, L, H, D) tensor to (B*L, H, D), as f32.
Value Flat(Builder& b, Value t, const FlashGeom& G) {
  t = Cast(b, t, ET::F32);
  if (!G.padded) return t;
  Dims d = t.dims();
  return b.Reshape(t, {d[0] * d[1], d[2], d[3]});
}

std::pair<Docs, Docs> FlashDocs(LowerCtx& c, size_t cq_i, size_t ck_i, const FlashGeom& G, int64_t& n_docs) {
  if (G.padded) {
    n_docs = G.B;
    return {PaddedDocs(c.b, G.B, G.Lq, G.Lk), PaddedDocs(c.b, G.B, G.Lk, G.Lq)};
  }
  if (!c.has(cq_i) || !c.has(ck_i)) c.fail("3-D inputs need cum_seq_q and cum_seq_k");
  Value cq = c.t(cq_i), ck = c.t(ck_i);
  if (cq.rank() != 1 || ck.rank() != 1 || cq.dims()[0] != ck.dims()[0] || cq.dims()[0] < 1)
    c.fail("cum_seq_q and cum_seq_k must be 1-D with the same number (batch + 1) of entries");
  n_docs = cq.dims()[0] - 1;
  return {VarlenDocs(c.b, cq, ck, G.Tq), VarlenDocs(c.b, ck, cq, G.Tk)};
}


// ---- the tiled form: flash attention's loops in stablehlo.while ----
//
// Above kDenseMaxScores scores (Hq x Tq x Tk) the tiled form: the dense form's [Hk, Tq, g, Tk]
// tensors grow with the square of the packed tokens (a batch of 8 x 8192 tokens: 137 GB of
// f32 scores per 8 heads) and its time with them (benchmarks/bench_attention.py, XLA CPU
// plugin, 8 heads, fwd+bwd: 4096 tokens dense 5.7 s, tiled 0.35 s; 512 tokens 90 / 81 ms;
// 256 tokens 17 / 18 ms); the tiled form holds one Bq x Bk tile pair per head at a time. Each query tile visits only the
// key tiles its rows' documents (and causal / sliding windows) reach, found in the program
// from the documents' offsets, so packed documents cost what their own lengths do.
// Forward: online softmax over the key tiles (as the ragged paged attention below).
// Backward: an outer loop over key tiles accumulating dK and dV, an inner loop over the
// query tiles that see them, adding each tile's dQ into the full dQ carried by the loops.
// TORCHTPU_FLASH_TILE=n: the tiled form at every size, with n-token tiles (tests);
// TORCHTPU_FLASH_TILE=dense: the dense form at every size (benchmarks/bench_attention.py).

constexpr int64_t kDenseMaxScores = int64_t(1) << 20;

// > 0: tiles of that many tokens at every size; 0: by size; -1: dense at every size.
int64_t FlashTileEnv() {
  static const int64_t t = [] {
    const char* e = std::getenv("TORCHTPU_FLASH_TILE");
    if (!e || !*e) return int64_t(0);
    if (std::string(e) == "dense") return int64_t(-1);
    return std::max<int64_t>(1, std::atoll(e));
  }();
  return t;
}

bool UseTiled(const FlashGeom& G) {
  if (FlashTileEnv() != 0) return FlashTileEnv() > 0;
  return (double)G.Hq * (double)G.Tq * (double)G.Tk > (double)kDenseMaxScores;
}

int64_t TileFor(int64_t T) {
  int64_t t = FlashTileEnv() > 0 ? FlashTileEnv() : 512;
  return std::max<int64_t>(1, std::min(t, T));
}

// T tokens padded to whole tiles.
int64_t PaddedLen(int64_t T) {
  const int64_t B = TileFor(T);
  return (T + B - 1) / B * B;
}

// A stablehlo.while over tile index i from start while i < end (0-d s64 values), carrying
// state: body(b, i, state) -> the next state. Returns the state at exit.
using TileBody = std::function<std::vector<Value>(Builder&, Value, const std::vector<Value>&)>;
std::vector<Value> TileLoop(Builder& b, Value start, Value end, const std::vector<Value>& state, const TileBody& body) {
  const Type s64(ET::S64, {});
  hlo::Region cond, step;
  cond.arg_types = {s64};
  for (const Value& v : state) cond.arg_types.push_back(v.type);
  cond.body = [&](Builder& b, const std::vector<Value>& a) {
    return std::vector<Value>{b.Compare(a[0], end, "LT")};
  };
  step.arg_types = cond.arg_types;
  step.body = [&](Builder& b, const std::vector<Value>& a) {
    std::vector<Value> next{b.Add(a[0], b.Splat(s64, 1.0))};
    for (Value& v : body(b, a[0], std::vector<Value>(a.begin() + 1, a.end()))) next.push_back(v);
    return next;
  };
  std::vector<Value> init{start};
  init.insert(init.end(), state.begin(), state.end());
  std::vector<Value> r = b.Op("stablehlo.while", init, cond.arg_types, "", {cond, step});
  return std::vector<Value>(r.begin() + 1, r.end());
}

// Per token, the half-open range [lo, hi) of tokens on the other side it pairs with (its
// document, narrowed by the window); invalid tokens get [big, 0). q_side: the tokens are
// queries (windows bound the keys a query sees) or keys (the queries that see a key).
std::pair<Value, Value> OtherRange(Builder& b, const Docs& d, int64_t n_docs, int64_t T, int64_t wl, int64_t wr,
                                   bool q_side, int64_t big) {
  const Type t(ET::S64, {T});
  auto C = [&](double v) { return b.Splat(t, v); };
  Value valid = b.Compare(d.doc, C((double)n_docs), "LT");
  Value lo = b.Zeros(t), hi = d.other_len;
  if (q_side) {
    Value qpos = b.Add(d.rel, b.Sub(d.other_len, d.len));  // aligned bottom-right
    if (wl >= 0) lo = b.Max(lo, b.Sub(qpos, C((double)wl)));
    if (wr >= 0) hi = b.Min(hi, b.Add(qpos, C((double)wr + 1)));
  } else {
    Value shift = b.Sub(d.other_len, d.len);  // q_rel = q_pos + shift
    if (wr >= 0) lo = b.Max(lo, b.Add(b.Sub(d.rel, C((double)wr)), shift));
    if (wl >= 0) hi = b.Min(hi, b.Add(b.Add(d.rel, C((double)wl + 1)), shift));
  }
  hi = b.Max(hi, lo);
  lo = b.Add(lo, d.other_start);
  hi = b.Add(hi, d.other_start);
  return {b.Select(valid, lo, C((double)big)), b.Select(valid, hi, b.Zeros(t))};
}

// The tiles [first, end) of size B that tokens [min lo, max hi) of a tile touch.
std::pair<Value, Value> TileRange(Builder& b, Value lo, Value hi, int64_t B, int64_t n_tiles) {
  const Type s(ET::S64, {});
  Value mn = b.Reduce(lo, b.Splat(s, (double)(n_tiles * B)), {0}, "minimum");
  Value mx = b.Reduce(hi, b.Zeros(s), {0}, "maximum");
  Value first = b.Div(mn, b.Splat(s, (double)B));
  Value end = b.Div(b.Add(mx, b.Splat(s, (double)(B - 1))), b.Splat(s, (double)B));
  return {b.Min(first, end), end};
}

Value PadRows(Builder& b, Value v, int64_t to, double fill) {
  int64_t n = v.dims()[0];
  if (n == to) return v;
  Dims lo(v.rank(), 0), hi(v.rank(), 0), in(v.rank(), 0);
  hi[0] = to - n;
  return b.Pad(v, b.Splat(Type(v.et(), {}), fill), lo, hi, in);
}

Value Rows(Builder& b, Value v, Value start, int64_t n) {
  Dims sizes = v.dims();
  sizes[0] = n;
  std::vector<Value> starts{start};
  for (int64_t d = 1; d < v.rank(); ++d) starts.push_back(b.Zeros(Type(ET::S64, {})));
  return b.DynamicSlice(v, starts, sizes);
}

Value PutRows(Builder& b, Value v, Value upd, Value start) {
  std::vector<Value> starts{start};
  for (int64_t d = 1; d < v.rank(); ++d) starts.push_back(b.Zeros(Type(ET::S64, {})));
  return b.DynamicUpdateSlice(v, upd, starts);
}

// Everything per token the tile loops read, padded to whole tiles.
struct TiledSide {
  int64_t T, Tp, B, n_tiles;
  Value doc, rel, lo, hi;  // [Tp]; lo/hi: range on the other side
  Value qpos;              // queries only: position aligned bottom-right
};

TiledSide MakeSide(Builder& b, const Docs& d, int64_t n_docs, int64_t T, int64_t wl, int64_t wr, bool q_side,
                   int64_t other_T) {
  const int64_t other_Tp = PaddedLen(other_T);
  TiledSide s;
  s.T = T;
  s.B = TileFor(T);
  s.n_tiles = (T + s.B - 1) / s.B;
  s.Tp = s.n_tiles * s.B;
  auto [lo, hi] = OtherRange(b, d, n_docs, T, wl, wr, q_side, other_Tp);
  // padding tokens: no document (queries: n_docs, keys: n_docs + 1, never equal)
  s.doc = PadRows(b, d.doc, s.Tp, (double)(n_docs + (q_side ? 0 : 1)));
  s.rel = PadRows(b, d.rel, s.Tp, 0);
  s.lo = PadRows(b, lo, s.Tp, (double)other_Tp);
  s.hi = PadRows(b, hi, s.Tp, 0);
  if (q_side) s.qpos = PadRows(b, b.Add(d.rel, b.Sub(d.other_len, d.len)), s.Tp, 0);
  return s;
}

// mask [Hk, Bq, g, Bk] of a tile pair (same document, inside the window).
Value TileMask(Builder& b, Value qdoc, Value qpos, Value kdoc, Value krel, int64_t n_docs, int64_t wl, int64_t wr,
               const Dims& sdims) {
  const int64_t Bq = qdoc.dims()[0], Bk = kdoc.dims()[0];
  Dims sh{Bq, Bk};
  auto Q = [&](Value v) { return b.Broadcast(v, sh, {0}); };
  auto K = [&](Value v) { return b.Broadcast(v, sh, {1}); };
  Value m = b.Compare(Q(qdoc), K(kdoc), "EQ");
  m = b.Binary("and", m, b.Compare(Q(qdoc), b.Splat(Type(ET::S64, sh), (double)n_docs), "LT"));
  if (wl >= 0 || wr >= 0) {
    Value diff = b.Sub(K(krel), Q(qpos));
    if (wr >= 0) m = b.Binary("and", m, b.Compare(diff, b.Splat(Type(ET::S64, sh), (double)wr), "LE"));
    if (wl >= 0) m = b.Binary("and", m, b.Compare(diff, b.Splat(Type(ET::S64, sh), (double)-wl), "GE"));
  }
  return b.Broadcast(m, sdims, {1, 3});
}

// q [Tq, Hq, D], k [Tk, Hk, D], v [Tk, Hk, Dv] (f32, flat) -> o [Tq, Hq, Dv], lse [Hq, Tq].
std::pair<Value, Value> TiledForward(Builder& b, const FlashGeom& G, const Docs& dq, const Docs& dk, int64_t n_docs,
                                     int64_t wl, int64_t wr, Value q, Value k, Value v) {
  const int64_t Hk = G.Hk, g = G.g, D = G.D, Dv = G.Dv;
  TiledSide Q = MakeSide(b, dq, n_docs, G.Tq, wl, wr, true, G.Tk);
  TiledSide K = MakeSide(b, dk, n_docs, G.Tk, wl, wr, false, G.Tq);
  const int64_t Bq = Q.B, Bk = K.B;
  Value q4 = PadRows(b, b.Reshape(q, {G.Tq, Hk, g, D}), Q.Tp, 0);
  Value kp = PadRows(b, k, K.Tp, 0), vp = PadRows(b, v, K.Tp, 0);
  const Type s64(ET::S64, {});
  auto I = [&](double x) { return b.Splat(s64, x); };
  const double inf = std::numeric_limits<double>::infinity(), kNegBig = -1e30;
  Type mt(ET::F32, {Hk, Bq, g}), at(ET::F32, {Hk, Bq, g, Dv});
  Type ot(ET::F32, {Q.Tp, Hk, g, Dv}), lt(ET::F32, {Q.Tp, Hk, g});

  std::vector<Value> r = TileLoop(b, I(0), I((double)Q.n_tiles), {b.Zeros(ot), b.Zeros(lt)},
                                  [&](Builder& b, Value i, const std::vector<Value>& a) {
    Value row = b.Mul(i, I((double)Bq));
    Value qt = Rows(b, q4, row, Bq), qdoc = Rows(b, Q.doc, row, Bq), qpos = Rows(b, Q.qpos, row, Bq);
    auto [first, end] = TileRange(b, Rows(b, Q.lo, row, Bq), Rows(b, Q.hi, row, Bq), Bk, K.n_tiles);
    std::vector<Value> r = TileLoop(b, first, end, {b.Splat(mt, kNegBig), b.Zeros(mt), b.Zeros(at)},
                                    [&](Builder& b, Value j, const std::vector<Value>& a) {
      Value col = b.Mul(j, I((double)Bk));
      Value kt = Rows(b, kp, col, Bk), vt = Rows(b, vp, col, Bk);
      Value s = DotG(b, qt, kt, {1}, {1}, {3}, {2}, ET::F32);  // [Hk, Bq, g, Bk]
      s = b.Mul(s, b.Splat(s.type, G.scale));
      Value m4 = TileMask(b, qdoc, qpos, Rows(b, K.doc, col, Bk), Rows(b, K.rel, col, Bk), n_docs, wl, wr, s.dims());
      s = b.Select(m4, s, b.Splat(s.type, -inf));
      Value mn = b.Max(a[0], b.Reduce(s, b.Splat(Type(ET::F32, {}), kNegBig), {3}, "maximum"));
      Value p = b.Unary("exponential", b.Sub(s, b.Broadcast(mn, s.dims(), {0, 1, 2})));
      Value alpha = b.Unary("exponential", b.Sub(a[0], mn));
      Value ln = b.Add(b.Mul(a[1], alpha), b.Reduce(p, b.Zeros(Type(ET::F32, {})), {3}, "add"));
      Value pv = DotG(b, p, vt, {0}, {1}, {3}, {0}, ET::F32);  // [Hk, Bq, g, Dv]
      Value acc = b.Add(b.Mul(a[2], b.Broadcast(alpha, at.dims, {0, 1, 2})), pv);
      return std::vector<Value>{mn, ln, acc};
    });
    Value m = r[0], l = r[1], acc = r[2];
    Value any = b.Compare(l, b.Zeros(mt), "GT");
    Value safe = b.Select(any, l, b.Splat(mt, 1.0));
    Value o = b.Select(b.Broadcast(any, at.dims, {0, 1, 2}), b.Div(acc, b.Broadcast(safe, at.dims, {0, 1, 2})),
                       b.Zeros(at));
    // rows with no key: output 0, logsumexp +inf (as flash attention's kernels)
    Value lse = b.Select(any, b.Add(m, b.Unary("log", safe)), b.Splat(mt, inf));
    return std::vector<Value>{PutRows(b, a[0], b.Transpose(o, {1, 0, 2, 3}), row),
                              PutRows(b, a[1], b.Transpose(lse, {1, 0, 2}), row)};
  });
  Value o = b.Reshape(b.SliceDim(r[0], 0, 0, G.Tq), {G.Tq, G.Hq, Dv});
  Value lse = b.Reshape(b.Transpose(b.SliceDim(r[1], 0, 0, G.Tq), {1, 2, 0}), {G.Hq, G.Tq});
  return {o, lse};
}

// go/out [Tq, Hq, Dv], lse [Hq, Tq] (f32, flat) -> dq [Tq, Hq, D], dk [Tk, Hk, D], dv [Tk, Hk, Dv].
std::vector<Value> TiledBackward(Builder& b, const FlashGeom& G, const Docs& dq, const Docs& dk, int64_t n_docs,
                                 int64_t wl, int64_t wr, Value q, Value k, Value v, Value go, Value out, Value lse) {
  const int64_t Hk = G.Hk, g = G.g, D = G.D, Dv = G.Dv;
  TiledSide Q = MakeSide(b, dq, n_docs, G.Tq, wl, wr, true, G.Tk);
  TiledSide K = MakeSide(b, dk, n_docs, G.Tk, wl, wr, false, G.Tq);
  const int64_t Bq = Q.B, Bk = K.B;
  const double inf = std::numeric_limits<double>::infinity();
  Value q4 = PadRows(b, b.Reshape(q, {G.Tq, Hk, g, D}), Q.Tp, 0);
  Value go4 = PadRows(b, b.Reshape(go, {G.Tq, Hk, g, Dv}), Q.Tp, 0);
  Value dsum = b.Reduce(b.Mul(go, out), b.Zeros(Type(ET::F32, {})), {2}, "add");  // [Tq, Hq]
  dsum = PadRows(b, b.Reshape(dsum, {G.Tq, Hk, g}), Q.Tp, 0);
  Value lse3 = PadRows(b, b.Transpose(b.Reshape(lse, {Hk, g, G.Tq}), {2, 0, 1}), Q.Tp, inf);  // [Tqp, Hk, g]
  Value kp = PadRows(b, k, K.Tp, 0), vp = PadRows(b, v, K.Tp, 0);
  const Type s64(ET::S64, {});
  auto I = [&](double x) { return b.Splat(s64, x); };
  Type dqt(ET::F32, {Q.Tp, Hk, g, D}), dkt(ET::F32, {K.Tp, Hk, D}), dvt(ET::F32, {K.Tp, Hk, Dv});
  Type kat(ET::F32, {Hk, Bk, D}), vat(ET::F32, {Hk, Bk, Dv});

  std::vector<Value> r = TileLoop(b, I(0), I((double)K.n_tiles), {b.Zeros(dqt), b.Zeros(dkt), b.Zeros(dvt)},
                                  [&](Builder& b, Value j, const std::vector<Value>& a) {
    Value col = b.Mul(j, I((double)Bk));
    Value kt = Rows(b, kp, col, Bk), vt = Rows(b, vp, col, Bk);
    Value kdoc = Rows(b, K.doc, col, Bk), krel = Rows(b, K.rel, col, Bk);
    auto [first, end] = TileRange(b, Rows(b, K.lo, col, Bk), Rows(b, K.hi, col, Bk), Bq, Q.n_tiles);
    std::vector<Value> r = TileLoop(b, first, end, {a[0], b.Zeros(kat), b.Zeros(vat)},
                                    [&](Builder& b, Value i, const std::vector<Value>& a) {
      Value row = b.Mul(i, I((double)Bq));
      Value qt = Rows(b, q4, row, Bq), got = Rows(b, go4, row, Bq);
      Value lt = b.Transpose(Rows(b, lse3, row, Bq), {1, 0, 2});  // [Hk, Bq, g]
      Value dst = b.Transpose(Rows(b, dsum, row, Bq), {1, 0, 2});
      Value s = DotG(b, qt, kt, {1}, {1}, {3}, {2}, ET::F32);  // [Hk, Bq, g, Bk]
      s = b.Mul(s, b.Splat(s.type, G.scale));
      Value m4 = TileMask(b, Rows(b, Q.doc, row, Bq), Rows(b, Q.qpos, row, Bq), kdoc, krel, n_docs, wl, wr,
                          s.dims());
      Value ok = b.Compare(lt, b.Splat(lt.type, inf), "NE");
      Value lsafe = b.Select(ok, lt, b.Zeros(lt.type));
      Value p = b.Unary("exponential", b.Sub(s, b.Broadcast(lsafe, s.dims(), {0, 1, 2})));
      p = b.Select(b.Binary("and", m4, b.Broadcast(ok, s.dims(), {0, 1, 2})), p, b.Zeros(p.type));
      Value dv = DotG(b, p, got, {0}, {1}, {1, 2}, {0, 2}, ET::F32);  // [Hk, Bk, Dv]
      Value dp = DotG(b, got, vt, {1}, {1}, {3}, {2}, ET::F32);       // [Hk, Bq, g, Bk]
      Value ds = b.Mul(p, b.Sub(dp, b.Broadcast(dst, dp.dims(), {0, 1, 2})));
      ds = b.Mul(ds, b.Splat(ds.type, G.scale));
      Value dkt2 = DotG(b, ds, qt, {0}, {1}, {1, 2}, {0, 2}, ET::F32);  // [Hk, Bk, D]
      Value dqt2 = b.Transpose(DotG(b, ds, kt, {0}, {1}, {3}, {0}, ET::F32), {1, 0, 2, 3});  // [Bq, Hk, g, D]
      Value dq_all = PutRows(b, a[0], b.Add(Rows(b, a[0], row, Bq), dqt2), row);
      return std::vector<Value>{dq_all, b.Add(a[1], dkt2), b.Add(a[2], dv)};
    });
    return std::vector<Value>{r[0], PutRows(b, a[1], b.Transpose(r[1], {1, 0, 2}), col),
                              PutRows(b, a[2], b.Transpose(r[2], {1, 0, 2}), col)};
  });
  return {b.Reshape(b.SliceDim(r[0], 0, 0, G.Tq), {G.Tq, G.Hq, D}), b.SliceDim(r[1], 0, 0, G.Tk),
          b.SliceDim(r[2], 0, 0, G.Tk)};
}

// _flash_attention_forward(q, k, v, cum_seq_q?, cum_seq_k?, max_q, max_k, dropout_p, is_causal,
//   return_debug_mask, *, scale?, window_size_left?, window_size_right?, seqused_k?, alibi_slopes?,
//   block_table?, num_splits?) -> (output, softmax_logsumexp, rng_state, unused, debug_attn_mask)
std::vector<Value> FlashForward(LowerCtx& c) {
  Builder& b = c.b;
  if (c.f64_or(7, 0.0) != 0.0) c.fail("dropout_p > 0 is not supported on tpu");
  if (c.flag(9)) c.fail("return_debug_mask=True is not supported on tpu");
  if (c.has(13) || c.has(14) || c.has(15)) c.fail("seqused_k, alibi_slopes and block_table are not supported on tpu");
  Value q0 = c.t(0), k0 = c.t(1), v0 = c.t(2);
  bool padded = !c.has(3);
  FlashGeom G = Geometry(c, q0, k0, v0, padded, 10);
  int64_t wl, wr, n_docs;
  FlashWindow(c, 8, 11, 12, wl, wr);
  auto [dq, dk] = FlashDocs(c, 3, 4, G, n_docs);
  Value q = Flat(b, q0, G), k = Flat(b, k0, G), v = Flat(b, v0, G);
  if (UseTiled(G)) {
    auto [o, lse2] = TiledForward(b, G, dq, dk, n_docs, wl, wr, q, k, v);
    if (G.padded) {
      o = b.Reshape(o, {G.B, G.Lq, G.Hq, G.Dv});
      lse2 = b.Transpose(b.Reshape(lse2, {G.Hq, G.B, G.Lq}), {1, 0, 2});  // [B, Hq, Lq]
    }
    return {Cast(b, o, c.out(0).et), Cast(b, lse2, c.out(1).et), b.Zeros(c.out(2)), b.Zeros(c.out(3)), Value{}};
  }
  Value mask = FlashMask(b, dq, dk, n_docs, G.Tq, G.Tk, wl, wr);
  auto [s, m4] = FlashScores(b, q, k, mask, G);
  const double inf = std::numeric_limits<double>::infinity();
  Value ninf = b.Splat(s.type, -inf);
  s = b.Select(m4, s, ninf);
  Value mx = b.Reduce(s, b.Splat(Type(ET::F32, {}), -inf), {3}, "maximum");  // [Hk, Tq, g]
  Value any = b.Compare(mx, b.Splat(mx.type, -inf), "NE");
  Value mxs = b.Select(any, mx, b.Zeros(mx.type));
  Value e = b.Select(m4, b.Unary("exponential", b.Sub(s, b.Broadcast(mxs, s.dims(), {0, 1, 2}))), b.Zeros(s.type));
  Value l = b.Reduce(e, b.Zeros(Type(ET::F32, {})), {3}, "add");
  Value lsafe = b.Select(any, l, b.Splat(l.type, 1.0));
  Value p = b.Div(e, b.Broadcast(lsafe, s.dims(), {0, 1, 2}));
  // rows with no key: output 0, logsumexp +inf (as flash attention's kernels)
  Value lse = b.Select(any, b.Add(mxs, b.Unary("log", lsafe)), b.Splat(l.type, inf));
  Value o = DotG(b, p, v, {0}, {1}, {3}, {0}, ET::F32);  // [Hk, Tq, g, Dv]
  o = b.Reshape(b.Transpose(o, {1, 0, 2, 3}), {G.Tq, G.Hq, G.Dv});
  Value lse2 = b.Reshape(b.Transpose(lse, {0, 2, 1}), {G.Hq, G.Tq});  // [Hq, Tq]
  if (G.padded) {
    o = b.Reshape(o, {G.B, G.Lq, G.Hq, G.Dv});
    lse2 = b.Transpose(b.Reshape(lse2, {G.Hq, G.B, G.Lq}), {1, 0, 2});  // [B, Hq, Lq]
  }
  std::vector<Value> res{Cast(b, o, c.out(0).et), Cast(b, lse2, c.out(1).et)};
  res.push_back(b.Zeros(c.out(2)));  // rng state: no dropout
  res.push_back(b.Zeros(c.out(3)));
  res.push_back(Value{});  // debug mask: empty
  return res;
}
TT_LOWERINGS(({"aten::_flash_attention_forward"}), FlashForward);

// _flash_attention_backward(grad_out, q, k, v, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
//   dropout_p, is_causal, rng_state, unused, *, scale?, window_size_left?, window_size_right?)
std::vector<Value> FlashBackward(LowerCtx& c) {
  Builder& b = c.b;
  if (c.f64_or(10, 0.0) != 0.0) c.fail("dropout_p > 0 is not supported on tpu");
  Value q0 = c.t(1), k0 = c.t(2), v0 = c.t(3);
  // ATen passes undefined (or empty) cum_seq tensors for the padded form
  bool padded = q0.rank() == 4;
  FlashGeom G = Geometry(c, q0, k0, v0, padded, 14);
  int64_t wl, wr, n_docs;
  FlashWindow(c, 11, 15, 16, wl, wr);
  auto [dq_, dk_] = FlashDocs(c, 6, 7, G, n_docs);
  Value q = Flat(b, q0, G), k = Flat(b, k0, G), v = Flat(b, v0, G);
  Value go = Flat(b, c.t(0), G), out = Flat(b, c.t(4), G);
  Value lse = Cast(b, c.t(5), ET::F32);
  if (G.padded) lse = b.Reshape(b.Transpose(lse, {1, 0, 2}), {G.Hq, G.Tq});  // [B,H,L] -> [H, B*L]
  if (UseTiled(G)) {
    std::vector<Value> d = TiledBackward(b, G, dq_, dk_, n_docs, wl, wr, q, k, v, go, out, lse);
    if (G.padded) {
      d[0] = b.Reshape(d[0], {G.B, G.Lq, G.Hq, G.D});
      d[1] = b.Reshape(d[1], {G.B, G.Lk, G.Hk, G.D});
      d[2] = b.Reshape(d[2], {G.B, G.Lk, G.Hk, G.Dv});
    }
    return {Cast(b, d[0], c.out(0).et), Cast(b, d[1], c.out(1).et), Cast(b, d[2], c.out(2).et)};
  }
  lse = b.Transpose(b.Reshape(lse, {G.Hk, G.g, G.Tq}), {0, 2, 1});        // [Hk, Tq, g]
  Value mask = FlashMask(b, dq_, dk_, n_docs, G.Tq, G.Tk, wl, wr);
  auto [s, m4] = FlashScores(b, q, k, mask, G);
  Value lse_ok = b.Compare(lse, b.Splat(lse.type, std::numeric_limits<double>::infinity()), "NE");
  Value lse_s = b.Select(lse_ok, lse, b.Zeros(lse.type));
  Value p = b.Unary("exponential", b.Sub(s, b.Broadcast(lse_s, s.dims(), {0, 1, 2})));
  p = b.Select(b.Binary("and", m4, b.Broadcast(lse_ok, s.dims(), {0, 1, 2})), p, b.Zeros(p.type));
  Value go4 = b.Reshape(go, {G.Tq, G.Hk, G.g, G.Dv});
  Value dv = DotG(b, p, go4, {0}, {1}, {1, 2}, {0, 2}, ET::F32);      // [Hk, Tk, Dv]
  Value dp = DotG(b, go4, v, {1}, {1}, {3}, {2}, ET::F32);            // [Hk, Tq, g, Tk]
  Value dsum = b.Reduce(b.Mul(go, out), b.Zeros(Type(ET::F32, {})), {2}, "add");  // [Tq, Hq]
  dsum = b.Transpose(b.Reshape(dsum, {G.Tq, G.Hk, G.g}), {1, 0, 2});  // [Hk, Tq, g]
  Value ds = b.Mul(p, b.Sub(dp, b.Broadcast(dsum, dp.dims(), {0, 1, 2})));
  ds = b.Mul(ds, b.Splat(ds.type, G.scale));
  Value dq = DotG(b, ds, k, {0}, {1}, {3}, {0}, ET::F32);  // [Hk, Tq, g, D]
  dq = b.Reshape(b.Transpose(dq, {1, 0, 2, 3}), {G.Tq, G.Hq, G.D});
  Value q4 = b.Reshape(q, {G.Tq, G.Hk, G.g, G.D});
  Value dk = DotG(b, ds, q4, {0}, {1}, {1, 2}, {0, 2}, ET::F32);  // [Hk, Tk, D]
  dk = b.Transpose(dk, {1, 0, 2});
  dv = b.Transpose(dv, {1, 0, 2});
  if (G.padded) {
    dq = b.Reshape(dq, {G.B, G.Lq, G.Hq, G.D});
    dk = b.Reshape(dk, {G.B, G.Lk, G.Hk, G.D});
    dv = b.Reshape(dv, {G.B, G.Lk, G.Hk, G.Dv});
  }
  return {Cast(b, dq, c.out(0).et), Cast(b, dk, c.out(1).et), Cast(b, dv, c.out(2).et)};
}
TT_LOWERINGS(({"aten::_flash_attention_backward"}), FlashBackward);

// torch.nn.attention.varlen's custom ops (torch_attn::_varlen_attn and its
// backward), which stay opaque in compiled graphs (torchtitan's varlen
// attention): the flash-attention lowerings above, with their arguments in
// the flash ops' order. max_q / max_k are not read (the kernel is dense), so
// a graph where they are symbolic still lowers (torchtpu/compile/lower.py).
Arg NoneArg() { return Arg(); }
Arg DoubleArg(double d) {
  Arg a;
  a.kind = Arg::Double;
  a.d = d;
  return a;
}
Arg BoolArg(bool v) {
  Arg a;
  a.kind = Arg::Bool;
  a.b = v;
  return a;
}
Arg IntArg(int64_t v) {
  Arg a;
  a.kind = Arg::Int;
  a.i = v;
  return a;
}
// window_size (int[2]? ; None or [-1, -1]: unbounded) as two ints
void WindowArgs(const LowerCtx& c, size_t i, std::vector<Arg>& out) {
  std::vector<int64_t> w = c.has(i) ? c.ints(i) : std::vector<int64_t>{-1, -1};
  if (w.size() != 2) c.fail("window_size must have two entries (left, right)");
  out.push_back(IntArg(w[0]));
  out.push_back(IntArg(w[1]));
}

// _varlen_attn(q, k, v, cu_seq_q, cu_seq_k?, max_q, max_k, is_causal, scale?, window_size?,
//   enable_gqa, seqused_k?, block_table?, num_splits?) -> (output, lse, rng_state)
std::vector<Value> VarlenForward(LowerCtx& c) {
  if (!c.has(4)) c.fail("cu_seq_k is required on tpu (the same offsets as cu_seq_q for self-attention)");
  if (c.has(11) || c.has(12)) c.fail("seqused_k and block_table are not supported on tpu");
  std::vector<Arg> a{c.arg(0), c.arg(1), c.arg(2), c.arg(3), c.arg(4), c.arg(5), c.arg(6), DoubleArg(0.0),
                     c.has(7) ? c.arg(7) : BoolArg(false), BoolArg(false), c.has(8) ? c.arg(8) : NoneArg()};
  WindowArgs(c, 9, a);
  a.push_back(NoneArg());  // seqused_k
  a.push_back(NoneArg());  // alibi_slopes
  a.push_back(NoneArg());  // block_table
  a.push_back(NoneArg());  // num_splits
  static const std::vector<std::string> kNames{"query", "key", "value", "cum_seq_q", "cum_seq_k", "max_q", "max_k",
                                               "dropout_p", "is_causal", "return_debug_mask", "scale",
                                               "window_size_left", "window_size_right", "seqused_k",
                                               "alibi_slopes", "block_table", "num_splits"};
  // the flash op's outputs: output, logsumexp, rng_state (u64[2]), unused, debug mask
  std::vector<Type> outs{c.out(0), c.out(1), c.out(2), Type(ET::U64, {0}), Type(c.out(0).et, {0})};
  LowerCtx f{c.b, c.op, std::move(a), kNames, outs, {}};
  std::vector<Value> r = FlashForward(f);
  return {r[0], r[1], r[2]};
}
TT_GRAPH_LOWERINGS(({"torch_attn::_varlen_attn"}), VarlenForward);

// _varlen_attn_backward(grad_out, q, k, v, out, lse, cu_seq_q, cu_seq_k, max_q, max_k, is_causal,
//   rng_state, scale?, window_size?) -> (dq, dk, dv)
std::vector<Value> VarlenBackward(LowerCtx& c) {
  std::vector<Arg> a{c.arg(0), c.arg(1), c.arg(2), c.arg(3), c.arg(4), c.arg(5), c.arg(6), c.arg(7), c.arg(8),
                     c.arg(9), DoubleArg(0.0), c.arg(10), c.arg(11), NoneArg(), c.has(12) ? c.arg(12) : NoneArg()};
  WindowArgs(c, 13, a);
  static const std::vector<std::string> kNames{"grad_out", "query", "key", "value", "out", "logsumexp",
                                               "cum_seq_q", "cum_seq_k", "max_q", "max_k", "dropout_p",
                                               "is_causal", "philox_seed", "philox_offset", "scale",
                                               "window_size_left", "window_size_right"};
  LowerCtx f{c.b, c.op, std::move(a), kNames, c.outs, {}};
  return FlashBackward(f);
}
TT_GRAPH_LOWERINGS(({"torch_attn::_varlen_attn_backward"}), VarlenBackward);


// ---- ragged paged attention (torchtpu::paged_attention; torchtpu/paged.py) ----
// paged_attention(query [T, H, D], kv_cache [NB, BS, Hkv, D + Dv] (keys | values
//   along the last axis), query_start_loc [R+1], seq_lens [R], block_tables [R, W],
//   float scale, int sliding_window=0, float soft_cap=0.0, Tensor? sinks) -> [T, H, Dv]
// Request r's query tokens are rows query_start_loc[r] .. query_start_loc[r+1]-1, the last
// of its seq_lens[r] tokens; token i of it sits at position seq_lens[r] - qlen_r + i and
// attends its request's keys 0..pos (inside the window), read through block table row r.
// Rows past query_start_loc[R] (padding) give zeros. The cache is read a chunk of blocks at
// a time in a stablehlo.while with an online softmax (f32), for as many chunks as the
// longest request needs (computed in the program): memory does not grow with the context.

std::vector<Value> PagedAttention(LowerCtx& c) {
  Builder& b = c.b;
  Value q = c.t(0), cache = c.t(1), qsl = c.t(2), seq = c.t(3), bt = c.t(4);
  if (q.rank() != 3) c.fail("query must be 3-D (tokens, heads, head_size)");
  if (cache.rank() != 4) c.fail("kv_cache must be 4-D (blocks, block_size, kv_heads, head_size + head_size_v)");
  if (qsl.rank() != 1 || seq.rank() != 1 || bt.rank() != 2 || qsl.dims()[0] != seq.dims()[0] + 1 ||
      bt.dims()[0] != seq.dims()[0])
    c.fail("query_start_loc [R+1], seq_lens [R] and block_tables [R, W] must agree on R");
  const int64_t T = q.dims()[0], H = q.dims()[1], D = q.dims()[2];
  const int64_t BS = cache.dims()[1], Hkv = cache.dims()[2], Cw = cache.dims()[3], Dv = Cw - D;
  const int64_t R = seq.dims()[0], W = bt.dims()[1];
  if (Hkv == 0 || H % Hkv) c.fail("query heads must be a multiple of the cache's kv heads");
  if (Dv <= 0) c.fail("kv_cache's last dimension must hold head_size keys and the values after them");
  const int64_t G = H / Hkv, window = c.i64_or(6, 0);
  const double cap = c.f64_or(7, 0.0);
  const Type ot = c.out();
  if (T == 0 || R == 0 || W == 0) return {b.Zeros(ot)};

  // per token: its request (R: none), position, the first key position it sees
  Docs d = VarlenDocs(b, qsl, qsl, T);
  Value valid = b.Compare(d.doc, b.Splat(Type(ET::S64, {T}), (double)R), "LT");
  Value r = b.Min(d.doc, b.Splat(Type(ET::S64, {T}), (double)(R - 1)));
  Value seq_t = RowGather(b, b.Convert(seq, ET::S64), r);
  Value pos = b.Add(b.Sub(seq_t, d.len), d.rel);  // [T]
  Value zero_t = b.Zeros(Type(ET::S64, {T}));
  Value lo = window > 0 ? b.Max(b.Sub(pos, b.Splat(Type(ET::S64, {T}), (double)(window - 1))), zero_t) : zero_t;

  // keys per loop iteration: about 128, whole blocks. Query rows are processed in tiles of
  // at most 64 rows (and at most 2^24 gathered cache elements per iteration), each tile
  // reading only the chunks its own rows need: memory is bounded by the tile, and a long
  // prefill's early rows skip the chunks after them (causal).
  const int64_t kCap = int64_t(1) << 24;
  int64_t nb = std::min(std::max<int64_t>(1, 128 / std::max<int64_t>(BS, 1)), W);
  nb = std::max<int64_t>(1, std::min(nb, kCap / std::max<int64_t>(1, BS * Hkv * Cw)));
  const int64_t K = nb * BS, Wp = (W + nb - 1) / nb * nb, n_chunks = Wp / nb;
  const int64_t Tq = std::max<int64_t>(1, std::min({T, int64_t(64), kCap / std::max<int64_t>(1, K * Hkv * Cw)}));
  const int64_t n_tiles = (T + Tq - 1) / Tq, Tp = n_tiles * Tq;
  Value bt_t = RowGather(b, b.Convert(bt, ET::S64), r);  // [T, W]
  if (Wp != W) bt_t = b.Pad(bt_t, b.Zeros(Type(ET::S64, {})), {0, 0}, {0, Wp - W}, {0, 0});

  ET ct = q.et() == ET::F64 ? ET::F64 : ET::F32;
  Value q4 = b.Reshape(q, {T, Hkv, G, D});
  if (q.et() != cache.et()) q4 = Cast(b, q4, cache.et());
  // padding rows: not valid, they read nothing
  q4 = PadRows(b, q4, Tp, 0);
  pos = PadRows(b, pos, Tp, 0);
  lo = PadRows(b, lo, Tp, 0);
  bt_t = PadRows(b, bt_t, Tp, 0);
  valid = PadRows(b, valid, Tp, 0);
  Value scale = c.num_arg(5, ct);
  std::optional<Value> sink;
  if (c.has(8)) sink = b.Reshape(Cast(b, c.t(8), ct), {Hkv, G});
  const double kNegBig = -1e30;
  Value s64 = b.Zeros(Type(ET::S64, {}));

  // One tile of n rows: q [n, Hkv, G, D], pos/lo/valid [n], table rows [n, Wp] -> [n, Hkv, G, Dv].
  auto tile = [&](Builder& b, Value qt, Value post, Value lot, Value validt, Value btt, int64_t n) {
    Type mt(ct, {n, Hkv, G}), at(ct, {n, Hkv, G, Dv});
    // chunks [start, end) that the tile's valid rows need
    Value Ks = b.Splat(Type(ET::S64, {n}), (double)K);
    Value last = b.Splat(Type(ET::S64, {n}), (double)n_chunks);
    Value need = b.Div(b.Add(post, Ks), Ks);  // ceil((pos+1)/K)
    need = b.Select(validt, b.Min(need, last), b.Zeros(need.type));
    Value first = b.Select(validt, b.Div(lot, Ks), last);
    Value end = b.Reduce(need, s64, {0}, "maximum");
    Value start = b.Min(b.Reduce(first, b.Splat(Type(ET::S64, {}), (double)n_chunks), {0}, "minimum"), end);

    hlo::Region cond, body;
    cond.arg_types = {Type(ET::S64, {}), mt, mt, at};
    cond.body = [end](Builder& b, const std::vector<Value>& a) {
      return std::vector<Value>{b.Compare(a[0], end, "LT")};
    };
    body.arg_types = cond.arg_types;
    body.body = [&, mt, at, n](Builder& b, const std::vector<Value>& a) {
      Value j = a[0], m = a[1], l = a[2], acc = a[3];
      Value col = b.Mul(j, b.Splat(Type(ET::S64, {}), (double)nb));
      Value blk = b.Op1("stablehlo.dynamic_slice", {btt, s64, col}, Type(ET::S64, {n, nb}),
                        "slice_sizes = " + hlo::I64Array({n, nb}));
      Value idx = b.Reshape(blk, {n, nb, 1});
      Value kv = b.Op1("stablehlo.gather", {cache, idx}, Type(cache.et(), {n, nb, BS, Hkv, Cw}),
                       "dimension_numbers = #stablehlo.gather<offset_dims = [2, 3, 4], collapsed_slice_dims = [0], "
                       "start_index_map = [0], index_vector_dim = 2>, slice_sizes = " +
                           hlo::I64Array({1, BS, Hkv, Cw}) + ", indices_are_sorted = false");
      kv = b.Reshape(kv, {n, K, Hkv, Cw});
      Value k = b.SliceDim(kv, 3, 0, D), v = Cast(b, b.SliceDim(kv, 3, D, Cw), ct);
      // key positions of this chunk, and which of them each row sees
      Value kpos = b.Add(b.Broadcast(b.Mul(col, b.Splat(Type(ET::S64, {}), (double)BS)), {n, K}, {}),
                         b.Iota(Type(ET::S64, {n, K}), 1));
      Value see = b.Binary("and", b.Compare(kpos, b.Broadcast(post, {n, K}, {0}), "LE"),
                           b.Compare(kpos, b.Broadcast(lot, {n, K}, {0}), "GE"));
      see = b.Binary("and", see, b.Broadcast(validt, {n, K}, {0}));
      Value s = DotG(b, qt, k, {0, 1}, {0, 2}, {3}, {3}, ct);  // [n, Hkv, G, K]
      s = b.Mul(s, b.Broadcast(scale, s.dims(), {}));
      if (cap != 0) {
        Value cv = b.Splat(s.type, cap);
        s = b.Mul(b.Unary("tanh", b.Div(s, cv)), cv);
      }
      s = b.Select(b.Broadcast(see, s.dims(), {0, 3}), s,
                   b.Splat(s.type, -std::numeric_limits<double>::infinity()));
      Value mn = b.Max(m, b.Reduce(s, b.Splat(Type(ct, {}), kNegBig), {3}, "maximum"));
      Value p = b.Unary("exponential", b.Sub(s, b.Broadcast(mn, s.dims(), {0, 1, 2})));
      Value alpha = b.Unary("exponential", b.Sub(m, mn));
      Value ln = b.Add(b.Mul(l, alpha), b.Reduce(p, b.Zeros(Type(ct, {})), {3}, "add"));
      // values of unseen keys may be anything (stale or empty blocks): zero them
      v = b.Select(b.Broadcast(see, v.dims(), {0, 1}), v, b.Zeros(v.type));
      Value pv = DotG(b, p, v, {0, 1}, {0, 2}, {3}, {1}, ct);  // [n, Hkv, G, Dv]
      Value accn = b.Add(b.Mul(acc, b.Broadcast(alpha, at.dims, {0, 1, 2})), pv);
      return std::vector<Value>{b.Add(j, b.Splat(Type(ET::S64, {}), 1.0)), mn, ln, accn};
    };
    std::vector<Value> res = b.Op("stablehlo.while", {start, b.Splat(mt, kNegBig), b.Zeros(mt), b.Zeros(at)},
                                  {Type(ET::S64, {}), mt, mt, at}, "", {cond, body});
    Value m = res[1], l = res[2], acc = res[3];
    if (sink) {  // attention sinks: one logit per head in every denominator
      Value sk = b.Broadcast(*sink, mt.dims, {1, 2});
      Value mf = b.Max(m, sk);
      Value alpha = b.Unary("exponential", b.Sub(m, mf));
      l = b.Add(b.Mul(l, alpha), b.Unary("exponential", b.Sub(sk, mf)));
      acc = b.Mul(acc, b.Broadcast(alpha, at.dims, {0, 1, 2}));
    }
    Value pos_l = b.Compare(l, b.Zeros(mt), "GT");
    Value safe = b.Select(pos_l, l, b.Splat(mt, 1.0));
    Value out = b.Div(acc, b.Broadcast(safe, at.dims, {0, 1, 2}));
    return b.Select(b.Broadcast(pos_l, at.dims, {0, 1, 2}), out, b.Zeros(at));
  };

  Value out;
  if (n_tiles == 1) {
    out = tile(b, q4, pos, lo, valid, bt_t, T);
  } else {
    Type ot4(ct, {Tp, Hkv, G, Dv});
    hlo::Region cond, body;
    cond.arg_types = {Type(ET::S64, {}), ot4};
    cond.body = [n_tiles](Builder& b, const std::vector<Value>& a) {
      return std::vector<Value>{b.Compare(a[0], b.Splat(Type(ET::S64, {}), (double)n_tiles), "LT")};
    };
    body.arg_types = cond.arg_types;
    body.body = [&](Builder& b, const std::vector<Value>& a) {
      Value row = b.Mul(a[0], b.Splat(Type(ET::S64, {}), (double)Tq));
      auto rows = [&](Value v) { return Rows(b, v, row, Tq); };
      Value res = tile(b, rows(q4), rows(pos), rows(lo), rows(valid), rows(bt_t), Tq);
      Value upd = PutRows(b, a[1], res, row);
      return std::vector<Value>{b.Add(a[0], b.Splat(Type(ET::S64, {}), 1.0)), upd};
    };
    out = b.Op("stablehlo.while", {s64, b.Zeros(ot4)}, {Type(ET::S64, {}), ot4}, "", {cond, body})[1];
    out = b.SliceDim(out, 0, 0, T);
  }
  return {Cast(b, b.Reshape(out, {T, H, Dv}), ot.et)};
}
TT_LOWERINGS(({"torchtpu::paged_attention"}), PagedAttention);

}  // namespace
}  // namespace tt::ops
