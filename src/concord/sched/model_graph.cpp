// A model pass as a sched::Graph (model_graph.h).
#include "concord/sched/model_graph.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "concord/numerics/check.h"

namespace concord::sched {

Pass pass_from_name(const std::string& name) {
  if (name == "forward") return Pass::forward;
  if (name == "decode") return Pass::decode;
  if (name == "prefill") return Pass::prefill;
  if (name == "train") return Pass::train;
  if (name == "step") return Pass::step;
  throw InputError(fmt::format("[sched] unknown pass '{}' (forward, prefill, decode, train, step)", name));
}

namespace {

// Both entry points: the full-sequence passes (B sequences of T tokens) and the cached ones
// (`shape`: T and B are its longest input and its input count, for the checks).
Graph build(const model::Model& m, Pass pass, int64_t T, int64_t B, const ExpertRows* expert_rows, int64_t context,
            const CachedShape* shape) {
  const model::ModelConfig& c = m.config();
  // A depth-recurrent model runs its plan at the model's current depth (prelude, the core's
  // layers once per iteration, each entered through the adapter, then the coda).
  const int64_t depth = c.recurrent() ? m.depth() : 0;
  const int64_t A = c.recurrent() ? c.applications_at(depth) : c.applications();
  const int64_t P = c.n_layers_in_prelude, R = c.n_layers_in_recurrent_block;
  const bool cached = pass == Pass::decode || pass == Pass::prefill;
  if (pass == Pass::decode && T != 1)
    throw InputError(fmt::format("[sched] a decode step has one new token per sequence ({} given)", T));
  if (context < 0 || (context > 0 && !cached))
    throw InputError(fmt::format("[sched] {} cached tokens: a context is for the prefill and decode passes", context));
  if (context + T > c.max_position_embeddings)
    throw InputError(fmt::format("[sched] {} cached + {} new tokens exceed max_position_embeddings {}", context, T,
                                 c.max_position_embeddings));
  if (T < 1 || B < 1) throw InputError(fmt::format("[sched] {} tokens of {} sequences: need at least 1 of each", T, B));
  if (expert_rows != nullptr && static_cast<int64_t>(expert_rows->size()) != A)
    throw InputError(fmt::format("[sched] expert rows for {} applications, the model runs {}", expert_rows->size(), A));
  const int64_t C = c.hidden_size, D = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads,
                V = c.vocab_size;
  // A cached pass: its rows (every input's new tokens), the rows whose logits it returns, the keys
  // its longest row attends to, the KV cache rows, and the attention's scores (each row's Hq x its
  // keys, packed; or Hq x key_capacity each).
  int64_t rows = T * B, logit_rows = rows, capacity = 0, cache_rows = 0, scores = 0;
  if (shape != nullptr) {
    rows = logit_rows = 0;
    for (size_t i = 0; i < shape->tokens.size(); ++i) {
      // Row j of the input attends to context + j + 1 keys.
      scores += Hq * (shape->tokens[i] * shape->context[i] + shape->tokens[i] * (shape->tokens[i] + 1) / 2);
      rows += shape->tokens[i];
      logit_rows += shape->logits[i] == model::LogitRows::all    ? shape->tokens[i]
                    : shape->logits[i] == model::LogitRows::last ? 1
                                                                 : 0;
      capacity = std::max(capacity, shape->context[i] + shape->tokens[i]);
      cache_rows += shape->context[i] + shape->tokens[i];
    }
    if (shape->key_capacity > 0) {
      if (shape->key_capacity < capacity)
        throw InputError(fmt::format("[sched] a key capacity of {} for rows that attend to {} keys", shape->key_capacity,
                                     capacity));
      scores = rows * Hq * shape->key_capacity;
    }
  }
  // The training step: the forward as in training, then the loss and the backward's nodes, which
  // read the activations (nothing is kept: each is freed after its last backward reader).
  const bool step = pass == Pass::step;
  const bool train = pass == Pass::train || step;
  // Truncated backpropagation (a recurrent model, Model::set_backprop_iterations): the core
  // iterations before `first_grad` run without gradient — nothing of them is kept, and the step's
  // backward stops at the first iteration with gradient (its d s dropped: its input state is a
  // constant), as Model::forward_backward's does.
  const int64_t backprop = c.recurrent() ? m.backprop_iterations() : 0;
  const int64_t first_grad = backprop > 0 && backprop < depth ? depth - backprop : 0;
  auto no_grad = [&](int64_t a) { return c.recurrent() && a >= P && a < P + depth * R && (a - P) / R < first_grad; };
  constexpr int64_t f = 4;  // fp32 activations
  Graph g;
  if (cached) g.outside_bytes = 2 * cache_rows * Hkv * D * f * A;  // the KV cache: not in the arena
  bool saving = true;  // the current application's activations are kept for the backward
  auto tensor = [&](const std::string& name, int64_t elems, bool saved) {
    return g.add_tensor(name, elems * f, saved && saving && pass == Pass::train);
  };
  std::vector<std::map<std::string, int>> roles;  // per application, its tensors by role
  const int tokens = g.add_tensor("tokens", rows * 4);
  int x = tensor("x0", rows * C, true);
  g.add_node("embed", {tokens}, {x});
  int injection = -1;  // recurrent: the prelude's output e, read by every iteration's adapter
  std::map<int64_t, int> adapter_in;  // recurrent: per application entering an iteration, [s, e]
  for (int64_t a = 0; a < A; ++a) {
    const int block = c.recurrent() ? c.block_of_at(a, depth) : c.block_of(a);
    const std::string p = fmt::format("a{}.", a);
    saving = !no_grad(a);
    if (c.recurrent() && a >= P && a < P + depth * R && (a - P) % R == 0) {
      // Entering a core iteration: x = adapter([s, e]), s the previous iteration's output or s0.
      int state = x;
      if (a == P) {
        injection = x;
        if (train) g.tensors[static_cast<size_t>(injection)].keep = true;  // the backward reads e
        state = tensor(p + "s0", rows * C, false);
        g.add_node(p + "init_state", {}, {state});
      }
      const int cat = tensor(p + "adapter_in", rows * 2 * C, true);
      x = tensor(p + "x_adapted", rows * C, true);
      g.add_node(p + "adapter", {state, injection}, {cat, x});
      adapter_in[a] = cat;
    }
    std::map<std::string, int> t;  // this application's tensors by role
    t["x"] = x;
    std::vector<int> expert_outputs;
    for (const model::BlockNode& n : m.describe_block(block)) {
      const std::string& name = n.name;
      auto out = [&](const std::string& role, int64_t elems, bool saved = true) {
        return t[role] = tensor(p + role, elems, saved);
      };
      if (name == "input_norm") {
        g.add_node(p + name, {t["x"]}, {out("xn1", rows * C), out("rstd1", rows)});
      } else if (name == "q" || name == "k" || name == "v") {
        g.add_node(p + name, {t["xn1"]}, {out(name == "v" ? "v" : name + "_raw", rows * n.width)});
      } else if (name == "q_norm" || name == "k_norm") {
        const std::string w = name.substr(0, 1);
        g.add_node(p + name, {t[w + "_raw"]}, {out(w + "_normed", rows * n.width), out("rstd_" + w, rows * n.width / D)});
      } else if (name == "rope_q" || name == "rope_k") {
        const std::string w = name.substr(5, 1);
        const int in = t.count(w + "_normed") ? t[w + "_normed"] : t[w + "_raw"];
        // After QK-norm RoPE rotates in place; without it the raw projection is copied first
        // (the backward reads both).
        g.add_node(p + name, {in}, {out(w, rows * n.width)}, 0, t.count(w + "_normed") ? 0 : -1);
      } else if (name == "attention" && cached) {
        // The new rows' k and v are appended to the application's KV cache (the KvCache's own
        // memory, outside the graph: Graph::outside_bytes) and every row attends over its
        // sequence's cached rows; each row's scores (Hq x its keys, or x key_capacity) are
        // workspace.
        g.add_node(p + name, {t["q"], t["k"], t["v"]}, {out("att", rows * Hq * D)}, scores * f);
      } else if (name == "attention") {
        const int64_t probs = B * Hq * T * T;
        std::vector<int> outs = {out("att", rows * Hq * D)};
        if (train) outs.push_back(out("probs", probs));
        g.add_node(p + name, {t["q"], t["k"], t["v"]}, outs, train ? 0 : probs * f);
      } else if (name == "o") {
        g.add_node(p + name, {t["att"]}, {out("o", rows * C, false)});
      } else if (name == "residual_attention") {
        g.add_node(p + name, {t["x"], t["o"]}, {out("x_mid", rows * C)}, 0, 1);
      } else if (name == "post_norm") {
        g.add_node(p + name, {t["x_mid"]}, {out("xn2", rows * C), out("rstd2", rows)});
      } else if (name == "gate" || name == "up") {
        g.add_node(p + name, {t["xn2"]}, {out(name, rows * n.width)});
      } else if (name == "swiglu") {
        g.add_node(p + name, {t["gate"], t["up"]}, {out("h", rows * n.width)});
      } else if (name == "down") {
        g.add_node(p + name, {t["h"]}, {out("y", rows * C, false)});
      } else if (name == "router") {
        g.add_node(p + name, {t["xn2"]}, {out("router_logits", rows * n.width)});
      } else if (name == "top_k") {
        // routing: (rows, k) expert ids and (rows, k) weights; the softmax's probabilities are
        // workspace, or kept for the backward in training.
        std::vector<int> outs = {out("routing", rows * n.width * 2)};
        if (train) outs.push_back(out("router_probs", rows * c.num_experts));
        g.add_node(p + name, {t["router_logits"]}, outs, train ? 0 : rows * c.num_experts * f);
      } else if (name.rfind("expert.", 0) == 0) {
        const std::string e = name.substr(0, name.rfind('.') + 1), op = name.substr(e.size());
        const int64_t expert = std::stoll(e.substr(7));
        int64_t share = (rows * c.num_experts_per_tok + c.num_experts - 1) / c.num_experts;
        if (expert_rows != nullptr) {
          const std::vector<int64_t>& counts = (*expert_rows)[static_cast<size_t>(a)];
          if (static_cast<int64_t>(counts.size()) != c.num_experts)
            throw InputError(fmt::format("[sched] application {}: expert rows for {} experts, the layer has {}", a,
                                         counts.size(), c.num_experts));
          share = counts[static_cast<size_t>(expert)];
        }
        if (op == "gate" || op == "up") {  // the expert's rows of xn2 gathered into the workspace
          g.add_node(p + name, {t["xn2"], t["routing"]}, {out(e + op, share * n.width)}, share * C * f);
        } else if (op == "swiglu") {
          g.add_node(p + name, {t[e + "gate"], t[e + "up"]}, {out(e + "h", share * n.width)});
        } else if (op == "down") {
          expert_outputs.push_back(out(e + "down", share * C));
          g.add_node(p + name, {t[e + "h"], t["routing"]}, {expert_outputs.back()});
        } else {
          throw InputError(fmt::format("[sched] block {}: unknown expert node '{}'", block, name));
        }
      } else if (name == "combine") {
        std::vector<int> in = expert_outputs;
        in.push_back(t["routing"]);
        g.add_node(p + name, in, {out("y", rows * C, false)});
      } else if (name == "residual_mlp") {
        g.add_node(p + name, {t["x_mid"], t["y"]}, {out("x_out", rows * C)}, 0, 1);
      } else {
        throw InputError(fmt::format("[sched] block {}: node '{}' ({}) has no data flow here yet", block, name,
                                     model::node_op_name(n.op)));
      }
    }
    x = t["x_out"];
    roles.push_back(std::move(t));
  }
  if (cached && c.recurrent()) {
    // The KV cache's iteration slots the pass did not reach (depth below the cache's core slots)
    // get its last iteration's rows (forward_cached's fill_skipped_iterations): after the core.
    g.add_node("fill_skipped", {x}, {});
  }
  if (cached && logit_rows == 0) {  // a prefill chunk that returns no logits: the KV cache is its result
    g.validate();
    return g;
  }
  if (cached && logit_rows < rows) {  // forward_cached's: only the rows whose logits are asked for
    const int selected = tensor("selected", logit_rows * C, false);
    g.add_node("select_logits", {x}, {selected});
    x = selected;
  }
  const int xn = tensor("final_xn", logit_rows * C, true);
  const int rstd = tensor("final_rstd", logit_rows, true);
  g.add_node("final_norm", {x}, {xn, rstd});
  const int logits = g.add_tensor("logits", logit_rows * V * f, !step);
  g.add_node("lm_head", {xn}, {logits});
  if (step) {
    // Model::forward_backward's backward (model_backward.cpp, block_dense.cpp, block_moe.cpp) node
    // by node. An accumulation (k's and v's dgrad into d xn1, up's into d xn2, an expert's up into
    // its gate's d rows) is an in-place chain, so it runs in the model's order under every schedule.
    const int64_t F = c.intermediate_size, E = c.num_experts, K = c.num_experts_per_tok;
    const int targets = g.add_tensor("targets", rows * 4);
    const int dlogits = g.add_tensor("d_logits", rows * V * f);
    // Qwen3-MoE with output_router_logits: the load-balancing loss reads every MoE application's
    // routing and router probabilities; it adds coef · aux to the cross-entropy (in place) and
    // hands every application's top_k backward its gradient per expert (E doubles).
    const bool aux = c.moe() && c.output_router_logits;
    const int loss = g.add_tensor(aux ? "ce_loss" : "loss", 8, !aux);
    g.add_node("loss", {logits, targets}, {dlogits, loss});
    int aux_dp = -1;
    if (aux) {
      std::vector<int> in = {loss};
      for (const auto& t : roles)
        if (t.count("routing")) {
          in.push_back(t.at("routing"));
          in.push_back(t.at("router_probs"));
        }
      const int total = g.add_tensor("loss", 8, true);
      aux_dp = g.add_tensor("aux_dp", E * 8);
      g.add_node("aux_loss", in, {total, aux_dp}, 0, 0);
    }
    const int dxn = g.add_tensor("d_final_xn", rows * C * f);
    g.add_node("lm_head.bwd", {dlogits, xn}, {dxn});
    int dx = g.add_tensor("d_x_final", rows * C * f);
    g.add_node("final_norm.bwd", {dxn, x, rstd}, {dx});
    int de = -1;  // recurrent: d e, summed over the iterations in reverse (model_backward.cpp)
    if (c.recurrent()) {
      de = g.add_tensor("d_e0", rows * C * f);
      g.add_node("de_init", {}, {de});
    }
    for (int64_t a = A - 1; a >= 0; --a) {
      if (no_grad(a)) continue;  // truncated: run without gradient
      std::map<std::string, int>& t = roles[static_cast<size_t>(a)];
      const std::string p = fmt::format("a{}.", a);
      auto d = [&](const std::string& role, int64_t elems) { return g.add_tensor(p + "d_" + role, elems * f); };
      int dxn2 = -1;
      if (t.count("routing")) {
        // The MoE layer (block_moe.cpp's mlp_backward): d y to every expert's rows and d w per
        // pick; each expert's backward on its rows (x gathered again into the workspace); the
        // router's softmax and top-k renormalisation (and the load-balancing term); d xn2 = the
        // experts' rows added back per token, plus the router's dgrad.
        const int64_t Fm = c.moe_intermediate_size;
        std::vector<int> combine_in = {dx, t["routing"]}, dys;
        for (int64_t e = 0; e < E; ++e) combine_in.push_back(t[fmt::format("expert.{}.down", e)]);
        for (int64_t e = 0; e < E; ++e) {
          const int64_t n = g.tensors[static_cast<size_t>(t[fmt::format("expert.{}.down", e)])].bytes / (C * f);
          dys.push_back(d(fmt::format("expert.{}.y", e), n * C));
        }
        std::vector<int> combine_out = dys;
        const int dweight = g.add_tensor(p + "d_weight", rows * K * 8);
        combine_out.push_back(dweight);
        g.add_node(p + "combine.bwd", combine_in, combine_out);
        std::vector<int> router_in;
        for (int64_t e = 0; e < E; ++e) {
          const std::string ex = fmt::format("expert.{}.", e);
          const int64_t n = g.tensors[static_cast<size_t>(dys[static_cast<size_t>(e)])].bytes / (C * f);
          const int dh = d(ex + "h", n * Fm);
          g.add_node(p + ex + "down.bwd", {dys[static_cast<size_t>(e)], t[ex + "h"]}, {dh});
          const int dgate = d(ex + "gate", n * Fm), dup = d(ex + "up", n * Fm);
          g.add_node(p + ex + "swiglu.bwd", {dh, t[ex + "gate"], t[ex + "up"]}, {dgate, dup});
          const int drows_gate = d(ex + "rows_gate", n * C);
          g.add_node(p + ex + "gate.bwd", {dgate, t["xn2"], t["routing"]}, {drows_gate}, n * C * f);
          const int drows = d(ex + "rows", n * C);
          g.add_node(p + ex + "up.bwd", {dup, t["xn2"], t["routing"], drows_gate}, {drows}, n * C * f, 3);
          router_in.push_back(drows);
        }
        const int drouter = d("router_logits", rows * E);
        std::vector<int> topk_in = {dweight, t["router_probs"], t["routing"]};
        if (aux) topk_in.push_back(aux_dp);
        g.add_node(p + "top_k.bwd", topk_in, {drouter});
        router_in.insert(router_in.begin(), {drouter, t["xn2"], t["routing"]});
        dxn2 = d("xn2", rows * C);
        g.add_node(p + "router.bwd", router_in, {dxn2});
      } else {
        const int dh = d("h", rows * F);
        g.add_node(p + "down.bwd", {dx, t["h"]}, {dh});
        const int dgate = d("gate", rows * F), dup = d("up", rows * F);
        g.add_node(p + "swiglu.bwd", {dh, t["gate"], t["up"]}, {dgate, dup});
        const int dxn2_gate = d("xn2_gate", rows * C);
        g.add_node(p + "gate.bwd", {dgate, t["xn2"]}, {dxn2_gate});
        dxn2 = d("xn2", rows * C);
        g.add_node(p + "up.bwd", {dup, t["xn2"], dxn2_gate}, {dxn2}, 0, 2);
      }
      const int dnorm2 = d("x_mid_norm", rows * C);
      g.add_node(p + "post_norm.bwd", {dxn2, t["x_mid"], t["rstd2"]}, {dnorm2});
      const int dx_mid = d("x_mid", rows * C);
      g.add_node(p + "residual_mlp.bwd", {dx, dnorm2}, {dx_mid}, 0, 0);
      const int datt = d("att", rows * Hq * D);
      g.add_node(p + "o.bwd", {dx_mid, t["att"]}, {datt});
      const int dq = d("q", rows * Hq * D), dk = d("k", rows * Hkv * D), dv = d("v", rows * Hkv * D);
      g.add_node(p + "attention.bwd", {datt, t["probs"], t["q"], t["k"], t["v"]}, {dq, dk, dv});
      int gq = d("q_rotated", rows * Hq * D), gk = d("k_rotated", rows * Hkv * D);
      g.add_node(p + "rope_q.bwd", {dq}, {gq}, 0, 0);
      g.add_node(p + "rope_k.bwd", {dk}, {gk}, 0, 0);
      if (c.qk_norm()) {
        const int dq_raw = d("q_raw", rows * Hq * D), dk_raw = d("k_raw", rows * Hkv * D);
        g.add_node(p + "q_norm.bwd", {gq, t["q_raw"], t["rstd_q"]}, {dq_raw});
        g.add_node(p + "k_norm.bwd", {gk, t["k_raw"], t["rstd_k"]}, {dk_raw});
        gq = dq_raw;
        gk = dk_raw;
      }
      const int dxn1_q = d("xn1_q", rows * C), dxn1_k = d("xn1_k", rows * C), dxn1 = d("xn1", rows * C);
      g.add_node(p + "q.bwd", {gq, t["xn1"]}, {dxn1_q});
      g.add_node(p + "k.bwd", {gk, t["xn1"], dxn1_q}, {dxn1_k}, 0, 2);
      g.add_node(p + "v.bwd", {dv, t["xn1"], dxn1_k}, {dxn1}, 0, 2);
      const int dnorm1 = d("x_norm", rows * C);
      g.add_node(p + "input_norm.bwd", {dxn1, t["x"], t["rstd1"]}, {dnorm1});
      const int dx_in = d("x", rows * C);
      g.add_node(p + "residual_attention.bwd", {dx_mid, dnorm1}, {dx_in}, 0, 0);
      dx = dx_in;
      if (adapter_in.count(a)) {
        // Through the adapter: d[s, e] (workspace) splits into d s, on to the previous iteration
        // (dropped at the first: s0 is a constant), and d e, added to the running sum in place.
        // After the first iteration the prelude's gradient is that sum.
        const int iteration = static_cast<int>((a - P) / R);
        const int de_next = g.add_tensor(fmt::format("d_e{}", depth - iteration), rows * C * f);
        std::vector<int> outs = {de_next};  // first: it takes d e's buffer
        if (iteration > first_grad) outs.push_back(d("s", rows * C));
        g.add_node(p + "adapter.bwd", {dx, adapter_in[a], de}, outs, rows * 2 * C * f, 2);
        de = de_next;
        dx = iteration > first_grad ? outs[1] : de_next;
        if (iteration == first_grad) a = P;  // on to the prelude (the loop decrements)
      }
    }
    g.add_node("embed.bwd", {dx, tokens}, {});
  }
  g.validate();
  return g;
}

}  // namespace

Graph model_graph(const model::Model& m, Pass pass, int64_t T, int64_t B, const ExpertRows* expert_rows,
                  int64_t context) {
  if (pass != Pass::prefill && pass != Pass::decode) return build(m, pass, T, B, expert_rows, context, nullptr);
  // The engine's prompt chunk or decode step: B sequences alike, each returning its last row's logits.
  CachedShape shape;
  shape.context.assign(static_cast<size_t>(std::max<int64_t>(B, 0)), context);
  shape.tokens.assign(shape.context.size(), T);
  shape.logits.assign(shape.context.size(), model::LogitRows::last);
  return build(m, pass, T, B, expert_rows, context, &shape);
}

Graph model_graph(const model::Model& m, const CachedShape& shape, const ExpertRows* expert_rows) {
  const size_t n = shape.tokens.size();
  if (n == 0 || shape.context.size() != n || shape.logits.size() != n)
    throw InputError(fmt::format("[sched] a cached pass of {} inputs with {} contexts and {} logit choices: need one "
                                 "of each per input, at least one input",
                                 n, shape.context.size(), shape.logits.size()));
  int64_t longest = 0, context = 0;
  for (size_t i = 0; i < n; ++i) {
    if (shape.tokens[i] < 1 || shape.context[i] < 0)
      throw InputError(fmt::format("[sched] cached input {}: {} new tokens after {} cached (at least 1 new)", i,
                                   shape.tokens[i], shape.context[i]));
    if (shape.context[i] + shape.tokens[i] > m.config().max_position_embeddings)
      throw InputError(fmt::format("[sched] cached input {}: {} cached + {} new tokens exceed max_position_embeddings {}", i,
                                   shape.context[i], shape.tokens[i], m.config().max_position_embeddings));
    longest = std::max(longest, shape.tokens[i]);
  }
  return build(m, Pass::prefill, longest, static_cast<int64_t>(n), expert_rows, context,
               &shape);
}

}  // namespace concord::sched
