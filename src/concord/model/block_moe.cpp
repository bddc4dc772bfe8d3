// The Qwen3-MoE layer (HF's Qwen3MoeSparseMoeBlock): the common attention half (block_layer.h),
// then a router and top-k SwiGLU experts in place of the dense MLP. Forward and backward side by
// side.
//
// Forward, per token t (T rows of xn2):
//   logits = xn2 · Wrᵀ                   fp32 GEMM (tensor::gemm), never quantized (its own class)
//   p = softmax(logits)                   in double, stored in fp32 (HF: fp32 softmax)
//   S = the k experts of largest p, ties to the lower expert index (torch.topk documents none)
//   w_j = p_j, or p_j / Σ_S p when norm_topk_prob
//   out_t = Σ_{e in S, ascending e} w_e · down_e(silu(gate_e(x_t)) ⊙ up_e(x_t))   summed in double
// Each expert's GEMMs see the rows of the tokens routed to it (gathered in ascending t), under the
// policy's mlp precision of the layer; the batch-invariant GEMM keeps a row's result independent of
// the other rows, and quantizers whose scale spans rows run per sequence (row_splits), as the
// dense layer's do. A decode step reads only the selected experts' weights.
//
// Backward: the gradient flows through the selected experts and the router's softmax (top-k is
// piecewise constant): d w_e = <dout_t, y_e>, d p via the renormalisation when on, d logits =
// p ⊙ (dp − <dp, p>), then the router GEMM's dgrad and wgrad in fp32. An expert no token chose gets
// a zero gradient. Every sum runs in a fixed order, so results do not depend on the thread count.
#include <algorithm>
#include <array>
#include <utility>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include <fmt/format.h>
#include <xxhash.h>

#include "concord/model/block_layer.h"
#include "concord/model/expert_pager.h"
#include "concord/numerics/check.h"
#include "concord/tensor/gemm.h"

namespace concord::model {

// An MoE layer's routing and expert activations for one application (LayerActivations::moe).
struct MoeActivations {
  int64_t E = 0, k = 0, R = 0;      // experts, experts per token, gathered rows (T·k)
  float* logits = nullptr;          // (T, E) router logits
  float* probs = nullptr;           // (T, E) softmax
  std::vector<int32_t> selected;    // (T, k) expert ids, ascending id within a token
  std::vector<float> weight;        // (T, k) combine weights, same order
  std::vector<int64_t> begin;       // (E + 1) first gathered row of each expert
  std::vector<int32_t> token;       // (R) the token of each gathered row
  std::vector<int64_t> row_of;      // (T, k) the gathered row of (t, j)
  float* x = nullptr;               // (R, C) gathered xn2 rows
  float* gate = nullptr;            // (R, Fm)
  float* up = nullptr;              // (R, Fm)
  float* h = nullptr;               // (R, Fm) silu(gate) ⊙ up
  float* y = nullptr;               // (R, C) expert outputs
};

namespace {

using tensor::Trans;

// ExpertParallel's re-placement between passes (model.h): the next placement from the window's
// loads, each newly held expert sent by its lowest current holder and content-checked against its
// hash as loaded, the experts no longer held released. Every rank runs it at the same pass.
void replan_experts(Model::Impl& m, ExpertParallel& ep) {
  const auto t0 = std::chrono::steady_clock::now();
  const ModelConfig& c = m.config;
  const std::vector<std::vector<std::vector<int64_t>>> next = ep.plan(ep.window);
  if (next.size() != ep.rank_experts.size())
    throw InputError(fmt::format("[expert parallel] a re-placement of {} applications, the model has {}", next.size(),
                                 ep.rank_experts.size()));
  struct Move {
    int64_t app, expert;
    int src, dst;
  };
  std::vector<Move> moves;
  auto holds = [](const std::vector<int64_t>& slots, int64_t e) { return std::find(slots.begin(), slots.end(), e) != slots.end(); };
  for (size_t app = 0; app < next.size(); ++app) {
    if (next[app].empty()) continue;
    const auto& cur = ep.rank_experts[app];
    if (static_cast<int>(next[app].size()) != ep.ranks || static_cast<int>(cur.size()) != ep.ranks)
      throw InputError(fmt::format("[expert parallel] application {}: a placement for {} ranks, {} run", app, next[app].size(),
                                   ep.ranks));
    for (int q = 0; q < ep.ranks; ++q) {
      std::vector<int64_t> want = next[app][static_cast<size_t>(q)];
      std::sort(want.begin(), want.end());
      want.erase(std::unique(want.begin(), want.end()), want.end());
      for (int64_t e : want) {
        if (holds(cur[static_cast<size_t>(q)], e)) continue;
        int src = 0;
        while (src < ep.ranks && !holds(cur[static_cast<size_t>(src)], e)) ++src;
        if (src == ep.ranks)
          throw InputError(fmt::format("[expert parallel] expert {} of application {} is held by no rank", e, app));
        moves.push_back({static_cast<int64_t>(app), e, src, q});
      }
    }
  }
  for (const Move& mv : moves) {
    if (ep.rank != mv.src && ep.rank != mv.dst) continue;
    const int64_t block = c.block_of(mv.app);
    std::vector<uint8_t> bytes;
    if (ep.rank == mv.src) bytes = m.expert_bytes(block, mv.expert);
    ep.send_recv(mv.src, mv.dst, bytes);
    if (ep.rank != mv.dst) continue;
    if (ep.corrupt_next_move && !bytes.empty()) {
      bytes[bytes.size() / 2] ^= 1;
      ep.corrupt_next_move = false;
    }
    const uint64_t got = XXH3_64bits(bytes.data(), bytes.size());
    const uint64_t want = ep.expert_hash.at(static_cast<size_t>(mv.app)).at(static_cast<size_t>(mv.expert));
    if (got != want)
      throw InputError(fmt::format("[expert parallel] expert {} of MoE layer {} received from rank {}: content hash {:016x}, "
                                   "the loaded weights' is {:016x} (weight-sync content check failed)",
                                   mv.expert, block, mv.src, got, want));
    m.set_expert_bytes(block, mv.expert, bytes);
    ++ep.moved_in;
    ep.moved_bytes += static_cast<int64_t>(bytes.size());
  }
  for (size_t app = 0; app < next.size(); ++app) {
    if (next[app].empty()) continue;
    for (int64_t e : ep.rank_experts[app][static_cast<size_t>(ep.rank)])
      if (!holds(next[app][static_cast<size_t>(ep.rank)], e) && m.holds_expert_values(c.block_of(static_cast<int64_t>(app)), e))
        m.release_expert(c.block_of(static_cast<int64_t>(app)), e);
  }
  ep.rank_experts = next;
  for (auto& w : ep.window) std::fill(w.begin(), w.end(), 0);
  ep.passes_since_plan = 0;
  ++ep.replans;
  ep.move_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The experts block `block`'s router picks for the rows xn (T, C) — the next MoE layer's router
// applied to this layer's input, a prediction of what it will pick (the residual stream changes
// little between layers) — most picked first, ties to the lower expert. For the prefetcher only:
// nothing computed from it reaches an output.
std::vector<int64_t> predicted_experts(Model::Impl& m, const float* xn, int64_t T, int64_t block) {
  const ModelConfig& c = m.config;
  const int64_t E = c.num_experts, k = c.num_experts_per_tok, C = c.hidden_size;
  std::vector<float> logits(static_cast<size_t>(T * E));
  tensor::gemm(Trans::no, Trans::yes, T, E, C, xn, C,
               m.values[static_cast<size_t>(m.layers[static_cast<size_t>(block)].router)].data(), C, logits.data(), E);
  std::vector<int64_t> count(static_cast<size_t>(E), 0);
  std::vector<int64_t> ids(static_cast<size_t>(E));
  auto score = [](float v) { return std::isnan(v) ? -INFINITY : v; };
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits.data() + t * E;
    std::iota(ids.begin(), ids.end(), int64_t{0});
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int64_t x, int64_t y) {
      return score(l[x]) != score(l[y]) ? score(l[x]) > score(l[y]) : x < y;
    });
    for (int64_t j = 0; j < k; ++j) ++count[static_cast<size_t>(ids[static_cast<size_t>(j)])];
  }
  std::vector<int64_t> picked;
  for (int64_t e = 0; e < E; ++e)
    if (count[static_cast<size_t>(e)] > 0) picked.push_back(e);
  std::stable_sort(picked.begin(), picked.end(),
                   [&](int64_t x, int64_t y) { return count[static_cast<size_t>(x)] > count[static_cast<size_t>(y)]; });
  return picked;
}

