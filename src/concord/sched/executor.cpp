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

// What every run of a graph shares: each tensor's buffer and the buffer's members, how many
// nodes read each tensor, each node's distinct inputs and the buffers its step may let go of
// (its inputs' and outputs'), as flat lists (CSR).
struct Analysis {
  std::vector<int> buffer_of;                // tensor -> root tensor of its buffer
  std::vector<int> member_start, members;    // root -> tensors in the buffer
  std::vector<int> readers;                  // tensor -> distinct nodes reading it
  std::vector<int> read_start, reads;        // node -> its distinct inputs
  std::vector<int> root_start, roots;        // node -> the distinct roots of its inputs and outputs
  int tokens = -1, logits = -1, targets = -1, loss = -1;

  explicit Analysis(const Graph& g) : buffer_of(sched::buffer_of(g)) {
    const size_t T = g.tensors.size();
    std::vector<std::vector<int>> by_root(T);
    for (size_t t = 0; t < T; ++t) {
      by_root[static_cast<size_t>(buffer_of[t])].push_back(static_cast<int>(t));
      if (g.tensors[t].name == "tokens") tokens = static_cast<int>(t);
      if (g.tensors[t].name == "logits") logits = static_cast<int>(t);
      if (g.tensors[t].name == "targets") targets = static_cast<int>(t);
      if (g.tensors[t].name == "loss") loss = static_cast<int>(t);
    }
    member_start.push_back(0);
    for (const auto& m : by_root) {
      members.insert(members.end(), m.begin(), m.end());
      member_start.push_back(static_cast<int>(members.size()));
    }
    readers.assign(T, 0);
    read_start.push_back(0);
    root_start.push_back(0);
    for (const Node& n : g.nodes) {
      std::vector<int> in = n.inputs;
      std::sort(in.begin(), in.end());
      in.erase(std::unique(in.begin(), in.end()), in.end());
      for (int t : in) ++readers[static_cast<size_t>(t)];
      reads.insert(reads.end(), in.begin(), in.end());
      read_start.push_back(static_cast<int>(reads.size()));
      std::vector<int> r;
      for (const auto* list : {&n.inputs, &n.outputs})
        for (int t : *list) r.push_back(buffer_of[static_cast<size_t>(t)]);
      std::sort(r.begin(), r.end());
      r.erase(std::unique(r.begin(), r.end()), r.end());
      roots.insert(roots.end(), r.begin(), r.end());
      root_start.push_back(static_cast<int>(roots.size()));
    }
    if (tokens < 0 || g.tensors[static_cast<size_t>(tokens)].producer >= 0)
      throw InputError("[sched] execute: the graph has no 'tokens' input (model_graph makes one)");
  }
  std::span<const int> reads_of(int v) const {
    return std::span(reads).subspan(static_cast<size_t>(read_start[static_cast<size_t>(v)]),
                                    static_cast<size_t>(read_start[static_cast<size_t>(v) + 1] - read_start[static_cast<size_t>(v)]));
  }
  std::span<const int> roots_of(int v) const {
    return std::span(roots).subspan(static_cast<size_t>(root_start[static_cast<size_t>(v)]),
                                    static_cast<size_t>(root_start[static_cast<size_t>(v) + 1] - root_start[static_cast<size_t>(v)]));
  }
};

// One run's state: which tensors are produced, how many readers each still waits for.
struct Flow {
  const Analysis& a;
  std::vector<int> pending;   // tensor -> readers not yet run
  std::vector<char> produced;
  int tokens, logits, targets, loss;

  Flow(const Graph& g, const Analysis& analysis)
      : a(analysis), pending(analysis.readers), produced(g.tensors.size(), 0), tokens(analysis.tokens),
        logits(analysis.logits), targets(analysis.targets), loss(analysis.loss) {
    for (size_t t = 0; t < g.tensors.size(); ++t)
      if (g.tensors[t].producer < 0) produced[t] = 1;
  }
  // Whether buffer `root` holds nothing a later node reads (every member produced, read by all
  // its consumers, not kept).
  bool dead(const Graph& g, int root) const {
    for (int k = a.member_start[static_cast<size_t>(root)]; k < a.member_start[static_cast<size_t>(root) + 1]; ++k) {
      const auto t = static_cast<size_t>(a.members[static_cast<size_t>(k)]);
      if (!produced[t] || pending[t] > 0 || g.tensors[t].keep) return false;
    }
    return true;
  }
};

