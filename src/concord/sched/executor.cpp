// The executor (executor.h): a model pass node by node through memory it owns and measures.
#include "concord/sched/executor.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>

#include <fmt/format.h>

#include "concord/numerics/check.h"

namespace concord::sched {
namespace {

constexpr unsigned char kCanary = 0xA5;

// What every node of the graph reads and when its buffers die.
struct Flow {
  std::vector<int> buffer_of;                // tensor -> root tensor of its buffer
  std::vector<std::vector<int>> members;     // root -> tensors in the buffer
  std::vector<int> pending;                  // tensor -> consumers not yet run
  std::vector<bool> produced;
  int tokens = -1, logits = -1, targets = -1, loss = -1;

  Flow(const Graph& g) : buffer_of(sched::buffer_of(g)) {
    const size_t T = g.tensors.size();
    members.resize(T);
    pending.assign(T, 0);
    produced.assign(T, false);
    for (size_t t = 0; t < T; ++t) {
      members[static_cast<size_t>(buffer_of[t])].push_back(static_cast<int>(t));
      if (g.tensors[t].producer < 0) produced[t] = true;
      if (g.tensors[t].name == "tokens") tokens = static_cast<int>(t);
      if (g.tensors[t].name == "logits") logits = static_cast<int>(t);
      if (g.tensors[t].name == "targets") targets = static_cast<int>(t);
      if (g.tensors[t].name == "loss") loss = static_cast<int>(t);
    }
    for (const Node& n : g.nodes) {
      std::vector<int> in = n.inputs;
      std::sort(in.begin(), in.end());
      in.erase(std::unique(in.begin(), in.end()), in.end());
      for (int t : in) ++pending[static_cast<size_t>(t)];
    }
    if (tokens < 0 || logits < 0 || g.tensors[static_cast<size_t>(tokens)].producer >= 0)
      throw InputError("[sched] execute: the graph has no 'tokens' input or no 'logits' tensor (model_graph makes both)");
    for (const Tensor& x : g.tensors)
      if (x.name.size() > 9 && x.name.compare(x.name.size() - 9, 9, ".kv_cache") == 0)
        throw InputError("[sched] execute: a prefill chunk's or decode step's graph is planned, not executed "
                         "(the executor runs the forward and training passes)");
  }
  // Whether buffer `root` holds nothing a later node reads (every member produced, read by all
  // its consumers, not kept).
  bool dead(const Graph& g, int root) const {
    for (int t : members[static_cast<size_t>(root)])
      if (!produced[static_cast<size_t>(t)] || pending[static_cast<size_t>(t)] > 0 || g.tensors[static_cast<size_t>(t)].keep)
        return false;
    return true;
  }
};

// The model's node behind a graph node: "embed" / "final_norm" / "lm_head" or "a<N>.<node>".
std::pair<int64_t, std::string> node_of(const std::string& name) {
  if (name.size() > 2 && name[0] == 'a' && name[1] >= '0' && name[1] <= '9') {
    const size_t dot = name.find('.');
    if (dot != std::string::npos) return {std::stoll(name.substr(1, dot - 1)), name.substr(dot + 1)};
  }
  return {-1, name};
}

// Runs `order`: workspace(v) allocates node v's outputs and returns its workspace, get(t) gives
// tensor t's memory, after(v) frees what v was the last to read.
template <class Get, class Workspace, class After>
double run_order(model::Model& m, const Graph& g, const Order& order, Flow& flow, int64_t B, int64_t S, uint64_t step,
                 Get get, Workspace workspace, After after) {
  const auto start = std::chrono::steady_clock::now();
  for (int v : order) {
    const Node& n = g.nodes[static_cast<size_t>(v)];
    void* scratch = workspace(v);  // allocates v's outputs and workspace
    std::vector<const void*> in;
    std::vector<void*> out;
    std::vector<int64_t> in_bytes, out_bytes;
    for (int t : n.inputs) {
      in.push_back(get(t));
      in_bytes.push_back(g.tensors[static_cast<size_t>(t)].bytes);
    }
    for (int t : n.outputs) {
      out.push_back(get(t));
      out_bytes.push_back(g.tensors[static_cast<size_t>(t)].bytes);
    }
    const auto [application, node] = node_of(n.name);
    m.run_node({.node = node,
                .application = application,
                .B = B,
                .S = S,
                .inputs = in,
                .input_bytes = in_bytes,
                .outputs = out,
                .output_bytes = out_bytes,
                .workspace = scratch,
                .workspace_bytes = n.workspace,
                .step = step});
    for (int t : n.outputs) flow.produced[static_cast<size_t>(t)] = true;
    std::vector<int> read = n.inputs;
    std::sort(read.begin(), read.end());
    read.erase(std::unique(read.begin(), read.end()), read.end());
    for (int t : read) --flow.pending[static_cast<size_t>(t)];
    after(v);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void check_tokens(const Graph& g, const Flow& flow, std::span<const int32_t> tokens, int64_t B, int64_t S,
                  std::span<const int32_t> targets) {
  if (static_cast<int64_t>(tokens.size()) != B * S || g.tensors[static_cast<size_t>(flow.tokens)].bytes != B * S * 4)
    throw InputError(fmt::format("[sched] execute: {} tokens for a graph of {} rows (B {} x S {} given)", tokens.size(),
                                 g.tensors[static_cast<size_t>(flow.tokens)].bytes / 4, B, S));
  if ((flow.targets >= 0) != !targets.empty() || (!targets.empty() && targets.size() != tokens.size()))
    throw InputError(fmt::format("[sched] execute: {} targets for {} tokens (the training step's graph takes one per "
                                 "token, the other passes none)", targets.size(), tokens.size()));
}

// What a run leaves: the logits when kept, the training step's loss.
void results(const Graph& g, const Flow& flow, const std::function<const void*(int)>& get, Execution& ex) {
  if (g.tensors[static_cast<size_t>(flow.logits)].keep) {
    const auto* logits = static_cast<const float*>(get(flow.logits));
    ex.logits.assign(logits, logits + g.tensors[static_cast<size_t>(flow.logits)].bytes / 4);
  }
  if (flow.loss >= 0) std::memcpy(&ex.loss, get(flow.loss), sizeof(double));
}

// The roots of the buffers node v's step may have let go of (its inputs' and outputs').
std::vector<int> touched_roots(const Graph& g, const Flow& flow, int v) {
  std::vector<int> roots;
  for (const auto* list : {&g.nodes[static_cast<size_t>(v)].inputs, &g.nodes[static_cast<size_t>(v)].outputs})
    for (int t : *list) roots.push_back(flow.buffer_of[static_cast<size_t>(t)]);
  std::sort(roots.begin(), roots.end());
  roots.erase(std::unique(roots.begin(), roots.end()), roots.end());
  return roots;
}

}  // namespace

Execution execute_planned(model::Model& m, const Graph& g, const Order& order, const ArenaPlan& plan,
                          std::span<const int32_t> tokens, int64_t B, int64_t S, std::span<const int32_t> targets,
                          uint64_t step) {
  if (!is_topological(g, order)) throw InputError("[sched] execute: the order is not a topological order of the graph");
  Flow flow(g);
  check_tokens(g, flow, tokens, B, S, targets);
  const int64_t A = plan.alignment;
  if (A < 4 || A % 4 != 0 || plan.arena_bytes % A != 0)
    throw InputError(fmt::format("[sched] execute: plan alignment {} (a multiple of 4, the floats') and arena {} bytes", A,
                                 plan.arena_bytes));
  // The arena, filled with the canary, and who owns each granule (0: free, else root + 1).
  const auto arena_bytes = static_cast<size_t>(plan.arena_bytes);
  std::unique_ptr<unsigned char, decltype(&std::free)> arena(
      static_cast<unsigned char*>(std::aligned_alloc(64, (arena_bytes + 64) / 64 * 64)), &std::free);
  if (!arena) throw std::bad_alloc();
  std::memset(arena.get(), kCanary, arena_bytes);
  std::vector<int> owner(arena_bytes / static_cast<size_t>(A), 0);

  std::vector<const Placement*> of_tensor(g.tensors.size(), nullptr), of_workspace(g.nodes.size(), nullptr);
  for (const Placement& p : plan.placements) {
    if (p.offset < 0 || p.offset % A != 0 || p.offset + p.bytes > plan.arena_bytes)
      throw InputError(fmt::format("[sched] execute: a placement at {} of {} bytes outside the arena of {} (alignment {})",
                                   p.offset, p.bytes, plan.arena_bytes, A));
    if (p.tensor >= 0) of_tensor.at(static_cast<size_t>(p.tensor)) = &p;
    else of_workspace.at(static_cast<size_t>(p.node)) = &p;
  }
  auto name_of = [&](int id) { return id >= 0 ? g.tensors[static_cast<size_t>(id)].name : g.nodes[static_cast<size_t>(-id - 1)].name + " workspace"; };
  Execution ex;
  ex.arena_bytes = plan.arena_bytes;
  // id: a root tensor, or -(v + 1) for node v's workspace.
  auto place = [&](int id, const Placement* p) {
    const int64_t end = p->offset + (p->bytes + A - 1) / A * A;
    for (int64_t k = p->offset / A; k < end / A; ++k) {
      int& o = owner[static_cast<size_t>(k)];
      if (o != 0 && o != id + (id >= 0 ? 1 : 0))
        throw InternalError(fmt::format("[sched] execute: '{}' placed at {} over '{}', still live", name_of(id), p->offset,
                                        name_of(o > 0 ? o - 1 : o)));
      o = id >= 0 ? id + 1 : id;
    }
    ex.high_water = std::max(ex.high_water, end);
  };
  auto release = [&](const Placement* p) {
    const int64_t end = p->offset + (p->bytes + A - 1) / A * A;
    std::fill(owner.begin() + p->offset / A, owner.begin() + end / A, 0);
  };
  auto get = [&](int t) -> void* {
    const Placement* p = of_tensor[static_cast<size_t>(t)];
    return p == nullptr ? nullptr : arena.get() + p->offset;
  };
  std::vector<bool> placed(g.tensors.size(), false);
  auto place_tensor = [&](int t) {
    const int root = flow.buffer_of[static_cast<size_t>(t)];
    const Placement* p = of_tensor[static_cast<size_t>(t)];
    if (p == nullptr || placed[static_cast<size_t>(root)]) return;
    if (of_tensor[static_cast<size_t>(root)] == nullptr || of_tensor[static_cast<size_t>(root)]->offset != p->offset)
      throw InputError(fmt::format("[sched] execute: '{}' is not at its buffer's offset", g.tensors[static_cast<size_t>(t)].name));
    place(root, of_tensor[static_cast<size_t>(root)]);
    placed[static_cast<size_t>(root)] = true;
  };
  for (size_t t = 0; t < g.tensors.size(); ++t) {
    if (g.tensors[t].bytes > 0 && of_tensor[t] == nullptr)
      throw InputError(fmt::format("[sched] execute: the plan places no '{}'", g.tensors[t].name));
    if (g.tensors[t].producer < 0) place_tensor(static_cast<int>(t));
  }
  std::memcpy(get(flow.tokens), tokens.data(), tokens.size_bytes());
  if (flow.targets >= 0) std::memcpy(get(flow.targets), targets.data(), targets.size_bytes());

  auto workspace = [&](int v) -> void* {
    for (int t : g.nodes[static_cast<size_t>(v)].outputs) place_tensor(t);
    const Placement* w = of_workspace[static_cast<size_t>(v)];
    if (g.nodes[static_cast<size_t>(v)].workspace > 0 && w == nullptr)
      throw InputError(fmt::format("[sched] execute: the plan places no workspace for '{}'", g.nodes[static_cast<size_t>(v)].name));
    if (w == nullptr) return nullptr;
    place(-v - 1, w);
    return arena.get() + w->offset;
  };
  auto after = [&](int v) {
    if (const Placement* w = of_workspace[static_cast<size_t>(v)]) release(w);
    for (int root : touched_roots(g, flow, v))
      if (placed[static_cast<size_t>(root)] && flow.dead(g, root)) {
        release(of_tensor[static_cast<size_t>(root)]);
        placed[static_cast<size_t>(root)] = false;
      }
  };
  ex.seconds = run_order(m, g, order, flow, B, S, step, get, workspace, after);
  results(g, flow, get, ex);
  // The highest granule any write reached, read from the memory: its end.
  for (size_t k = owner.size(); k-- > 0;) {
    const unsigned char* granule = arena.get() + k * static_cast<size_t>(A);
    if (std::any_of(granule, granule + A, [](unsigned char b) { return b != kCanary; })) {
      ex.touched_bytes = static_cast<int64_t>(k + 1) * A;
      break;
    }
  }
  return ex;
}

Execution execute_dynamic(model::Model& m, const Graph& g, const Order& order, std::span<const int32_t> tokens,
                          int64_t B, int64_t S, std::span<const int32_t> targets, uint64_t step) {
  if (!is_topological(g, order)) throw InputError("[sched] execute: the order is not a topological order of the graph");
  Flow flow(g);
  check_tokens(g, flow, tokens, B, S, targets);
  std::vector<std::unique_ptr<unsigned char[]>> memory(g.tensors.size());
  Execution ex;
  int64_t live = 0;
  auto allocate = [&](int root) {
    const int64_t bytes = g.tensors[static_cast<size_t>(root)].bytes;
    if (bytes == 0 || memory[static_cast<size_t>(root)]) return;
    memory[static_cast<size_t>(root)] = std::make_unique<unsigned char[]>(static_cast<size_t>(bytes));
    live += bytes;
  };
  for (size_t t = 0; t < g.tensors.size(); ++t)
    if (g.tensors[t].producer < 0) allocate(flow.buffer_of[t]);
  auto get = [&](int t) -> void* { return memory[static_cast<size_t>(flow.buffer_of[static_cast<size_t>(t)])].get(); };
  std::memcpy(get(flow.tokens), tokens.data(), tokens.size_bytes());
  if (flow.targets >= 0) std::memcpy(get(flow.targets), targets.data(), targets.size_bytes());
  std::unique_ptr<unsigned char[]> scratch;
  auto workspace = [&](int v) -> void* {
    const Node& n = g.nodes[static_cast<size_t>(v)];
    for (int t : n.outputs) allocate(flow.buffer_of[static_cast<size_t>(t)]);
    scratch.reset();
    if (n.workspace > 0) scratch = std::make_unique<unsigned char[]>(static_cast<size_t>(n.workspace));
    ex.high_water = std::max(ex.high_water, live + n.workspace);  // while v runs
    return scratch.get();
  };
  auto after = [&](int v) {
    scratch.reset();
    for (int root : touched_roots(g, flow, v))
      if (memory[static_cast<size_t>(root)] && flow.dead(g, root)) {
        memory[static_cast<size_t>(root)].reset();
        live -= g.tensors[static_cast<size_t>(root)].bytes;
      }
  };
  ex.seconds = run_order(m, g, order, flow, B, S, step, get, workspace, after);
  results(g, flow, get, ex);
  return ex;
}

std::vector<std::vector<int64_t>> expert_rows_of(model::Model& m, std::span<const int32_t> tokens, int64_t B,
                                                 int64_t S) {
  std::vector<float> logits(static_cast<size_t>(B * S * m.config().vocab_size));
  m.set_router_stats(true);
  m.forward(tokens, B, S, logits);
  model::Model::RouterStats stats = m.router_stats();
  m.set_router_stats(false);
  return stats.counts;
}

Order random_order(const Graph& g, uint64_t seed) {
  const auto succ = g.successors();
  std::vector<int> indegree(g.nodes.size(), 0), ready;
  for (const auto& s : succ)
    for (int w : s) ++indegree[static_cast<size_t>(w)];
  for (size_t v = 0; v < g.nodes.size(); ++v)
    if (indegree[v] == 0) ready.push_back(static_cast<int>(v));
  std::mt19937_64 rng(seed);
  Order order;
  while (!ready.empty()) {
    const size_t i = std::uniform_int_distribution<size_t>(0, ready.size() - 1)(rng);
    const int v = ready[i];
    ready.erase(ready.begin() + static_cast<std::ptrdiff_t>(i));
    order.push_back(v);
    for (int w : succ[static_cast<size_t>(v)])
      if (--indegree[static_cast<size_t>(w)] == 0) ready.push_back(w);
  }
  return order;
}

}  // namespace concord::sched