// One expert's blocks for the duration of its GEMMs: acquired from the pager (expert_pager.h) and
// put in place of the model's unloaded placeholders, then put back and released. No pager: nothing.
class PagedIn {
 public:
  PagedIn(Model::Impl& m, ExpertPager* pager, int64_t block, int64_t expert, std::array<int, 3> params)
      : m_(m), pager_(pager), block_(block), expert_(expert), params_(params) {
    if (!pager_) return;
    const ExpertPager::Weights w = pager_->acquire(block_, expert_);
    for (size_t j = 0; j < 3; ++j) {
      saved_[j] = std::exchange(m_.stored[static_cast<size_t>(params_[j])], w[j]);
    }
  }
  ~PagedIn() {
    if (!pager_) return;
    for (size_t j = 0; j < 3; ++j) m_.stored[static_cast<size_t>(params_[j])] = std::move(saved_[j]);
    pager_->release(block_, expert_);
  }
  PagedIn(const PagedIn&) = delete;
  PagedIn& operator=(const PagedIn&) = delete;

 private:
  Model::Impl& m_;
  ExpertPager* pager_;
  int64_t block_, expert_;
  std::array<int, 3> params_;
  std::array<std::shared_ptr<const tensor::QuantWeight>, 3> saved_;
};

class MoeBlock final : public LayerBlock {
 public:
  explicit MoeBlock(int layer) : LayerBlock(layer) {}
  std::string_view kind() const override { return "moe"; }

