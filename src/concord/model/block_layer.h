// The decoder-layer blocks (internal to model/): attention (input norm, q/k/v, QK-norm, RoPE,
// the pass's attention, o, residual) then post-norm and an MLP, then the residual. The attention
// half is common; a layer type supplies its MLP: the dense SwiGLU (block_dense.cpp) or the
// Qwen3-MoE router and experts (block_moe.cpp). forward() and backward() here run the common
// parts around the type's mlp_forward / mlp_backward, so both stay side by side per type.
#pragma once

#include "concord/model/block.h"

namespace concord::model {

class LayerBlock : public Block {
 public:
  float* forward(Model::Impl& m, const BlockPass& p, LayerActivations& a,
                 const AttentionFn& attention) const final;
  void backward(Model::Impl& m, const BlockPass& p, const LayerActivations& a, const BackwardScratch& s,
                float* dx, bool accumulate, uint64_t step) const final;
  std::vector<BlockNode> describe(const Model::Impl& m) const final;

 protected:
  explicit LayerBlock(int layer) : layer_(layer) {}
  // a.xn2 (T, C) given: the MLP's output (T, C) without the residual, from p.work.
  virtual float* mlp_forward(Model::Impl& m, const BlockPass& p, LayerActivations& a) const = 0;
  // dout (T, C) = d(MLP output): writes s.dxn = d(xn2) (T, C) and the MLP's weight gradients
  // (written, or added to when `accumulate`).
  virtual void mlp_backward(Model::Impl& m, const BlockPass& p, const LayerActivations& a, const BackwardScratch& s,
                            const float* dout, bool accumulate, uint64_t step) const = 0;
  virtual void describe_mlp(const Model::Impl& m, std::vector<BlockNode>& nodes) const = 0;

  const LayerParams& params(const Model::Impl& m) const { return m.layers[static_cast<size_t>(layer_)]; }
  const LayerPrecision& mlp_precision(const Model::Impl& m) const {
    return m.policy.for_layer(LayerClass::mlp, layer_, static_cast<int>(m.config.num_hidden_layers));
  }
  int layer_;

 private:
  void attention_inputs(Model::Impl& m, const BlockPass& p, LayerActivations& a) const;
  void attention_output(Model::Impl& m, const BlockPass& p, LayerActivations& a) const;
};

std::unique_ptr<Block> make_moe_block(int layer);

// The router of one token (E = num_experts logits): the softmax in double stored in fp32 (prob,
// E), the k experts of largest probability (ties to the lower expert index) in ascending id
// (selected, k) and their combine weights (weight, k; renormalised when norm_topk_prob).
void moe_route_row(const ModelConfig& c, const float* logit, float* prob, int32_t* selected, float* weight);

// HF's load-balancing loss (Qwen3MoeForCausalLM with output_router_logits, Switch Transformer
// eqs. 4-6) over every MoE application of the last training forward:
//   f_e = (top-k picks of expert e) / R,  P_e = (Σ_rows p_e) / R,  aux = E · Σ_e f_e · P_e
// with R the rows summed over the MoE applications (HF concatenates the layers' router logits).
// Its gradient through the softmax: d aux / d p_{row,e} = E · f_e / R (the picks are piecewise
// constant); `dp` receives E · f_e / R per expert. Returns 0 (and leaves dp empty) for a model
// without MoE applications.
double moe_aux_loss(const Model::Impl& m, std::vector<double>& dp);
// An application's routing (MoeActivations::selected), empty for a dense one.
std::vector<int32_t> moe_selected_of(const LayerActivations& a);

}  // namespace concord::model
