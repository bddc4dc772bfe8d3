// Blocks and the schedule (internal to model/). The decoder is a list of blocks — today one type,
// the dense Qwen3/Qwen2/Llama layer — and a forward pass is the schedule's list of block
// applications (ModelConfig::schedule; the identity by default). A block type keeps its forward
// and its backward side by side; the one piece of the forward that depends on the pass,
// attention, is handed in:
//   - the training forward (model.cpp) attends over whole sequences and keeps the probabilities
//     for the backward;
//   - the KV-cache forward (decode.cpp) appends the new keys and values to the cache rows of the
//     application and attends one query row at a time.
// Both run the same block code around it, which is why the engine reproduces the training
// forward bit for bit (docs/engine.md).
//
// Indexing: activations, KV-cache rows and the backward's random streams are per application;
// parameters (and so weight gradients) per block. A block applied more than once accumulates its
// weight gradients over its applications; its first application keeps the SR stream ids of the
// identity schedule (the parameter index), a repeat gets ids past every parameter's and the head's
// (gemm_stream_id), so the identity schedule computes exactly what the layer loop did.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "concord/model/model_impl.h"

namespace concord::model {

// One application of a block within a pass.
struct BlockPass {
  int application = 0;  // index into the schedule
  int repeat = 0;       // earlier applications of the same block in this schedule
  int64_t T = 0;        // rows (tokens) of the pass
  const int32_t* positions = nullptr;  // (T) each row's position in its sequence
  tensor::Arena* work = nullptr;       // where the application's activations live
  std::span<const int64_t> row_splits;  // see Model::Impl::linear_forward_rows
};

// Attention of one application over a.q, a.k, a.v (after QK-norm and RoPE): fills a.att (and
// a.probs in training).
using AttentionFn = std::function<void(const BlockPass& p, LayerActivations& a)>;

// Gradient buffers a backward pass reuses across applications (allocated once per pass).
struct BackwardScratch {
  float *dxn, *tmp, *dq, *dk, *dv, *dq_raw, *dk_raw, *datt, *dgate, *dup, *dh;
};

class Block {
 public:
  virtual ~Block() = default;
  virtual std::string_view kind() const = 0;
  // a.x_in given: fills the activations the backward reads and returns the output rows (T, C).
  virtual float* forward(Model::Impl& m, const BlockPass& p, LayerActivations& a,
                         const AttentionFn& attention) const = 0;
  // dx (T, C): d(output) in, d(input) out. Weight gradients are written, or added to when
  // `accumulate` (a later application of the same block already wrote them); norm-weight
  // gradients are always added to (the pass zeroes them first).
  virtual void backward(Model::Impl& m, const BlockPass& p, const LayerActivations& a,
                        const BackwardScratch& s, float* dx, bool accumulate, uint64_t step) const = 0;
  // The block's nodes in execution order (Model::describe_block).
  virtual std::vector<BlockNode> describe(const Model::Impl& m) const = 0;
  // Expert parallelism with data-parallel attention, a pass with no tokens of this rank's own
  // (Model::expert_parallel_idle_pass): an MoE block computes what other ranks send its experts.
  virtual void expert_parallel_idle(Model::Impl& m, int application) const {
    static_cast<void>(m);
    static_cast<void>(application);
  }
};

// The dense decoder layer `layer` and the Qwen3-MoE layer `layer` (their parameters:
// Model::Impl::layers[layer]; block_layer.h).
std::unique_ptr<Block> make_dense_block(int layer);
std::unique_ptr<Block> make_moe_block(int layer);

// The random-stream id of a GEMM of parameter `param` in an application that is the block's
// `repeat`-th (0: the first): `param` for the first, as the layer loop always had; then past
// the head's id (= params).
inline uint32_t gemm_stream_id(int param, int repeat, size_t params) {
  return static_cast<uint32_t>(static_cast<size_t>(param) + static_cast<size_t>(repeat) * (params + 1));
}

}  // namespace concord::model