 private:
  float* mlp_forward(Model::Impl& m, const BlockPass& p, LayerActivations& a) const override {
    const ModelConfig& c = m.config;
    const int64_t T = p.T, C = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok;
    const int64_t Fm = c.moe_intermediate_size;
    const LayerParams& lp = params(m);
    tensor::Arena& work = *p.work;
    a.moe = std::make_shared<MoeActivations>();
    MoeActivations& r = *a.moe;
    if (ExpertParallel* rp = m.ep.get(); rp && rp->replan_every > 0) {  // ExpertParallel: re-placement
      if (rp->window.size() != static_cast<size_t>(c.applications()))
        rp->window.assign(static_cast<size_t>(c.applications()), std::vector<int64_t>(static_cast<size_t>(E), 0));
      if (p.application == first_moe_application(c)) {
        if (rp->passes_since_plan >= rp->replan_every) replan_experts(m, *rp);
        ++rp->passes_since_plan;
      }
    }
    r.E = E;
    r.k = k;
    r.R = T * k;

    r.logits = work.alloc(T * E);
    tensor::gemm(Trans::no, Trans::yes, T, E, C, a.xn2, C, m.values[static_cast<size_t>(lp.router)].data(), C,
                 r.logits, E);
    r.probs = work.alloc(T * E);
    r.selected.assign(static_cast<size_t>(T * k), 0);
    r.weight.assign(static_cast<size_t>(T * k), 0.0f);
#pragma omp parallel for schedule(static) if (T > 64)
    for (int64_t t = 0; t < T; ++t) route(c, r, t);

    // Gather: each expert's rows in ascending token order.
    r.begin.assign(static_cast<size_t>(E + 1), 0);
    for (int32_t e : r.selected) ++r.begin[static_cast<size_t>(e) + 1];
    std::partial_sum(r.begin.begin(), r.begin.end(), r.begin.begin());
    std::vector<int64_t> cursor(r.begin.begin(), r.begin.end() - 1);
    if (m.router_stats_on) {  // Model::router_stats
      std::vector<int64_t>& counts = m.router_counts.at(static_cast<size_t>(p.application));
      counts.resize(static_cast<size_t>(E), 0);
      for (int64_t e = 0; e < E; ++e) counts[static_cast<size_t>(e)] += r.begin[static_cast<size_t>(e) + 1] - r.begin[static_cast<size_t>(e)];
      if (p.application == first_moe_application(c)) m.router_rows += T;
    }
    if (ExpertParallel* rp = m.ep.get(); rp && rp->replan_every > 0) {
      std::vector<int64_t>& w = rp->window[static_cast<size_t>(p.application)];
      for (int64_t e = 0; e < E; ++e) w[static_cast<size_t>(e)] += r.begin[static_cast<size_t>(e) + 1] - r.begin[static_cast<size_t>(e)];
    }
    if (m.router_trace_on) {  // Model::router_trace
      const auto app = static_cast<size_t>(p.application);
      m.router_trace.selected.at(app).insert(m.router_trace.selected[app].end(), r.selected.begin(), r.selected.end());
      m.router_trace.pass_rows.at(app).push_back(T);
    }
    r.token.assign(static_cast<size_t>(r.R), 0);
    r.row_of.assign(static_cast<size_t>(r.R), 0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const auto e = static_cast<size_t>(r.selected[static_cast<size_t>(t * k + j)]);
        const int64_t row = cursor[e]++;
        r.token[static_cast<size_t>(row)] = static_cast<int32_t>(t);
        r.row_of[static_cast<size_t>(t * k + j)] = row;
      }
    r.x = work.alloc(r.R * C);
    for (int64_t row = 0; row < r.R; ++row)
      std::memcpy(r.x + row * C, a.xn2 + int64_t{r.token[static_cast<size_t>(row)]} * C, sizeof(float) * static_cast<size_t>(C));
    if (m.ep && m.ep->data_parallel) {  // this rank's rows to their experts' ranks and back
      r.y = work.alloc(r.R * C);
      dispatch_and_combine(m, p.application, &r);
      return combine(r, T, C, work);
    }
    r.gate = work.alloc(r.R * Fm);
    r.up = work.alloc(r.R * Fm);
    r.h = work.alloc(r.R * Fm);
    r.y = work.alloc(r.R * C);

    // The experts' GEMMs; the forward-kernel hook sees each gathered row's own position.
    std::vector<int32_t> gathered_pos;
    if (m.row_positions != nullptr) {
      gathered_pos.resize(static_cast<size_t>(r.R));
      for (int64_t row = 0; row < r.R; ++row) gathered_pos[static_cast<size_t>(row)] = m.row_positions[r.token[static_cast<size_t>(row)]];
    }
    const int32_t* saved_pos = m.row_positions;
    const LayerPrecision& mlp = mlp_precision(m);
    // Expert parallelism: this rank's pieces of the experts' rows only, then the exchange fills
    // the others' rows.
    ExpertParallel* ep = m.ep.get();
    struct Piece {
      int64_t expert, first, last;
    };
    std::vector<Piece> mine;
    std::vector<ExpertParallel::RowRanges> pieces;
    if (ep) {
      pieces.resize(static_cast<size_t>(ep->ranks));
      const auto app = static_cast<size_t>(p.application);
      if (ep->rank_experts.empty()) {  // the contiguous split: one piece per expert of the rank
        for (int q = 0; q < ep->ranks; ++q)
          for (int64_t e = ep->first_expert(E, q); e < ep->first_expert(E, q + 1); ++e) {
            const int64_t b = r.begin[static_cast<size_t>(e)], last = r.begin[static_cast<size_t>(e) + 1];
            if (last == b) continue;
            pieces[static_cast<size_t>(q)].push_back({b, last});
            if (q == ep->rank) mine.push_back({e, b, last});
          }
      } else if (ep->split) {  // a placement and another split (the balanced router)
        std::vector<int64_t> counts(static_cast<size_t>(E));
        for (int64_t e = 0; e < E; ++e) counts[static_cast<size_t>(e)] = r.begin[static_cast<size_t>(e) + 1] - r.begin[static_cast<size_t>(e)];
        const auto shares = ep->split(static_cast<int64_t>(app), counts);
        if (static_cast<int64_t>(shares.size()) != E)
          throw InputError(fmt::format("[ep] the split gave {} experts' shares, the layer has {}", shares.size(), E));
        for (int64_t e = 0; e < E; ++e) {
          const std::vector<int64_t>& own = ep->rank_experts[app][static_cast<size_t>(ep->rank)];
          int64_t at = r.begin[static_cast<size_t>(e)];
          for (const auto& [q, n] : shares[static_cast<size_t>(e)]) {
            if (q < 0 || q >= ep->ranks || n < 0)
              throw InputError(fmt::format("[ep] the split gave expert {} to rank {} ({} rows)", e, q, n));
            const auto& held = ep->rank_experts[app][static_cast<size_t>(q)];
            if (n > 0 && std::find(held.begin(), held.end(), e) == held.end())
              throw InputError(fmt::format("[ep] the split gave expert {}'s rows to rank {}, which does not hold it", e, q));
            if (n == 0) continue;
            pieces[static_cast<size_t>(q)].push_back({at, at + n});
            if (q == ep->rank) {
              CONCORD_CHECK(std::find(own.begin(), own.end(), e) != own.end(), "a split piece of an expert not held here");
              mine.push_back({e, at, at + n});
            }
            at += n;
          }
          if (at != r.begin[static_cast<size_t>(e) + 1])
            throw InputError(fmt::format("[ep] the split gave expert {} {} rows of {}", e, at - r.begin[static_cast<size_t>(e)],
                                         counts[static_cast<size_t>(e)]));
        }
      } else {  // a placement: an expert's rows split among its holders in order
        std::vector<std::vector<int>> holders(static_cast<size_t>(E));
        for (int q = 0; q < ep->ranks; ++q)
          for (int64_t e : ep->rank_experts[app][static_cast<size_t>(q)]) holders[static_cast<size_t>(e)].push_back(q);
        for (int64_t e = 0; e < E; ++e) {
          const int64_t b = r.begin[static_cast<size_t>(e)], n = r.begin[static_cast<size_t>(e) + 1] - b;
          const auto& h = holders[static_cast<size_t>(e)];
          const auto c_e = static_cast<int64_t>(h.size());
          for (int64_t i = 0; i < c_e; ++i) {
            const int64_t first = b + n * i / c_e, last = b + n * (i + 1) / c_e;
            if (last == first) continue;
            pieces[static_cast<size_t>(h[static_cast<size_t>(i)])].push_back({first, last});
            if (h[static_cast<size_t>(i)] == ep->rank) mine.push_back({e, first, last});
          }
        }
      }
    } else {
      for (int64_t e = 0; e < E; ++e)
        if (r.begin[static_cast<size_t>(e) + 1] > r.begin[static_cast<size_t>(e)])
          mine.push_back({e, r.begin[static_cast<size_t>(e)], r.begin[static_cast<size_t>(e) + 1]});
    }
    // Experts under a memory cap (expert_pager.h): the resident experts first while the
    // prefetcher reads the rest, and the next MoE layer's predicted experts behind them. Each
    // expert writes its own rows, so the order changes no bit.
    ExpertPager* pager = m.pager.get();
    if (pager) {
      std::vector<int64_t> want;
      for (const Piece& piece : mine) want.push_back(piece.expert);
      int64_t next_block = -1;
      std::vector<int64_t> next;
      const auto next_app = static_cast<size_t>(p.application) + 1;
      // (No prediction when the next layer's experts are all resident: nothing to read.)
      if (pager->prefetch() && next_app < m.plan.size() && c.is_moe_layer(m.plan[next_app].block) &&
          !pager->all_resident(m.plan[next_app].block)) {
        next_block = m.plan[next_app].block;
        next = predicted_experts(m, a.xn2, T, next_block);
      }
      const std::vector<int64_t> order = pager->expect(layer_, want, next_block, next);
      std::vector<int64_t> piece_of(static_cast<size_t>(E), -1);  // no expert parallelism: a piece per expert
      for (size_t i = 0; i < mine.size(); ++i) piece_of[static_cast<size_t>(mine[i].expert)] = static_cast<int64_t>(i);
      std::vector<Piece> by_order;
      for (int64_t e : order) {
        CONCORD_CHECK(piece_of[static_cast<size_t>(e)] >= 0, "the pager ordered an expert the layer does not compute");
        by_order.push_back(mine[static_cast<size_t>(piece_of[static_cast<size_t>(e)])]);
      }
      CONCORD_CHECK(by_order.size() == mine.size(), "the pager's order lost an expert");
      mine = std::move(by_order);
    }
    const auto t_experts = std::chrono::steady_clock::now();
    int64_t computed = 0;
    for (const Piece& piece : mine) {
      const int64_t e = piece.expert, b = piece.first, n = piece.last - piece.first;
      const int64_t skip = b - r.begin[static_cast<size_t>(e)];
      std::vector<int64_t> splits = expert_splits(r, p.row_splits, e);
      for (int64_t& s : splits) s = std::clamp<int64_t>(s - skip, 0, n);  // a replica's share: its own rows
      m.row_positions = gathered_pos.empty() ? nullptr : gathered_pos.data() + b;
      const size_t ei = static_cast<size_t>(e);
      PagedIn paged(m, pager, layer_, e, {lp.expert_gate[ei], lp.expert_up[ei], lp.expert_down[ei]});
      m.linear_forward_rows(mlp, lp.expert_gate[ei], r.x + b * C, n, r.gate + b * Fm, splits);
      m.linear_forward_rows(mlp, lp.expert_up[ei], r.x + b * C, n, r.up + b * Fm, splits);
      swiglu_forward(r.h + b * Fm, r.gate + b * Fm, r.up + b * Fm, n, Fm);
      m.linear_forward_rows(mlp, lp.expert_down[ei], r.h + b * Fm, n, r.y + b * C, splits);
      computed += n;
    }
    m.row_positions = saved_pos;
    if (ep) {
      auto seconds_since = [](std::chrono::steady_clock::time_point t) {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
      };
      double compute = seconds_since(t_experts);
      if (ep->slow_factor > 1.0) {  // a slower device: busy for (factor - 1) times as long again
        const double until = compute * ep->slow_factor;
        while ((compute = seconds_since(t_experts)) < until) {
        }
      }
      const auto t_exchange = std::chrono::steady_clock::now();
      ep->exchange(r.y, pieces, C);
      ExpertParallel::Layer& l = ep->layers.at(static_cast<size_t>(p.application));
      const double exchange = seconds_since(t_exchange);
      l.exchange_s += exchange;
      l.compute_s += compute;
      l.pass_compute_s.push_back(compute);
      l.pass_exchange_s.push_back(exchange);
      l.rows += computed;
      l.layer_rows += r.R;
      ++l.passes;
    }

    return combine(r, T, C, work);
  }