// The model's node behind a graph node: "embed" / "final_norm" / "lm_head" or "a<N>.<node>".
std::pair<int64_t, std::string_view> node_of(const std::string& name) {
  if (name.size() > 2 && name[0] == 'a' && name[1] >= '0' && name[1] <= '9') {
    const size_t dot = name.find('.');
    if (dot != std::string::npos) {
      int64_t a = 0;
      for (size_t i = 1; i < dot; ++i) a = a * 10 + (name[i] - '0');
      return {a, std::string_view(name).substr(dot + 1)};
    }
  }
  return {-1, name};
}

// Runs `order`: workspace(v) allocates node v's outputs and returns its workspace, get(t) gives
// tensor t's memory, after(v) frees what v was the last to read.
template <class Get, class Workspace, class After>
double run_order(model::Model& m, const Graph& g, const Order& order, Flow& flow, int64_t B, int64_t S, uint64_t step,
                 const model::Model::CachedRows* cached, Get get, Workspace workspace, After after) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<const void*> in;
  std::vector<void*> out;
  std::vector<int64_t> in_bytes, out_bytes;
  for (int v : order) {
    const Node& n = g.nodes[static_cast<size_t>(v)];
    void* scratch = workspace(v);  // allocates v's outputs and workspace
    in.clear();
    out.clear();
    in_bytes.clear();
    out_bytes.clear();
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
                .step = step,
                .cached = cached});
    for (int t : n.outputs) flow.produced[static_cast<size_t>(t)] = 1;
    for (int t : flow.a.reads_of(v)) --flow.pending[static_cast<size_t>(t)];
    after(v);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void check_tokens(const Graph& g, const Flow& flow, std::span<const int32_t> tokens, int64_t B, int64_t S,
                  std::span<const int32_t> targets) {
  if (flow.logits < 0) throw InputError("[sched] execute: the graph has no 'logits' tensor (a full-sequence pass makes one)");
  if (g.outside_bytes > 0)
    throw InputError("[sched] execute: a cached pass's graph (prefill, decode) runs on a KV cache: give the cache and its inputs");
  if (static_cast<int64_t>(tokens.size()) != B * S || g.tensors[static_cast<size_t>(flow.tokens)].bytes != B * S * 4)
    throw InputError(fmt::format("[sched] execute: {} tokens for a graph of {} rows (B {} x S {} given)", tokens.size(),
                                 g.tensors[static_cast<size_t>(flow.tokens)].bytes / 4, B, S));
  if ((flow.targets >= 0) != !targets.empty() || (!targets.empty() && targets.size() != tokens.size()))
    throw InputError(fmt::format("[sched] execute: {} targets for {} tokens (the training step's graph takes one per "
                                 "token, the other passes none)", targets.size(), tokens.size()));
}

// What a run leaves: the logits when kept (into `logits_out` when given: its size checked before
// the run), the training step's loss.
void results(const Graph& g, const Flow& flow, const std::function<const void*(int)>& get, Execution& ex,
             std::span<float> logits_out) {
  if (flow.logits >= 0 && g.tensors[static_cast<size_t>(flow.logits)].keep) {
    const auto* logits = static_cast<const float*>(get(flow.logits));
    const auto floats = static_cast<size_t>(g.tensors[static_cast<size_t>(flow.logits)].bytes / 4);
    if (logits_out.size() == floats) std::memcpy(logits_out.data(), logits, 4 * floats);
    else ex.logits.assign(logits, logits + floats);
  }
  if (flow.loss >= 0) std::memcpy(&ex.loss, get(flow.loss), sizeof(double));
}

// What a run is given: the tokens (and the training step's targets) written into the graph's
// inputs, the rows of a cached pass.
struct Feed {
  std::span<const int32_t> tokens = {}, targets = {};
  int64_t B = 0, S = 0;
  uint64_t step = 0;
  const model::Model::CachedRows* cached = nullptr;
};

// A cached pass's rows, checked against the graph and the cache; each slot's rows reserved.
struct CachedPass {
  std::vector<int32_t> tokens, positions, logit_positions;
  std::vector<int64_t> start, row_splits, logit_splits;
  model::Model::CachedRows rows;

