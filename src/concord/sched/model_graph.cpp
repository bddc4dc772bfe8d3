// A model pass as a sched::Graph (model_graph.h).
#include "concord/sched/model_graph.h"

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

Graph model_graph(const model::Model& m, Pass pass, int64_t T, int64_t B, const ExpertRows* expert_rows,
                  int64_t context) {
  const model::ModelConfig& c = m.config();
  // A depth-recurrent model runs its plan at the model's current depth (prelude, the core's
  // layers once per iteration, each entered through the adapter, then the coda).
  const int64_t depth = c.recurrent() ? m.depth() : 0;
  const int64_t A = c.recurrent() ? c.applications_at(depth) : c.applications();
  const int64_t P = c.n_layers_in_prelude, R = c.n_layers_in_recurrent_block;
  const bool cached = pass == Pass::decode || pass == Pass::prefill;
  if (c.recurrent() && cached)
    throw InputError("[sched] a depth-recurrent model's cached passes are not planned yet (its KV cache has a slot per iteration)");
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
  const int64_t rows = T * B, C = c.hidden_size, D = c.head_dim, Hq = c.num_attention_heads,
                Hkv = c.num_key_value_heads, V = c.vocab_size;
  // The training step: the forward as in training, then the loss and the backward's nodes, which
  // read the activations (nothing is kept: each is freed after its last backward reader).
  const bool step = pass == Pass::step;
  if (step && c.moe())
    throw InputError("[sched] the training step's backward nodes cover dense and depth-recurrent decoders (no MoE "
                     "yet): use --pass train for the forward");
  if (step && c.recurrent() && m.backprop_iterations() > 0 && m.backprop_iterations() < m.depth())
    throw InputError(fmt::format("[sched] the training step with truncated backpropagation (the gradient through the "
                                 "last {} of {} iterations) is not a node list yet",
                                 m.backprop_iterations(), m.depth()));
  const bool train = pass == Pass::train || step;
  constexpr int64_t f = 4;  // fp32 activations
  Graph g;
  auto tensor = [&](const std::string& name, int64_t elems, bool saved) {
    return g.add_tensor(name, elems * f, saved && pass == Pass::train);
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
        // The application's KV cache (B sequences of context + T rows: the cached ones and the
        // new ones appended; kept, it outlives the pass) is read beside the new rows' k and v; the
        // probabilities of each new query over its context + T keys are workspace.
        const int cache = g.add_tensor(p + "kv_cache", 2 * B * (context + T) * Hkv * D * f, true);
        g.add_node(p + name, {t["q"], t["k"], t["v"], cache}, {out("att", rows * Hq * D)},
                   B * Hq * T * (context + T) * f);
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
  const int xn = tensor("final_xn", rows * C, true);
  const int rstd = tensor("final_rstd", rows, true);
  g.add_node("final_norm", {x}, {xn, rstd});
  const int logits = g.add_tensor("logits", rows * V * f, !step);
  g.add_node("lm_head", {xn}, {logits});
  if (step) {
    // Model::forward_backward's backward (model_backward.cpp, block_dense.cpp) node by node. An
    // accumulation (k's and v's dgrad into d xn1, up's into d xn2) is an in-place chain, so it
    // runs in the model's order under every schedule.
    const int64_t F = c.intermediate_size;
    const int targets = g.add_tensor("targets", rows * 4);
    const int dlogits = g.add_tensor("d_logits", rows * V * f);
    const int loss = g.add_tensor("loss", 8, true);
    g.add_node("loss", {logits, targets}, {dlogits, loss});
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
      std::map<std::string, int>& t = roles[static_cast<size_t>(a)];
      const std::string p = fmt::format("a{}.", a);
      auto d = [&](const std::string& role, int64_t elems) { return g.add_tensor(p + "d_" + role, elems * f); };
      const int dh = d("h", rows * F);
      g.add_node(p + "down.bwd", {dx, t["h"]}, {dh});
      const int dgate = d("gate", rows * F), dup = d("up", rows * F);
      g.add_node(p + "swiglu.bwd", {dh, t["gate"], t["up"]}, {dgate, dup});
      const int dxn2_gate = d("xn2_gate", rows * C);
      g.add_node(p + "gate.bwd", {dgate, t["xn2"]}, {dxn2_gate});
      const int dxn2 = d("xn2", rows * C);
      g.add_node(p + "up.bwd", {dup, t["xn2"], dxn2_gate}, {dxn2}, 0, 2);
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
        if (iteration > 0) outs.push_back(d("s", rows * C));
        g.add_node(p + "adapter.bwd", {dx, adapter_in[a], de}, outs, rows * 2 * C * f, 2);
        de = de_next;
        dx = iteration > 0 ? outs[1] : de_next;
      }
    }
    g.add_node("embed.bwd", {dx, tokens}, {});
  }
  g.validate();
  return g;
}

}  // namespace concord::sched
