// Hands a concord Model to the independent fp64 reference (reference_fp64.h): its config and its
// fp32 weights, exactly, as the reference's fp64 ones. Shared by the tests that compare the two.
#pragma once

#include "concord/model/config.h"
#include "concord/model/model.h"
#include "reference_fp64.h"

namespace concord_test {

inline reference::Config reference_config(const concord::model::ModelConfig& c) {
  reference::Config r;
  r.qwen3 = c.qk_norm();
  r.qkv_bias = c.qkv_bias();
  r.output_bias = c.output_bias();
  r.vocab = c.vocab_size;
  r.hidden = c.hidden_size;
  r.intermediate = c.intermediate_size;
  r.layers = c.num_hidden_layers;
  r.heads = c.num_attention_heads;
  r.kv_heads = c.num_key_value_heads;
  r.head_dim = c.head_dim;
  r.eps = c.rms_norm_eps;
  r.theta = c.rope_theta;
  r.tied = c.tie_word_embeddings;
  if (c.recurrent()) {
    r.prelude = c.n_layers_in_prelude;
    r.core = c.n_layers_in_recurrent_block;
    r.depth = c.mean_recurrence;
  }
  return r;
}

inline reference::Weights reference_weights(const concord::model::Model& model) {
  reference::Weights w;
  for (const auto& spec : model.params()) {
    const auto v = model.param(spec.name);
    w[spec.name] = std::vector<double>(v.begin(), v.end());
  }
  return w;
}

}  // namespace concord_test