  CachedPass(const model::Model& m, const Graph& g, const Flow& flow, model::KvCache& cache,
             std::span<const model::CachedInput> inputs) {
    const size_t n = inputs.size();
    if (n == 0) throw InputError("[sched] execute: a cached pass with no inputs");
    if (g.outside_bytes == 0) throw InputError("[sched] execute: the graph is not a cached pass's (model_graph with a CachedShape)");
    row_splits.assign(n + 1, 0);
    logit_splits.assign(n + 1, 0);
    for (size_t i = 0; i < n; ++i) {
      const model::CachedInput& in = inputs[i];
      for (size_t j = 0; j < i; ++j)
        if (inputs[j].slot == in.slot) throw InputError(fmt::format("[sched] execute: slot {} appears twice", in.slot));
      if (in.tokens.empty()) throw InputError(fmt::format("[sched] execute: no tokens for slot {}", in.slot));
      start.push_back(cache.length(in.slot));  // throws for a slot not in use
      const auto count = static_cast<int64_t>(in.tokens.size());
      const int64_t take = in.logits == model::LogitRows::all ? count : in.logits == model::LogitRows::last ? 1 : 0;
      row_splits[i + 1] = row_splits[i] + count;
      logit_splits[i + 1] = logit_splits[i] + take;
      tokens.insert(tokens.end(), in.tokens.begin(), in.tokens.end());
      for (int64_t r = 0; r < count; ++r) positions.push_back(static_cast<int32_t>(start[i] + r));
      for (int64_t r = count - take; r < count; ++r) logit_positions.push_back(static_cast<int32_t>(start[i] + r));
    }
    const int64_t V = m.config().vocab_size, R = logit_splits[n];
    if (g.tensors[static_cast<size_t>(flow.tokens)].bytes != row_splits[n] * 4 ||
        (flow.logits >= 0 ? g.tensors[static_cast<size_t>(flow.logits)].bytes : 0) != R * V * 4)
      throw InputError(fmt::format("[sched] execute: {} new tokens with {} logit rows, the graph was made for {} and {} "
                                   "(model_graph of these inputs' CachedShape)",
                                   row_splits[n], R, g.tensors[static_cast<size_t>(flow.tokens)].bytes / 4,
                                   flow.logits >= 0 ? g.tensors[static_cast<size_t>(flow.logits)].bytes / (4 * V) : 0));
    for (size_t i = 0; i < n; ++i) cache.reserve(inputs[i].slot, start[i] + row_splits[i + 1] - row_splits[i]);
    rows = {.cache = &cache,
            .inputs = inputs,
            .start = start,
            .row_splits = row_splits,
            .positions = positions,
            .logit_positions = logit_positions,
            .logit_splits = logit_splits};
  }
  // After the pass: every slot holds its new rows.
  void commit() const {
    for (size_t i = 0; i < rows.inputs.size(); ++i)
      rows.cache->set_length(rows.inputs[i].slot, start[i] + row_splits[i + 1] - row_splits[i]);
  }
};

