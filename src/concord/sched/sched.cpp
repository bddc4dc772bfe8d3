// Peak-memory scheduling (sched.h): the memory model, the schedulers and the lower bounds.
#include "concord/sched/sched.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <unordered_map>

#include <fmt/format.h>

#include "concord/numerics/check.h"

namespace concord::sched {

int Graph::add_tensor(std::string name, int64_t bytes, bool keep) {
  tensors.push_back({std::move(name), bytes, -1, keep});
  return static_cast<int>(tensors.size()) - 1;
}

int Graph::add_node(std::string name, std::vector<int> inputs, std::vector<int> outputs, int64_t workspace,
                    int inplace_input) {
  const int v = static_cast<int>(nodes.size());
  for (int t : outputs) {
    if (t < 0 || t >= static_cast<int>(tensors.size()))
      throw InputError(fmt::format("[sched] node '{}': output tensor {} does not exist", name, t));
    if (tensors[static_cast<size_t>(t)].producer >= 0)
      throw InputError(fmt::format("[sched] node '{}': tensor '{}' is already produced by node '{}'", name,
                                   tensors[static_cast<size_t>(t)].name,
                                   nodes[static_cast<size_t>(tensors[static_cast<size_t>(t)].producer)].name));
    tensors[static_cast<size_t>(t)].producer = v;
  }
  nodes.push_back({std::move(name), std::move(inputs), std::move(outputs), workspace, inplace_input});
  return v;
}

void Graph::validate() const {
  const auto T = static_cast<int>(tensors.size());
  for (const Tensor& t : tensors)
    if (t.bytes < 0) throw InputError(fmt::format("[sched] tensor '{}' has {} bytes", t.name, t.bytes));
  for (size_t v = 0; v < nodes.size(); ++v) {
    const Node& n = nodes[v];
    if (n.workspace < 0) throw InputError(fmt::format("[sched] node '{}' has workspace {}", n.name, n.workspace));
    for (int t : n.inputs)
      if (t < 0 || t >= T) throw InputError(fmt::format("[sched] node '{}': input tensor {} does not exist", n.name, t));
    for (int t : n.outputs)
      if (t < 0 || t >= T || tensors[static_cast<size_t>(t)].producer != static_cast<int>(v))
        throw InputError(fmt::format("[sched] node '{}': output {} is not recorded as its own", n.name, t));
    if (n.inplace_input >= static_cast<int>(n.inputs.size()) || (n.inplace_input >= 0 && n.outputs.empty()))
      throw InputError(fmt::format("[sched] node '{}': in-place input {} with {} inputs and {} outputs", n.name,
                                   n.inplace_input, n.inputs.size(), n.outputs.size()));
  }
  // Acyclic: Kahn's algorithm must take every node.
  const auto succ = successors();
  std::vector<int> indegree(nodes.size(), 0);
  for (const auto& s : succ)
    for (int w : s) ++indegree[static_cast<size_t>(w)];
  std::vector<int> ready;
  for (size_t v = 0; v < nodes.size(); ++v)
    if (indegree[v] == 0) ready.push_back(static_cast<int>(v));
  size_t taken = 0;
  while (!ready.empty()) {
    const int v = ready.back();
    ready.pop_back();
    ++taken;
    for (int w : succ[static_cast<size_t>(v)])
      if (--indegree[static_cast<size_t>(w)] == 0) ready.push_back(w);
  }
  if (taken != nodes.size()) throw InputError("[sched] the graph has a cycle");
}

std::vector<std::vector<int>> Graph::successors() const {
  std::vector<std::vector<int>> succ(nodes.size());
  for (size_t v = 0; v < nodes.size(); ++v)
    for (int t : nodes[v].inputs) {
      const int p = tensors[static_cast<size_t>(t)].producer;
      if (p >= 0 && std::find(succ[static_cast<size_t>(p)].begin(), succ[static_cast<size_t>(p)].end(),
                              static_cast<int>(v)) == succ[static_cast<size_t>(p)].end())
        succ[static_cast<size_t>(p)].push_back(static_cast<int>(v));
    }
  return succ;
}

namespace {

// The graph as the memory model sees it: buffers (an in-place output shares its input's buffer,
// when that input has no other consumer, is not kept and is at least as large), their bytes, and
// for every node the buffers it allocates and the predecessors it needs.
struct Model {
  int N = 0, T = 0;
  std::vector<int> buffer_of;                 // tensor -> buffer (root tensor index)
  std::vector<int64_t> buffer_bytes;          // by root tensor
  std::vector<std::vector<int>> consumers;    // tensor -> nodes reading it (distinct)
  std::vector<std::vector<int>> allocates;    // node -> root tensors it allocates
  std::vector<std::vector<int>> members;      // root -> tensors sharing its buffer
  std::vector<std::vector<int>> preds;        // node -> producer nodes of its inputs (distinct)
  std::vector<int64_t> workspace;