  // out_t = Σ_j w_tj · y[row_of(t, j)], in double, j ascending (the experts' ascending ids).
  static float* combine(const MoeActivations& r, int64_t T, int64_t C, tensor::Arena& work) {
    const int64_t k = r.k;
    float* out = work.alloc(T * C);
#pragma omp parallel for schedule(static) if (T * C > 65536)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t col = 0; col < C; ++col) {
        double acc = 0.0;
        for (int64_t j = 0; j < k; ++j) {
          const size_t tj = static_cast<size_t>(t * k + j);
          acc += static_cast<double>(r.weight[tj]) * static_cast<double>(r.y[r.row_of[tj] * C + col]);
        }
        out[t * C + col] = static_cast<float>(acc);
      }
    return out;
  }

  void expert_parallel_idle(Model::Impl& m, int application) const override { dispatch_and_combine(m, application, nullptr); }

  // Data-parallel attention (ExpertParallel::data_parallel, model.h): r's gathered rows (nullptr:
  // none, an idle pass) go to the ranks computing their experts, this rank's experts run on the
  // rows every rank sent, and the outputs come back into r->y. A parcel to a rank is
  //   u64 pieces, then per piece (i64 expert, i64 rows), then the pieces' rows (C floats each);
  // the reply is the outputs of the same pieces in the same order.
  void dispatch_and_combine(Model::Impl& m, int application, MoeActivations* r) const {
    ExpertParallel& ep = *m.ep;
    const ModelConfig& c = m.config;
    const int64_t C = c.hidden_size, E = c.num_experts, Fm = c.moe_intermediate_size;
    const auto app = static_cast<size_t>(application);
    const auto R = static_cast<size_t>(ep.ranks);
    const LayerPrecision& mlp = mlp_precision(m);
    if (m.forward_kernel)
      throw InputError("[model] data-parallel attention with a forward-kernel variant: the rows of other ranks have no "
                       "positions here");
    if (!rows_quantized_independently(mlp[GemmRole::forward].a))
      throw InputError("[model] data-parallel attention needs row-local activation quantizers (a row's expert output "
                       "must not depend on the rows of other ranks beside it); not NVFP4, per-tensor FP8 or stochastic");
    auto seconds_since = [](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    };
    std::vector<std::vector<size_t>> holders(static_cast<size_t>(E));
    for (size_t q = 0; q < R; ++q) {
      if (ep.rank_experts.empty()) {
        for (int64_t e = ep.first_expert(E, static_cast<int>(q)); e < ep.first_expert(E, static_cast<int>(q) + 1); ++e)
          holders[static_cast<size_t>(e)].push_back(q);
      } else {
        for (int64_t e : ep.rank_experts[app][q]) holders[static_cast<size_t>(e)].push_back(q);
      }
    }
    struct Piece {
      int64_t expert, first, last;
    };
    std::vector<std::vector<Piece>> to(R);
    if (r)
      for (int64_t e = 0; e < E; ++e) {
        const int64_t b = r->begin[static_cast<size_t>(e)], n = r->begin[static_cast<size_t>(e) + 1] - b;
        const std::vector<size_t>& h = holders[static_cast<size_t>(e)];
        const auto c_e = static_cast<int64_t>(h.size());
        for (int64_t i = 0; i < c_e; ++i) {
          const int64_t first = b + n * i / c_e, last = b + n * (i + 1) / c_e;
          if (last > first) to[h[static_cast<size_t>(i)]].push_back({e, first, last});
        }
      }
    const auto row_bytes = static_cast<size_t>(C) * sizeof(float);
    ExpertParallel::Parcels send(R);
    for (size_t q = 0; q < R; ++q) {
      std::vector<uint8_t>& out = send[q];
      int64_t rows = 0;
      for (const Piece& pc : to[q]) rows += pc.last - pc.first;
      out.resize(8 + 16 * to[q].size() + static_cast<size_t>(rows) * row_bytes);
      const uint64_t pieces = to[q].size();
      std::memcpy(out.data(), &pieces, 8);
      size_t at = 8, data = 8 + 16 * to[q].size();
      for (const Piece& pc : to[q]) {
        const int64_t head[2] = {pc.expert, pc.last - pc.first};
        std::memcpy(out.data() + at, head, 16);
        at += 16;
        const size_t n = static_cast<size_t>(pc.last - pc.first) * row_bytes;
        std::memcpy(out.data() + data, r->x + pc.first * C, n);
        data += n;
      }
      if (q != static_cast<size_t>(ep.rank)) ep.rows_sent += rows;
    }
    auto t_exchange = std::chrono::steady_clock::now();
    const ExpertParallel::Parcels got = ep.alltoallv(send);
    double exchange = seconds_since(t_exchange);
    if (got.size() != R) throw InputError(fmt::format("[ep] the all-to-all returned {} parcels for {} ranks", got.size(), R));

    // What each rank sent this one: its pieces, where their rows are, where their outputs go.
    struct In {
      size_t src;
      int64_t expert, rows;
      size_t x_at, y_at;  // byte offset of the rows in got[src]; row offset in reply[src]
    };
    std::vector<In> ins;
    std::vector<int64_t> reply_rows(R, 0);
    for (size_t q = 0; q < R; ++q) {
      const std::vector<uint8_t>& in = got[q];
      auto malformed = [&](const char* what) {
        return InputError(fmt::format("[ep] rank {}: the rows from rank {} are malformed ({})", ep.rank, q, what));
      };
      if (in.size() < 8) throw malformed("no header");
      uint64_t pieces = 0;
      std::memcpy(&pieces, in.data(), 8);
      if (pieces > static_cast<uint64_t>(E) || 8 + 16 * pieces > in.size()) throw malformed("a piece count past its end");
      size_t data = 8 + 16 * static_cast<size_t>(pieces);
      for (size_t i = 0; i < pieces; ++i) {
        int64_t head[2];
        std::memcpy(head, in.data() + 8 + 16 * i, 16);
        const int64_t e = head[0], n = head[1];
        if (e < 0 || e >= E || n <= 0) throw malformed("a piece of an unknown expert or no rows");
        const std::vector<size_t>& h = holders[static_cast<size_t>(e)];
        if (std::find(h.begin(), h.end(), static_cast<size_t>(ep.rank)) == h.end())
          throw malformed("rows of an expert this rank does not hold");
        if (static_cast<size_t>(n) > (in.size() - data) / row_bytes) throw malformed("rows past its end");
        ins.push_back({q, e, n, data, static_cast<size_t>(reply_rows[q])});
        data += static_cast<size_t>(n) * row_bytes;
        reply_rows[q] += n;
      }
      if (data != in.size()) throw malformed("trailing bytes");
      if (q != static_cast<size_t>(ep.rank)) ep.rows_received += reply_rows[q];
    }

    // Each expert this rank holds, once, on its rows from every rank in rank order (the rows'
    // positions are other ranks': none here, and no kernel variant reads them).
    const LayerParams& lp = params(m);
    const int32_t* saved_pos = m.row_positions;
    m.row_positions = nullptr;
    std::vector<std::vector<float>> reply(R);
    for (size_t q = 0; q < R; ++q) reply[q].resize(static_cast<size_t>(reply_rows[q] * C));
    std::stable_sort(ins.begin(), ins.end(), [](const In& a, const In& b) { return a.expert < b.expert; });
    const auto t_experts = std::chrono::steady_clock::now();
    int64_t computed = 0;
    std::vector<float> x, gate, up, h, y;
    for (size_t i = 0; i < ins.size();) {
      size_t j = i;
      int64_t n = 0;
      while (j < ins.size() && ins[j].expert == ins[i].expert) n += ins[j++].rows;
      const int64_t e = ins[i].expert;
      x.resize(static_cast<size_t>(n * C));
      gate.resize(static_cast<size_t>(n * Fm));
      up.resize(gate.size());
      h.resize(gate.size());
      y.resize(x.size());
      int64_t row = 0;
      for (size_t u = i; u < j; ++u) {
        std::memcpy(x.data() + row * C, got[ins[u].src].data() + ins[u].x_at, static_cast<size_t>(ins[u].rows) * row_bytes);
        row += ins[u].rows;
      }
      const size_t ei = static_cast<size_t>(e);
      m.linear_forward_rows(mlp, lp.expert_gate[ei], x.data(), n, gate.data(), {});
      m.linear_forward_rows(mlp, lp.expert_up[ei], x.data(), n, up.data(), {});
      swiglu_forward(h.data(), gate.data(), up.data(), n, Fm);
      m.linear_forward_rows(mlp, lp.expert_down[ei], h.data(), n, y.data(), {});
      row = 0;
      for (size_t u = i; u < j; ++u) {
        std::memcpy(reply[ins[u].src].data() + ins[u].y_at * static_cast<size_t>(C), y.data() + row * C,
                    static_cast<size_t>(ins[u].rows) * row_bytes);
        row += ins[u].rows;
      }
      computed += n;
      i = j;
    }
    m.row_positions = saved_pos;
    double compute = seconds_since(t_experts);
    if (ep.slow_factor > 1.0) {  // a slower device: busy for (factor - 1) times as long again
      const double until = compute * ep.slow_factor;
      while ((compute = seconds_since(t_experts)) < until) {
      }
    }

    ExpertParallel::Parcels back(R);
    for (size_t q = 0; q < R; ++q) {
      back[q].resize(reply[q].size() * sizeof(float));
      if (!reply[q].empty()) std::memcpy(back[q].data(), reply[q].data(), back[q].size());
    }
    t_exchange = std::chrono::steady_clock::now();
    const ExpertParallel::Parcels outputs = ep.alltoallv(back);
    exchange += seconds_since(t_exchange);
    if (outputs.size() != R) throw InputError(fmt::format("[ep] the all-to-all returned {} parcels for {} ranks", outputs.size(), R));
    for (size_t q = 0; q < R; ++q) {
      int64_t rows = 0;
      for (const Piece& pc : to[q]) rows += pc.last - pc.first;
      if (outputs[q].size() != static_cast<size_t>(rows) * row_bytes)
        throw InputError(fmt::format("[ep] rank {}: rank {} returned {} bytes of expert outputs, {} expected", ep.rank, q,
                                     outputs[q].size(), static_cast<size_t>(rows) * row_bytes));
      size_t at = 0;
      for (const Piece& pc : to[q]) {
        const size_t n = static_cast<size_t>(pc.last - pc.first) * row_bytes;
        std::memcpy(r->y + pc.first * C, outputs[q].data() + at, n);
        at += n;
      }
    }
    ExpertParallel::Layer& l = ep.layers.at(app);
    l.exchange_s += exchange;
    l.compute_s += compute;
    l.pass_compute_s.push_back(compute);
    l.pass_exchange_s.push_back(exchange);
    l.rows += computed;
    l.layer_rows += r ? r->R : 0;
    ++l.passes;
  }

  void mlp_backward(Model::Impl& m, const BlockPass& p, const LayerActivations& a, const BackwardScratch& s,
                    const float* dout, bool accumulate, uint64_t step) const override {
    const ModelConfig& c = m.config;
    const int64_t T = p.T, C = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok;
    const int64_t Fm = c.moe_intermediate_size;
    const LayerParams& lp = params(m);
    const MoeActivations& r = *a.moe;
    if (m.ep)
      throw InputError("[model] a backward pass with expert parallelism: this rank holds only its experts' activations "
                       "(expert parallelism is for inference)");
    tensor::Arena& work = *p.work;
    auto id = [&](int param) { return gemm_stream_id(param, p.repeat, m.specs.size()); };
    auto grad = [&](int param) { return m.grads[static_cast<size_t>(param)].data(); };

    // d y (each gathered row gets its token's gradient times its weight) and d w = <dout, y>.
    float* dy = work.alloc(r.R * C);
    std::vector<double> dw(static_cast<size_t>(T * k));
#pragma omp parallel for schedule(static) if (T * C > 65536)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const size_t tj = static_cast<size_t>(t * k + j);
        const int64_t row = r.row_of[tj];
        double d = 0.0;
        for (int64_t col = 0; col < C; ++col) {
          dy[row * C + col] = r.weight[tj] * dout[t * C + col];
          d += static_cast<double>(dout[t * C + col]) * static_cast<double>(r.y[row * C + col]);
        }
        dw[tj] = d;
      }

    // The experts, each on its rows; an expert no token chose gets a zero gradient.
    const LayerPrecision& mlp = mlp_precision(m);
    float* dh = work.alloc(r.R * Fm);
    float* dgate = work.alloc(r.R * Fm);
    float* dup = work.alloc(r.R * Fm);
    float* dx_rows = work.alloc(r.R * C);
    for (int64_t e = 0; e < E; ++e) {
      const size_t ei = static_cast<size_t>(e);
      const int g = lp.expert_gate[ei], u = lp.expert_up[ei], d = lp.expert_down[ei];
      const int64_t b = r.begin[ei], n = r.begin[ei + 1] - b;
      if (n == 0) {
        if (!accumulate)
          for (int param : {g, u, d}) std::fill(m.grads[static_cast<size_t>(param)].begin(), m.grads[static_cast<size_t>(param)].end(), 0.0f);
        continue;
      }
      m.linear_backward(mlp, d, dy + b * C, r.h + b * Fm, n, dh + b * Fm, false, grad(d), accumulate, step, id(d));
      swiglu_backward(dgate + b * Fm, dup + b * Fm, dh + b * Fm, r.gate + b * Fm, r.up + b * Fm, n, Fm);
      m.linear_backward(mlp, g, dgate + b * Fm, r.x + b * C, n, dx_rows + b * C, false, grad(g), accumulate, step, id(g));
      m.linear_backward(mlp, u, dup + b * Fm, r.x + b * C, n, dx_rows + b * C, true, grad(u), accumulate, step, id(u));
    }

    // d logits through the renormalisation and the softmax, per token in double.
    float* dlogits = work.alloc(T * E);