Execution run_planned(model::Model& m, const Graph& g, const Order& order, const ArenaPlan& plan, Flow& flow,
                      const Feed& feed, ArenaMemory* memory, std::span<float> logits_out = {}) {
  const std::span<const int32_t> tokens = feed.tokens, targets = feed.targets;
  const int64_t A = plan.alignment;
  if (A < 4 || A % 4 != 0 || plan.arena_bytes % A != 0)
    throw InputError(fmt::format("[sched] execute: plan alignment {} (a multiple of 4, the floats') and arena {} bytes", A,
                                 plan.arena_bytes));
  // The arena, filled with the canary, and who owns each granule (0: free, else root + 1) — or,
  // reused memory (the engine's), neither: the plan's offsets are trusted (replay_plan and the
  // tests check them), and the high-water mark is the plan's.
  const auto arena_bytes = static_cast<size_t>(plan.arena_bytes);
  ArenaMemory own;
  ArenaMemory& mem = memory != nullptr ? *memory : own;
  mem.reserve(plan.arena_bytes);
  unsigned char* const arena = mem.data();
  const bool instrument = memory == nullptr;
  if (instrument) std::memset(arena, kCanary, arena_bytes);
  std::vector<int> owner(instrument ? arena_bytes / static_cast<size_t>(A) : 0, 0);

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
    ex.high_water = std::max(ex.high_water, end);
    if (!instrument) return;
    for (int64_t k = p->offset / A; k < end / A; ++k) {
      int& o = owner[static_cast<size_t>(k)];
      if (o != 0 && o != id + (id >= 0 ? 1 : 0))
        throw InternalError(fmt::format("[sched] execute: '{}' placed at {} over '{}', still live", name_of(id), p->offset,
                                        name_of(o > 0 ? o - 1 : o)));
      o = id >= 0 ? id + 1 : id;
    }
  };
  auto release = [&](const Placement* p) {
    if (!instrument) return;
    const int64_t end = p->offset + (p->bytes + A - 1) / A * A;
    std::fill(owner.begin() + p->offset / A, owner.begin() + end / A, 0);
  };
  auto get = [&](int t) -> void* {
    const Placement* p = of_tensor[static_cast<size_t>(t)];
    return p == nullptr ? nullptr : arena + p->offset;
  };
  std::vector<bool> placed(g.tensors.size(), false);
  auto place_tensor = [&](int t) {
    const int root = flow.a.buffer_of[static_cast<size_t>(t)];
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
    return arena + w->offset;
  };
  auto after = [&](int v) {
    if (const Placement* w = of_workspace[static_cast<size_t>(v)]) release(w);
    for (int root : flow.a.roots_of(v))
      if (placed[static_cast<size_t>(root)] && flow.dead(g, root)) {
        release(of_tensor[static_cast<size_t>(root)]);
        placed[static_cast<size_t>(root)] = false;
      }
  };
  ex.seconds = run_order(m, g, order, flow, feed.B, feed.S, feed.step, feed.cached, get, workspace, after);
  results(g, flow, get, ex, logits_out);
  // The highest granule any write reached, read from the memory: its end.
  for (size_t k = owner.size(); k-- > 0;) {
    const unsigned char* granule = arena + k * static_cast<size_t>(A);
    if (std::any_of(granule, granule + A, [](unsigned char b) { return b != kCanary; })) {
      ex.touched_bytes = static_cast<int64_t>(k + 1) * A;
      break;
    }
  }
  return ex;
}

Execution run_dynamic(model::Model& m, const Graph& g, const Order& order, Flow& flow, const Feed& feed) {
  const std::span<const int32_t> tokens = feed.tokens, targets = feed.targets;
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
    if (g.tensors[t].producer < 0) allocate(flow.a.buffer_of[t]);
  auto get = [&](int t) -> void* { return memory[static_cast<size_t>(flow.a.buffer_of[static_cast<size_t>(t)])].get(); };
  std::memcpy(get(flow.tokens), tokens.data(), tokens.size_bytes());
  if (flow.targets >= 0) std::memcpy(get(flow.targets), targets.data(), targets.size_bytes());
  std::unique_ptr<unsigned char[]> scratch;
  auto workspace = [&](int v) -> void* {
    const Node& n = g.nodes[static_cast<size_t>(v)];
    for (int t : n.outputs) allocate(flow.a.buffer_of[static_cast<size_t>(t)]);
    scratch.reset();
    if (n.workspace > 0) scratch = std::make_unique<unsigned char[]>(static_cast<size_t>(n.workspace));
    ex.high_water = std::max(ex.high_water, live + n.workspace);  // while v runs
    return scratch.get();
  };
  auto after = [&](int v) {
    scratch.reset();
    for (int root : flow.a.roots_of(v))
      if (memory[static_cast<size_t>(root)] && flow.dead(g, root)) {
        memory[static_cast<size_t>(root)].reset();
        live -= g.tensors[static_cast<size_t>(root)].bytes;
      }
  };
  ex.seconds = run_order(m, g, order, flow, feed.B, feed.S, feed.step, feed.cached, get, workspace, after);
  results(g, flow, get, ex, {});
  return ex;
}

void check_order(const Graph& g, const Order& order) {
  if (!is_topological(g, order)) throw InputError("[sched] execute: the order is not a topological order of the graph");
}

}  // namespace

void ArenaMemory::reserve(int64_t bytes) {
  if (bytes <= bytes_) return;
  const auto size = static_cast<size_t>((bytes + 63) / 64 * 64);
  unsigned char* p = static_cast<unsigned char*>(std::aligned_alloc(64, size));
  if (p == nullptr) throw std::bad_alloc();
  std::free(data_);
  data_ = p;
  bytes_ = static_cast<int64_t>(size);
}