  explicit Model(const Graph& g) : N(static_cast<int>(g.nodes.size())), T(static_cast<int>(g.tensors.size())) {
    g.validate();
    consumers.resize(static_cast<size_t>(T));
    for (int v = 0; v < N; ++v)
      for (int t : g.nodes[static_cast<size_t>(v)].inputs) {
        auto& c = consumers[static_cast<size_t>(t)];
        if (std::find(c.begin(), c.end(), v) == c.end()) c.push_back(v);
      }
    buffer_of.resize(static_cast<size_t>(T));
    std::iota(buffer_of.begin(), buffer_of.end(), 0);
    allocates.resize(static_cast<size_t>(N));
    preds.resize(static_cast<size_t>(N));
    workspace.resize(static_cast<size_t>(N));
    // Nodes in a topological order, so that an in-place input's buffer is known first.
    for (int v : topological(g)) {
      const Node& n = g.nodes[static_cast<size_t>(v)];
      workspace[static_cast<size_t>(v)] = n.workspace;
      for (int t : n.inputs) {
        const int p = g.tensors[static_cast<size_t>(t)].producer;
        if (p >= 0 && std::find(preds[static_cast<size_t>(v)].begin(), preds[static_cast<size_t>(v)].end(), p) ==
                          preds[static_cast<size_t>(v)].end())
          preds[static_cast<size_t>(v)].push_back(p);
      }
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        const int out = n.outputs[k];
        if (k == 0 && n.inplace_input >= 0) {
          const int in = n.inputs[static_cast<size_t>(n.inplace_input)];
          const Tensor& a = g.tensors[static_cast<size_t>(in)];
          if (!a.keep && consumers[static_cast<size_t>(in)].size() == 1 &&
              buffer_bytes_of(g, in) >= g.tensors[static_cast<size_t>(out)].bytes) {
            buffer_of[static_cast<size_t>(out)] = buffer_of[static_cast<size_t>(in)];
            continue;
          }
        }
        allocates[static_cast<size_t>(v)].push_back(out);
      }
    }
    buffer_bytes.resize(static_cast<size_t>(T), 0);
    members.resize(static_cast<size_t>(T));
    for (int t = 0; t < T; ++t) {
      members[static_cast<size_t>(buffer_of[static_cast<size_t>(t)])].push_back(t);
      if (buffer_of[static_cast<size_t>(t)] == t) buffer_bytes[static_cast<size_t>(t)] = g.tensors[static_cast<size_t>(t)].bytes;
    }
  }
  int64_t buffer_bytes_of(const Graph& g, int t) const {
    return g.tensors[static_cast<size_t>(buffer_of[static_cast<size_t>(t)])].bytes;
  }
  static std::vector<int> topological(const Graph& g) {
    const auto succ = g.successors();
    std::vector<int> indegree(g.nodes.size(), 0), order;
    for (const auto& s : succ)
      for (int w : s) ++indegree[static_cast<size_t>(w)];
    std::vector<int> ready;
    for (size_t v = g.nodes.size(); v-- > 0;)
      if (indegree[v] == 0) ready.push_back(static_cast<int>(v));
    while (!ready.empty()) {
      const int v = ready.back();
      ready.pop_back();
      order.push_back(v);
      for (int w : succ[static_cast<size_t>(v)])
        if (--indegree[static_cast<size_t>(w)] == 0) ready.push_back(w);
    }
    return order;
  }
};

// A set of executed nodes.
using Bits = std::vector<uint64_t>;
inline bool has(const Bits& b, int v) { return (b[static_cast<size_t>(v) / 64] >> (v % 64)) & 1u; }
inline void set(Bits& b, int v) { b[static_cast<size_t>(v) / 64] |= uint64_t{1} << (v % 64); }
struct BitsHash {
  size_t operator()(const Bits& b) const {
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (uint64_t w : b) h = (h ^ w) * 0xBF58476D1CE4E5B9ull + (h >> 29);
    return static_cast<size_t>(h);
  }
};

// Whether tensor t is live after the executed set: produced (or a graph input), and kept or read
// by a node not yet executed.
bool tensor_live(const Graph& g, const Model& m, const Bits& done, int t) {
  const Tensor& x = g.tensors[static_cast<size_t>(t)];
  if (x.producer >= 0 && !has(done, x.producer)) return false;
  if (x.keep) return true;
  for (int c : m.consumers[static_cast<size_t>(t)])
    if (!has(done, c)) return true;
  return false;
}

// Bytes live between steps, after the nodes of `done` ran.
int64_t memory_after(const Graph& g, const Model& m, const Bits& done) {
  int64_t total = 0;
  for (int r = 0; r < m.T; ++r) {
    if (m.buffer_of[static_cast<size_t>(r)] != r) continue;
    for (int t : m.members[static_cast<size_t>(r)])
      if (tensor_live(g, m, done, t)) {
        total += m.buffer_bytes[static_cast<size_t>(r)];
        break;
      }
  }
  return total;
}

// Bytes v allocates when it runs: its new buffers and its workspace.
int64_t allocated_by(const Graph& g, const Model& m, int v) {
  int64_t s = m.workspace[static_cast<size_t>(v)];
  for (int t : m.allocates[static_cast<size_t>(v)]) s += g.tensors[static_cast<size_t>(t)].bytes;
  return s;
}

// Bytes live while v runs when `after` bytes are live before it.
int64_t step_memory(const Graph& g, const Model& m, int64_t after, int v) { return after + allocated_by(g, m, v); }

bool ready(const Model& m, const Bits& done, int v) {
  if (has(done, v)) return false;
  for (int p : m.preds[static_cast<size_t>(v)])
    if (!has(done, p)) return false;
  return true;
}

// Bytes that become free once v has run, given `before` bytes live before it (the greedy's
// tie-break): what it allocates and what was live, less what stays live.
int64_t freed_by(const Graph& g, const Model& m, const Bits& done, int64_t before, int v) {
  Bits next = done;
  set(next, v);
  return before + allocated_by(g, m, v) - m.workspace[static_cast<size_t>(v)] - memory_after(g, m, next);
}

}  // namespace