#pragma omp parallel for schedule(static) if (T > 64)
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> dp(static_cast<size_t>(E), 0.0);
      const float* pt = r.probs + t * E;
      if (c.norm_topk_prob) {
        double sum = 0.0, dot = 0.0;
        for (int64_t j = 0; j < k; ++j) sum += pt[r.selected[static_cast<size_t>(t * k + j)]];
        for (int64_t j = 0; j < k; ++j) {
          const size_t tj = static_cast<size_t>(t * k + j);
          dot += dw[tj] * static_cast<double>(r.weight[tj]);
        }
        for (int64_t j = 0; j < k; ++j) {
          const size_t tj = static_cast<size_t>(t * k + j);
          dp[static_cast<size_t>(r.selected[tj])] = (dw[tj] - dot) / sum;
        }
      } else {
        for (int64_t j = 0; j < k; ++j) {
          const size_t tj = static_cast<size_t>(t * k + j);
          dp[static_cast<size_t>(r.selected[tj])] = dw[tj];
        }
      }
      if (!m.moe_aux_dp.empty())  // the load-balancing loss reaches every expert's probability
        for (int64_t e = 0; e < E; ++e) dp[static_cast<size_t>(e)] += m.moe_aux_dp[static_cast<size_t>(e)];
      double inner = 0.0;
      for (int64_t e = 0; e < E; ++e) inner += dp[static_cast<size_t>(e)] * static_cast<double>(pt[e]);
      for (int64_t e = 0; e < E; ++e)
        dlogits[t * E + e] = static_cast<float>(static_cast<double>(pt[e]) * (dp[static_cast<size_t>(e)] - inner));
    }

    // d xn2: the experts' rows added back per token (ascending expert), then the router's dgrad.
    std::fill(s.dxn, s.dxn + T * C, 0.0f);