ArenaMemory::~ArenaMemory() { std::free(data_); }

Execution execute_planned(model::Model& m, const Graph& g, const Order& order, const ArenaPlan& plan,
                          std::span<const int32_t> tokens, int64_t B, int64_t S, std::span<const int32_t> targets,
                          uint64_t step) {
  check_order(g, order);
  const Analysis analysis(g);
  Flow flow(g, analysis);
  check_tokens(g, flow, tokens, B, S, targets);
  return run_planned(m, g, order, plan, flow, {.tokens = tokens, .targets = targets, .B = B, .S = S, .step = step},
                     nullptr);
}

Execution execute_dynamic(model::Model& m, const Graph& g, const Order& order, std::span<const int32_t> tokens,
                          int64_t B, int64_t S, std::span<const int32_t> targets, uint64_t step) {
  check_order(g, order);
  const Analysis analysis(g);
  Flow flow(g, analysis);
  check_tokens(g, flow, tokens, B, S, targets);
  return run_dynamic(m, g, order, flow, {.tokens = tokens, .targets = targets, .B = B, .S = S, .step = step});
}

Execution execute_planned(model::Model& m, const Graph& g, const Order& order, const ArenaPlan& plan,
                          model::KvCache& cache, std::span<const model::CachedInput> inputs, ArenaMemory* memory) {
  check_order(g, order);
  const Analysis analysis(g);
  Flow flow(g, analysis);
  CachedPass pass(m, g, flow, cache, inputs);
  Execution ex = run_planned(m, g, order, plan, flow, {.tokens = pass.tokens, .cached = &pass.rows}, memory);
  pass.commit();
  return ex;
}

Execution execute_dynamic(model::Model& m, const Graph& g, const Order& order, model::KvCache& cache,
                          std::span<const model::CachedInput> inputs) {
  check_order(g, order);
  const Analysis analysis(g);
  Flow flow(g, analysis);
  CachedPass pass(m, g, flow, cache, inputs);
  Execution ex = run_dynamic(m, g, order, flow, {.tokens = pass.tokens, .cached = &pass.rows});
  pass.commit();
  return ex;
}

struct PreparedPass::Impl {
  Graph graph;
  Order order;
  ArenaPlan plan;
  Analysis analysis;
  Impl(Graph g, Order o, ArenaPlan p) : graph(std::move(g)), order(std::move(o)), plan(std::move(p)), analysis(graph) {}
};

PreparedPass::PreparedPass(Graph graph, Order order, ArenaPlan plan) {
  check_order(graph, order);
  if (graph.outside_bytes == 0)
    throw InputError("[sched] prepare: the graph is not a cached pass's (model_graph with a CachedShape)");
  replay_plan(graph, order, plan);  // every tensor placed, nothing live overlapping: checked once here
  impl_ = std::make_unique<Impl>(std::move(graph), std::move(order), std::move(plan));
}
PreparedPass::PreparedPass(PreparedPass&&) noexcept = default;
PreparedPass& PreparedPass::operator=(PreparedPass&&) noexcept = default;
PreparedPass::~PreparedPass() = default;
const Graph& PreparedPass::graph() const { return impl_->graph; }
const Order& PreparedPass::order() const { return impl_->order; }
const ArenaPlan& PreparedPass::plan() const { return impl_->plan; }

Execution PreparedPass::run(model::Model& m, model::KvCache& cache, std::span<const model::CachedInput> inputs,
                            ArenaMemory& memory, std::span<float> logits) const {
  const Impl& p = *impl_;
  Flow flow(p.graph, p.analysis);
  CachedPass pass(m, p.graph, flow, cache, inputs);
  const int64_t want = flow.logits >= 0 ? p.graph.tensors[static_cast<size_t>(flow.logits)].bytes / 4 : 0;
  if (static_cast<int64_t>(logits.size()) != want)
    throw InputError(fmt::format("[sched] execute: the logits buffer holds {} floats, the pass writes {}", logits.size(), want));
  Execution ex = run_planned(m, p.graph, p.order, p.plan, flow, {.tokens = pass.tokens, .cached = &pass.rows}, &memory,
                             logits);
  pass.commit();
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