bool is_topological(const Graph& g, const Order& order) {
  if (order.size() != g.nodes.size()) return false;
  std::vector<int> pos(g.nodes.size(), -1);
  for (size_t i = 0; i < order.size(); ++i) {
    const int v = order[i];
    if (v < 0 || v >= static_cast<int>(g.nodes.size()) || pos[static_cast<size_t>(v)] >= 0) return false;
    pos[static_cast<size_t>(v)] = static_cast<int>(i);
  }
  for (size_t v = 0; v < g.nodes.size(); ++v)
    for (int t : g.nodes[v].inputs) {
      const int p = g.tensors[static_cast<size_t>(t)].producer;
      if (p >= 0 && pos[static_cast<size_t>(p)] >= pos[v]) return false;
    }
  return true;
}

std::vector<int> buffer_of(const Graph& g) { return Model(g).buffer_of; }

std::vector<StepMemory> memory_profile(const Graph& g, const Order& order) {
  const Model m(g);
  if (!is_topological(g, order)) throw InputError("[sched] the order is not a topological order of the graph");
  std::vector<StepMemory> out;
  Bits done((g.nodes.size() + 63) / 64, 0);
  for (int v : order) {
    out.push_back({v, step_memory(g, m, memory_after(g, m, done), v)});
    set(done, v);
  }
  return out;
}

int64_t peak(const Graph& g, const Order& order) {
  int64_t p = 0;
  for (const StepMemory& s : memory_profile(g, order)) p = std::max(p, s.live);
  return p;
}