#pragma omp parallel for schedule(static) if (T * C > 65536)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t row = r.row_of[static_cast<size_t>(t * k + j)];
        for (int64_t col = 0; col < C; ++col) s.dxn[t * C + col] += dx_rows[row * C + col];
      }
    const float* wr = m.values[static_cast<size_t>(lp.router)].data();
    tensor::gemm(Trans::no, Trans::no, T, C, E, dlogits, E, wr, C, s.dxn, C, /*accumulate=*/true);
    tensor::gemm(Trans::yes, Trans::no, E, C, T, dlogits, E, a.xn2, C, grad(lp.router), C, accumulate);
  }

  void describe_mlp(const Model::Impl& m, std::vector<BlockNode>& n) const override {
    const ModelConfig& c = m.config;
    const int64_t C = c.hidden_size, Fm = c.moe_intermediate_size;
    const LayerParams& lp = params(m);
    const std::vector<GemmRole> gemm = {GemmRole::forward, GemmRole::dgrad, GemmRole::wgrad};
    // The router's GEMM runs on the fp32 values outside the precision policy: no policy roles.
    n.push_back({NodeOp::router, "router", lp.router, c.num_experts, {}});
    n.push_back({NodeOp::top_k, "top_k", -1, c.num_experts_per_tok, {}});
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const size_t ei = static_cast<size_t>(e);
      const std::string x = fmt::format("expert.{}.", e);
      n.push_back({NodeOp::linear, x + "gate", lp.expert_gate[ei], Fm, gemm});
      n.push_back({NodeOp::linear, x + "up", lp.expert_up[ei], Fm, gemm});
      n.push_back({NodeOp::swiglu, x + "swiglu", -1, Fm, {}});
      n.push_back({NodeOp::linear, x + "down", lp.expert_down[ei], C, gemm});
    }
    n.push_back({NodeOp::combine, "combine", -1, C, {}});
  }

  static int64_t first_moe_application(const ModelConfig& c) {
    for (int64_t a = 0; a < c.applications(); ++a)
      if (c.is_moe_layer(c.block_of(a))) return a;
    return -1;
  }

  static void route(const ModelConfig& c, MoeActivations& r, int64_t t) {
    moe_route_row(c, r.logits + t * r.E, r.probs + t * r.E, r.selected.data() + t * r.k, r.weight.data() + t * r.k);
  }

  // Expert e's rows grouped by sequence: the gathered rows are in ascending token order, so each
  // sequence's rows are contiguous. Empty when the pass quantizes all rows together.
  static std::vector<int64_t> expert_splits(const MoeActivations& r, std::span<const int64_t> row_splits, int64_t e) {
    if (row_splits.empty()) return {};
    const auto first = r.token.begin() + r.begin[static_cast<size_t>(e)];
    const auto last = r.token.begin() + r.begin[static_cast<size_t>(e) + 1];
    std::vector<int64_t> out;
    out.reserve(row_splits.size());
    for (int64_t split : row_splits)
      out.push_back(std::lower_bound(first, last, static_cast<int32_t>(split)) - first);
    return out;
  }
};

}  // namespace

void moe_route_row(const ModelConfig& c, const float* logit, float* prob, int32_t* selected, float* weight) {
  const int64_t E = c.num_experts, k = c.num_experts_per_tok;
  double mx = -INFINITY;
  for (int64_t e = 0; e < E; ++e) mx = std::max(mx, static_cast<double>(logit[e]));
  double sum = 0.0;
  for (int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(logit[e]) - mx);
  for (int64_t e = 0; e < E; ++e) prob[e] = static_cast<float>(std::exp(static_cast<double>(logit[e]) - mx) / sum);
  std::vector<int32_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  // A NaN probability (a NaN in the layer's input) sorts last, so the order stays a strict weak
  // ordering; the NaN then reaches the output through the weights, as it should.
  auto key = [&](int32_t x) { return std::isnan(prob[x]) ? -1.0f : prob[x]; };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t x, int32_t y) {
    return key(x) > key(y) || (key(x) == key(y) && x < y);
  });
  std::sort(order.begin(), order.begin() + k);
  double selected_sum = 0.0;
  for (int64_t j = 0; j < k; ++j) selected_sum += prob[order[static_cast<size_t>(j)]];
  for (int64_t j = 0; j < k; ++j) {
    const int32_t e = order[static_cast<size_t>(j)];
    selected[j] = e;
    weight[j] = c.norm_topk_prob ? static_cast<float>(static_cast<double>(prob[e]) / selected_sum) : prob[e];
  }
}