Order program_order(const Graph& g) {
  Order o(g.nodes.size());
  std::iota(o.begin(), o.end(), 0);
  g.validate();
  if (!is_topological(g, o)) throw InputError("[sched] the nodes are not listed in a topological order");
  return o;
}

Order greedy_order(const Graph& g) {
  const Model m(g);
  Bits done((g.nodes.size() + 63) / 64, 0);
  Order order;
  for (int k = 0; k < m.N; ++k) {
    const int64_t after = memory_after(g, m, done);
    int best = -1;
    int64_t best_step = 0, best_freed = 0;
    for (int v = 0; v < m.N; ++v) {
      if (!ready(m, done, v)) continue;
      const int64_t s = step_memory(g, m, after, v), f = freed_by(g, m, done, after, v);
      if (best < 0 || s < best_step || (s == best_step && f > best_freed)) {
        best = v;
        best_step = s;
        best_freed = f;
      }
    }
    order.push_back(best);
    set(done, best);
  }
  return order;
}

int64_t working_set_bound(const Graph& g) {
  const Model m(g);
  int64_t kept_inputs = 0;  // kept graph inputs are live throughout
  std::vector<bool> always(static_cast<size_t>(m.T), false);
  for (int t = 0; t < m.T; ++t) {
    const Tensor& x = g.tensors[static_cast<size_t>(t)];
    if (x.producer < 0 && x.keep && m.buffer_of[static_cast<size_t>(t)] == t) {
      kept_inputs += x.bytes;
      always[static_cast<size_t>(t)] = true;
    }
  }
  int64_t bound = kept_inputs;
  for (int v = 0; v < m.N; ++v) {
    const Node& n = g.nodes[static_cast<size_t>(v)];
    std::vector<int> buffers;
    for (int t : n.inputs) buffers.push_back(m.buffer_of[static_cast<size_t>(t)]);
    std::sort(buffers.begin(), buffers.end());
    buffers.erase(std::unique(buffers.begin(), buffers.end()), buffers.end());
    int64_t s = kept_inputs + m.workspace[static_cast<size_t>(v)];
    for (int b : buffers)
      if (!always[static_cast<size_t>(b)]) s += m.buffer_bytes[static_cast<size_t>(b)];
    for (int t : m.allocates[static_cast<size_t>(v)]) s += g.tensors[static_cast<size_t>(t)].bytes;
    bound = std::max(bound, s);
  }
  return bound;
}