std::unique_ptr<Block> make_moe_block(int layer) { return std::make_unique<MoeBlock>(layer); }

std::vector<int32_t> moe_selected_of(const LayerActivations& a) { return a.moe ? a.moe->selected : std::vector<int32_t>{}; }

double moe_aux_loss(const Model::Impl& m, std::vector<double>& dp) {
  dp.clear();
  const int64_t E = m.config.num_experts, T = m.tokens_count();
  std::vector<double> picks(static_cast<size_t>(E), 0.0), prob_sum(static_cast<size_t>(E), 0.0);
  double rows = 0.0;
  for (const LayerActivations& a : m.acts) {
    if (!a.moe) continue;
    for (int32_t e : a.moe->selected) picks[static_cast<size_t>(e)] += 1.0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) prob_sum[static_cast<size_t>(e)] += a.moe->probs[t * E + e];
    rows += static_cast<double>(T);
  }
  if (rows == 0.0) return 0.0;
  double aux = 0.0;
  dp.resize(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const double f = picks[static_cast<size_t>(e)] / rows;
    aux += f * (prob_sum[static_cast<size_t>(e)] / rows);
    dp[static_cast<size_t>(e)] = static_cast<double>(E) * f / rows;
  }
  return static_cast<double>(E) * aux;
}

}  // namespace concord::model