DpResult dp_schedule(const Graph& g, const DpOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const Model m(g);
  DpResult r;
  // An upper bound to prune with: the greedy order (and program order when it is topological).
  Order best = greedy_order(g);
  int64_t ub = peak(g, best);
  const int64_t lb0 = working_set_bound(g);
  struct State {
    int64_t cost;
    int last;
    const Bits* parent;
  };
  const size_t W = (g.nodes.size() + 63) / 64;
  // Layer k: down-sets of k nodes reached with a prefix peak below the upper bound.
  std::vector<std::unordered_map<Bits, State, BitsHash>> layers(static_cast<size_t>(m.N) + 1);
  layers[0].emplace(Bits(W, 0), State{0, -1, nullptr});
  int64_t explored = 1;
  int completed = 0;  // layers fully expanded
  bool stopped = false;
  for (int k = 0; k < m.N && !stopped; ++k) {
    for (const auto& [bits, st] : layers[static_cast<size_t>(k)]) {
      const int64_t after = memory_after(g, m, bits);
      for (int v = 0; v < m.N; ++v) {
        if (!ready(m, bits, v)) continue;
        const int64_t cost = std::max(st.cost, step_memory(g, m, after, v));
        if (cost >= ub) continue;  // cannot beat the best order known
        Bits next = bits;
        set(next, v);
        auto [it, inserted] = layers[static_cast<size_t>(k) + 1].try_emplace(std::move(next), State{cost, v, &bits});
        if (!inserted && cost < it->second.cost) it->second = State{cost, v, &bits};
        if (inserted) ++explored;
      }
    }
    completed = k + 1;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (explored > options.max_states || seconds > options.max_seconds) stopped = k + 1 < m.N;
  }
  r.states = explored;
  const auto& final_layer = layers[static_cast<size_t>(m.N)];
  if (!stopped) {
    // Every order with a peak below the greedy's reached the full set; none: the greedy is optimal.
    if (!final_layer.empty()) {
      const auto& [bits, st] = *final_layer.begin();
      r.peak = st.cost;
      Order o;
      const Bits* b = &bits;
      State s = st;
      for (int k = m.N; k > 0; --k) {
        o.push_back(s.last);
        b = s.parent;
        if (k > 1) s = layers[static_cast<size_t>(k) - 1].at(*b);
      }
      std::reverse(o.begin(), o.end());
      best = std::move(o);
      ub = r.peak;
    }
    r.order = best;
    r.peak = ub;
    r.lower_bound = ub;
    r.optimal = true;
  } else {
    // The bound: every order's prefix of `completed` nodes is in that layer (or already peaks at
    // the upper bound), so no order peaks below the layer's smallest prefix peak.
    int64_t layer_min = ub;
    for (const auto& [bits, st] : layers[static_cast<size_t>(completed)]) layer_min = std::min(layer_min, st.cost);
    r.order = best;
    r.peak = ub;
    r.lower_bound = std::min(ub, std::max(lb0, layer_min));
    r.optimal = r.lower_bound == r.peak;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::pair<Order, int64_t> brute_force_schedule(const Graph& g, int max_nodes) {
  if (static_cast<int>(g.nodes.size()) > max_nodes)
    throw InputError(fmt::format("[sched] brute force over {} nodes (at most {})", g.nodes.size(), max_nodes));
  const Model m(g);
  Bits done((g.nodes.size() + 63) / 64, 0);
  Order cur, best;
  int64_t best_peak = std::numeric_limits<int64_t>::max();
  std::function<void(int64_t)> rec = [&](int64_t prefix) {
    if (static_cast<int>(cur.size()) == m.N) {
      if (prefix < best_peak) {
        best_peak = prefix;
        best = cur;
      }
      return;
    }
    const int64_t after = memory_after(g, m, done);
    for (int v = 0; v < m.N; ++v) {
      if (!ready(m, done, v)) continue;
      const int64_t cost = std::max(prefix, step_memory(g, m, after, v));
      cur.push_back(v);
      set(done, v);
      rec(cost);
      done[static_cast<size_t>(v) / 64] &= ~(uint64_t{1} << (v % 64));
      cur.pop_back();
    }
  };
  rec(0);
  if (m.N == 0) best_peak = 0;
  return {best, best_peak};
}

Graph random_graph(int nodes, uint64_t seed, int64_t max_bytes) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  Graph g;
  const int inputs = static_cast<int>(uniform(1, 3));
  std::vector<int> available;
  for (int i = 0; i < inputs; ++i) available.push_back(g.add_tensor(fmt::format("in{}", i), uniform(1, max_bytes)));
  for (int v = 0; v < nodes; ++v) {
    const int reads = static_cast<int>(std::min<int64_t>(uniform(1, 3), static_cast<int64_t>(available.size())));
    std::vector<int> in;
    for (int k = 0; k < reads; ++k) {
      // Mostly recent tensors (a chain with side branches), sometimes any earlier one.
      const auto n = static_cast<int64_t>(available.size());
      const int64_t pick = uniform(0, 3) == 0 ? uniform(0, n - 1) : std::max<int64_t>(0, n - 1 - uniform(0, 2));
      const int t = available[static_cast<size_t>(pick)];
      if (std::find(in.begin(), in.end(), t) == in.end()) in.push_back(t);
    }
    const int outs = uniform(0, 4) == 0 ? 2 : 1;
    std::vector<int> out;
    for (int k = 0; k < outs; ++k)
      out.push_back(g.add_tensor(fmt::format("t{}_{}", v, k), uniform(1, max_bytes), uniform(0, 9) == 0));
    const int inplace = uniform(0, 2) == 0 ? 0 : -1;
    g.add_node(fmt::format("n{}", v), in, out, uniform(0, 3) == 0 ? uniform(1, max_bytes / 2 + 1) : 0, inplace);
    for (int t : out) available.push_back(t);
  }
  return g;
}

}  // namespace concord::sched
