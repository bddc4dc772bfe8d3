// GGUF model files in llama.cpp's layout (llama, qwen2, qwen3): the HF <-> GGUF name map,
// llama's q/k row permutation, metadata <-> ModelConfig, tokenizer.ggml.* <-> io::Tokenizer.
#include <array>
#include <charconv>
#include <cmath>
#include <set>

#include "concord/model/files_internal.h"
#include "concord/tensor/quant_gemm.h"

namespace concord::model {
namespace {

namespace fs = std::filesystem;
using files_detail::fail;

// Rows of `cols` elements (floats, or the bytes of a row of quant blocks).
template <typename T>
std::vector<T> permute_rows(std::span<const T> w, int64_t heads, int64_t cols, bool forward) {
  const int64_t rows = cols > 0 ? static_cast<int64_t>(w.size()) / cols : 0;
  CONCORD_CHECK(heads > 0 && rows % heads == 0 && (rows / heads) % 2 == 0 &&
                    rows * cols == static_cast<int64_t>(w.size()),
                "llama q/k permutation needs (heads * even head_dim, cols) values");
  const int64_t D = rows / heads, half = D / 2;
  std::vector<T> out(w.size());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t i = 0; i < half; ++i) {
        const int64_t hf_row = h * D + j * half + i, gguf_row = h * D + 2 * i + j;
        const int64_t from = forward ? hf_row : gguf_row, to = forward ? gguf_row : hf_row;
        std::copy_n(w.begin() + from * cols, cols, out.begin() + to * cols);
      }
  return out;
}

// The shortest decimal that rounds to `f`, as a double: GGUF stores eps and theta as float32,
// and 1e-6f read back as 9.99999997e-07 would make a different model than config.json's 1e-6.
double shortest_double(double value) {
  const auto f = static_cast<float>(value);
  char buffer[64];
  const auto written = std::to_chars(buffer, buffer + sizeof(buffer), f);
  double out = 0;
  std::from_chars(buffer, written.ptr, out);
  return out;
}

std::string ggml_type_name(io::GgmlType type) {
  const auto traits = io::ggml_type_traits(static_cast<uint32_t>(type));
  return traits ? std::string(traits->name) : std::to_string(static_cast<uint32_t>(type));
}

std::string architecture_key(const std::string& arch, std::string_view key) {
  return arch + "." + std::string(key);
}

}  // namespace

std::optional<std::string> gguf_tensor_name(std::string_view hf_name) {
  const std::optional<ParamName> p = parse_hf_param_name(hf_name);
  if (!p) return std::nullopt;
  return gguf_param_name(p->kind, p->layer);
}

std::optional<std::string> hf_tensor_name(std::string_view gguf_name) {
  const std::optional<ParamName> p = parse_gguf_param_name(gguf_name);
  // llama.cpp's expert tensors hold every expert of a layer: no one HF tensor is their name.
  if (!p || param_kind_info(p->kind).per_expert) return std::nullopt;
  return hf_param_name(p->kind, p->layer);
}

std::string gguf_architecture(const ModelConfig& config) {
  if (config.architecture == "Qwen3ForCausalLM") return "qwen3";
  if (config.architecture == "Qwen2ForCausalLM") return "qwen2";
  if (config.architecture == "LlamaForCausalLM") return "llama";
  if (config.architecture == "Qwen3MoeForCausalLM") return "qwen3moe";
  if (config.recurrent())
    throw InputError("[model] a depth-recurrent model (ConcordRecurrentForCausalLM) has no llama.cpp "
                     "architecture; export it as a concord safetensors folder");
  throw InputError(fmt::format("[model] architecture '{}' has no GGUF name", config.architecture));
}

std::vector<float> llama_permute_rows(std::span<const float> w, int64_t heads, int64_t cols) {
  return permute_rows<float>(w, heads, cols, true);
}
std::vector<float> llama_unpermute_rows(std::span<const float> w, int64_t heads, int64_t cols) {
  return permute_rows<float>(w, heads, cols, false);
}

namespace files_detail {
namespace {

// The heads a llama q/k tensor is permuted over (q: Hq, k: Hkv), 0 for every other tensor.
int64_t llama_permute_heads(const ModelConfig& c, const ParamSpec& spec) {
  if (c.architecture != "LlamaForCausalLM") return 0;
  if (spec.kind == ParamKind::q || spec.kind == ParamKind::q_bias) return c.num_attention_heads;
  if (spec.kind == ParamKind::k || spec.kind == ParamKind::k_bias) return c.num_key_value_heads;
  return 0;
}

std::vector<int64_t> gguf_dims(const ParamSpec& spec) {
  return std::vector<int64_t>(spec.shape.rbegin(), spec.shape.rend());  // ne0 = innermost first
}

// The dims of the GGUF tensor a parameter lives in: its own, or for an expert llama.cpp's 3-D
// tensor of all the layer's experts, {cols, rows, experts} (expert e's rows are the e-th slab).
std::vector<int64_t> gguf_tensor_dims(const ParamSpec& spec, const ModelConfig& c) {
  std::vector<int64_t> dims = gguf_dims(spec);
  if (spec.expert >= 0) dims.push_back(c.num_experts);
  return dims;
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string s = "{";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "}";
}

int64_t positive_int(const io::GgufFile& f, const std::string& key) {
  const int64_t v = f.get_int(key);
  if (v <= 0) fail(f.path(), fmt::format("'{}' must be positive (got {})", key, v));
  return v;
}

}  // namespace

ModelSource inspect_gguf(const io::GgufFile& f) {
  ModelSource s;
  s.path = f.path();
  s.format = "gguf";
  const std::string arch = f.get_string("general.architecture");
  ModelConfig& c = s.config;
  if (arch == "qwen3") {
    c.architecture = "Qwen3ForCausalLM";
  } else if (arch == "qwen2") {
    c.architecture = "Qwen2ForCausalLM";
  } else if (arch == "llama") {
    c.architecture = "LlamaForCausalLM";
  } else if (arch == "qwen3moe") {
    c.architecture = "Qwen3MoeForCausalLM";
  } else {
    fail(f.path(), fmt::format("general.architecture '{}' is not supported (llama, qwen2, qwen3, qwen3moe)", arch));
  }
  const auto key = [&](std::string_view k) { return architecture_key(arch, k); };
  if (arch == "qwen3moe") {
    // llama.cpp's qwen3moe: every layer an MoE layer, the top-k weights always renormalised.
    c.num_experts = positive_int(f, key("expert_count"));
    c.num_experts_per_tok = positive_int(f, key("expert_used_count"));
    c.moe_intermediate_size = positive_int(f, key("expert_feed_forward_length"));
    c.norm_topk_prob = true;
    for (const char* k : {"expert_shared_count", "expert_shared_feed_forward_length"})
      if (f.find_value(key(k)) && f.get_int(key(k)) != 0)
        fail(f.path(), fmt::format("'{}' = {}: shared experts are not supported", key(k), f.get_int(key(k))));
  }
  // What concord does not implement, refused by name rather than loaded as a different model.
  for (const auto& [name, value] : f.metadata()) {
    if (arch != "qwen3moe" && name.rfind(key("expert_"), 0) == 0 &&
        !(value.size() == 1 && !value.ints.empty() && value.ints[0] == 0))
      fail(f.path(), fmt::format("'{}': mixture-of-experts models are not supported for {} (qwen3moe is)",
                                 name, arch));
    if (name == key("rope.scaling.type") && f.get_string(name) != "none")
      fail(f.path(), fmt::format("'{}' = '{}': RoPE scaling is not supported", name, f.get_string(name)));
    if ((name == key("rope.scaling.factor") || name == key("rope.scale_linear")) && f.get_float(name) != 1.0 &&
        f.get_float(name) != 0.0)
      fail(f.path(), fmt::format("'{}' = {}: RoPE scaling is not supported", name, f.get_float(name)));
  }
  c.hidden_size = positive_int(f, key("embedding_length"));
  c.num_hidden_layers = positive_int(f, key("block_count"));
  c.intermediate_size = arch == "qwen3moe" && !f.find_value(key("feed_forward_length"))
                            ? c.moe_intermediate_size  // no dense layers: any positive width
                            : positive_int(f, key("feed_forward_length"));
  c.num_attention_heads = positive_int(f, key("attention.head_count"));
  c.num_key_value_heads = f.find_value(key("attention.head_count_kv"))
                              ? positive_int(f, key("attention.head_count_kv"))
                              : c.num_attention_heads;
  c.head_dim = f.find_value(key("attention.key_length")) ? positive_int(f, key("attention.key_length"))
                                                         : c.hidden_size / c.num_attention_heads;
  if (f.find_value(key("attention.value_length")) && f.get_int(key("attention.value_length")) != c.head_dim)
    fail(f.path(), fmt::format("'{}' ({}) differs from the key length ({})", key("attention.value_length"),
                               f.get_int(key("attention.value_length")), c.head_dim));
  if (f.find_value(key("rope.dimension_count")) && f.get_int(key("rope.dimension_count")) != c.head_dim)
    fail(f.path(), fmt::format("'{}' = {}: partial RoPE (not the whole head_dim {}) is not supported",
                               key("rope.dimension_count"), f.get_int(key("rope.dimension_count")), c.head_dim));
  c.rms_norm_eps = shortest_double(f.get_float(key("attention.layer_norm_rms_epsilon")));
  c.rope_theta = f.find_value(key("rope.freq_base")) ? shortest_double(f.get_float(key("rope.freq_base")))
                                                      : 10000.0;
  c.max_position_embeddings = positive_int(f, key("context_length"));
  c.tie_word_embeddings = f.find(gguf_param_name(ParamKind::lm_head)) == nullptr;
  c.attention_bias = arch == "llama" && f.find(gguf_param_name(ParamKind::q_bias, 0)) != nullptr;

  s.tokenizer = io::tokenizer_from_gguf(f);
  if (const io::GgufTensorInfo* embed = f.find(gguf_param_name(ParamKind::embed)); embed && embed->dims.size() == 2) {
    c.vocab_size = embed->dims[1];
  } else if (s.tokenizer) {
    c.vocab_size = s.tokenizer->vocab_size();
  } else {
    fail(f.path(), "no token_embd.weight and no tokenizer: the vocabulary size is unknown");
  }
  if (f.find_value(key("vocab_size")) && f.get_int(key("vocab_size")) != c.vocab_size)
    fail(f.path(), fmt::format("'{}' = {} differs from token_embd.weight's {} rows", key("vocab_size"),
                               f.get_int(key("vocab_size")), c.vocab_size));
  if (f.find_value("tokenizer.ggml.bos_token_id")) c.bos_token_id = f.get_int("tokenizer.ggml.bos_token_id");
  if (f.find_value("tokenizer.ggml.eos_token_id")) {
    c.eos_token_id = f.get_int("tokenizer.ggml.eos_token_id");
    c.eos_token_ids = {*c.eos_token_id};
  }
  if (f.find_value("tokenizer.chat_template")) s.chat_template = f.get_string("tokenizer.chat_template");
  std::vector<int64_t> stops = c.eos_token_ids;
  for (const char* k : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
    if (f.find_value(k)) stops.push_back(f.get_int(k));
  append_unique(s.stop_token_ids, stops, f.path(), "stop token");
  c.validate(f.path());
  check_source(s);
  return s;
}

// A TQ2_0 tensor whose every code is -1 or +1 (a binary-weight model's export) as b1 blocks (each
// 32-element block with its 256-block's d): the same values, 1.5 bits per weight instead of 2 and
// the W1A8 kernels. Empty when some code is 0 or 3 (a ternary model: served dequantized) or the
// rows are not whole 256-element blocks.
std::vector<uint8_t> binary_blocks_of_tq2_0(std::span<const uint8_t> bytes, int64_t rows, int64_t cols) {
  if (cols % 256 != 0 || bytes.size() != static_cast<size_t>(rows * (cols / 256) * 66)) return {};
  const size_t blocks = bytes.size() / 66;
  std::vector<uint8_t> out(blocks * 8 * 6, 0);
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* in = bytes.data() + b * 66;
    for (int e = 0; e < 256; ++e) {
      const int q = io::tq2_0_code(in, e);
      if (q != 0 && q != 2) return {};
      uint8_t* sub = out.data() + (b * 8 + static_cast<size_t>(e / 32)) * 6;
      if (e % 32 == 0) std::memcpy(sub, in + 64, 2);
      if (q == 2) sub[2 + (e % 32) / 8] = static_cast<uint8_t>(sub[2 + (e % 32) / 8] | (1u << (e % 8)));
    }
  }
  return out;
}

StoredWeights gguf_stored_weights(const io::GgufFile& f, const ModelConfig& c, bool paged_experts) {
  StoredWeights out;
  for (const ParamSpec& spec : parameter_specs(c)) {
    if (paged_experts && spec.expert >= 0) {
      // Paged under a memory cap (expert_pager.h): the type and shape now, the blocks when routed to.
      const io::GgufTensorInfo* t = f.find(gguf_param_name(spec.kind, spec.layer));
      if (t == nullptr || t->dims != gguf_tensor_dims(spec, c)) continue;  // read_gguf_weights reports it
      const tensor::BlockQuantTraits* block = tensor::block_quant_of_ggml(static_cast<uint32_t>(t->type));
      if (block == nullptr)
        fail(f.path(), fmt::format("a memory cap pages experts stored as Q4_0, Q4_1 or Q8_0 blocks; tensor '{}' is {} "
                                   "(export the model with --dtype q4_0, q4_1 or q8_0, or run it without a cap)",
                                   t->name, ggml_type_name(t->type)));
      out.emplace(spec.name, std::make_shared<const tensor::QuantWeight>(
                                 tensor::QuantWeight::unloaded(block->type, spec.shape[0], spec.shape[1])));
      continue;
    }
    if (!spec.is_matrix() || spec.kind == ParamKind::router) continue;  // routers: fp32 values
    const io::GgufTensorInfo* t = f.find(gguf_param_name(spec.kind, spec.layer));
    if (t == nullptr || t->dims != gguf_tensor_dims(spec, c)) continue;  // read_gguf_weights reports it
    const tensor::BlockQuantTraits* block = tensor::block_quant_of_ggml(static_cast<uint32_t>(t->type));
    const int64_t rows = spec.shape[0], cols = spec.shape[1];
    std::vector<uint8_t> binary;
    if (t->type == io::GgmlType::tq2_0) {
      binary = binary_blocks_of_tq2_0(t->bytes, rows, cols);
      if (binary.empty()) continue;  // a ternary tensor (zero codes): dequantized to fp32
      block = &tensor::block_quant_traits(tensor::BlockQuant::b1);
    }
    if (block == nullptr) continue;  // other types are dequantized to fp32
    const tensor::BlockQuant kind = block->type;
    std::span<const uint8_t> bytes = binary.empty() ? t->bytes : std::span<const uint8_t>(binary);
    if (spec.expert >= 0) {  // this expert's slab of the layer's 3-D tensor
      const size_t slab = bytes.size() / static_cast<size_t>(c.num_experts);
      bytes = bytes.subspan(static_cast<size_t>(spec.expert) * slab, slab);
    }
    std::vector<uint8_t> permuted;
    if (const int64_t heads = llama_permute_heads(c, spec); heads > 0) {
      // llama.cpp's q/k row order, undone on whole rows of blocks.
      permuted = permute_rows(bytes, heads, static_cast<int64_t>(bytes.size()) / rows, false);
      bytes = permuted;
    }
    out.emplace(spec.name, std::make_shared<const tensor::QuantWeight>(
                               tensor::pack_quant_weight(kind, rows, cols, bytes)));
    if (spec.expert < 0 || spec.expert + 1 == c.num_experts)
      f.release_pages(t->bytes);  // the packed copy is the one kept in memory
  }
  return out;
}

void read_gguf_weights(const io::GgufFile& f, Model& model) {
  const ModelConfig& c = model.config();
  std::set<std::string> used;
  std::vector<float> experts;  // the 3-D expert tensor being read, converted once for its experts
  std::string experts_name;
  for (const ParamSpec& spec : model.params()) {
    const std::string name = gguf_param_name(spec.kind, spec.layer);
    const io::GgufTensorInfo* t = f.find(name);
    if (t == nullptr)
      fail(f.path(), fmt::format("tensor '{}' ({}) is missing", name, spec.name));
    if (t->dims != gguf_tensor_dims(spec, c))
      fail(f.path(), fmt::format("tensor '{}' has dims {}; the metadata implies {}", name,
                                 dims_text(t->dims), dims_text(gguf_tensor_dims(spec, c))));
    if (!io::gguf_type_converts_to_floats(t->type))
      fail(f.path(), fmt::format("tensor '{}' has type {}; concord loads {}", name,
                                 ggml_type_name(t->type), io::gguf_float_type_list()));
    if (model.stored_weight(spec.name) != nullptr) {  // kept in its blocks (gguf_stored_weights)
      used.insert(name);
      continue;
    }
    if (spec.expert >= 0) {
      if (experts_name != name) {
        experts = io::gguf_tensor_to_floats(*t);
        experts_name = name;
      }
      const auto slab = static_cast<size_t>(spec.numel());
      const auto first = experts.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(spec.expert) * slab);
      std::copy(first, first + static_cast<std::ptrdiff_t>(slab), model.param(spec.name).begin());
      if (spec.expert + 1 == c.num_experts) f.release_pages(t->bytes);
      used.insert(name);
      continue;
    }
    std::vector<float> values = io::gguf_tensor_to_floats(*t);
    f.release_pages(t->bytes);
    if (const int64_t heads = llama_permute_heads(c, spec); heads > 0)
      values = llama_unpermute_rows(values, heads, spec.is_matrix() ? spec.shape[1] : 1);
    std::copy(values.begin(), values.end(), model.param(spec.name).begin());
    used.insert(name);
  }
  for (const io::GgufTensorInfo& t : f.tensors())
    if (!used.count(t.name))
      fail(f.path(), fmt::format("unknown tensor '{}': not part of this {} model", t.name,
                                 gguf_architecture(c)));
  model.weights_changed();
}

void write_gguf_file(const Model& model, const fs::path& out, const ExportOptions& options) {
  const ModelConfig& c = model.config();
  const std::string arch = gguf_architecture(c);
  if (c.architecture == "Qwen3ForCausalLM" && c.attention_bias)
    fail(out, "llama.cpp's qwen3 has no attention biases");
  if (!c.identity_schedule())
    fail(out, "the model applies its blocks in a schedule (concord_schedule), which llama.cpp cannot "
              "run; export it as a concord safetensors folder");
  if (c.moe()) {
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      if (!c.is_moe_layer(i))
        fail(out, fmt::format("layer {} is dense (mlp_only_layers / decoder_sparse_step), and llama.cpp's "
                              "qwen3moe makes every layer an MoE layer; export it as safetensors", i));
    if (!c.norm_topk_prob)
      fail(out, "norm_topk_prob is false, and llama.cpp's qwen3moe always renormalises the top-k "
                "weights; export it as safetensors");
  }
  // llama.cpp's file types: ALL_F32 0, MOSTLY_F16 1, MOSTLY_Q4_0 2, MOSTLY_Q4_1 3, MOSTLY_Q8_0 7,
  // MOSTLY_BF16 32, MOSTLY_MXFP4_MOE 38.
  io::GgmlType matrix_type = io::GgmlType::f32;
  uint32_t file_type = 0;
  if (options.dtype == "f16") {
    matrix_type = io::GgmlType::f16;
    file_type = 1;
  } else if (options.dtype == "bf16") {
    matrix_type = io::GgmlType::bf16;
    file_type = 32;
  } else if (options.dtype == "q4_0") {
    matrix_type = io::GgmlType::q4_0;
    file_type = 2;
  } else if (options.dtype == "q4_1") {
    matrix_type = io::GgmlType::q4_1;
    file_type = 3;
  } else if (options.dtype == "q8_0") {
    matrix_type = io::GgmlType::q8_0;
    file_type = 7;
  } else if (options.dtype == "mxfp4") {
    matrix_type = io::GgmlType::mxfp4;
    file_type = 38;
  } else if (options.dtype == "tq2_0") {
    // A binary-weight model (concord_binary_weights): its +-alpha weights as llama.cpp's ternary
    // TQ2_0 (codes -1/+1 only, d = fp16(alpha)); the embedding / head Q8_0, the rest f32.
    if (c.binary_weights.empty())
      fail(out, "GGUF export dtype 'tq2_0' holds a binary-weight model's +-alpha weights, and this model has none "
                "(config.json's concord_binary_weights is not set: train it with a binary optimizer, docs/binary.md)");
    matrix_type = io::GgmlType::tq2_0;
    file_type = 37;  // LLAMA_FTYPE_MOSTLY_TQ2_0
  } else if (options.dtype != "f32") {
    fail(out, fmt::format("GGUF export dtype '{}' is not supported (f32, f16, bf16, q4_0, q4_1, q8_0, mxfp4, tq2_0)",
                          options.dtype));
  }
  std::optional<io::Tokenizer> tokenizer = options.tokenizer;
  if (!tokenizer && c.vocab_size == kByteVocabulary) tokenizer = io::Tokenizer::byte_level(byte_special_tokens());
  if (!tokenizer) fail(out, "a GGUF export needs a tokenizer (llama.cpp cannot load a model without one)");

  const auto u32 = [](int64_t v) { return io::GgufValue::of_uint32(static_cast<uint32_t>(v)); };
  const auto key = [&](std::string_view k) { return architecture_key(arch, k); };
  io::GgufMetadata meta;
  meta.emplace_back("general.architecture", io::GgufValue::of_string(arch));
  meta.emplace_back("general.name", io::GgufValue::of_string("concord " + c.architecture));
  meta.emplace_back("general.file_type", io::GgufValue::of_uint32(file_type));
  meta.emplace_back("general.quantization_version", io::GgufValue::of_uint32(2));
  meta.emplace_back(key("vocab_size"), u32(c.vocab_size));
  meta.emplace_back(key("context_length"), u32(c.max_position_embeddings));
  meta.emplace_back(key("embedding_length"), u32(c.hidden_size));
  meta.emplace_back(key("block_count"), u32(c.num_hidden_layers));
  meta.emplace_back(key("feed_forward_length"), u32(c.intermediate_size));
  meta.emplace_back(key("attention.head_count"), u32(c.num_attention_heads));
  meta.emplace_back(key("attention.head_count_kv"), u32(c.num_key_value_heads));
  meta.emplace_back(key("attention.key_length"), u32(c.head_dim));
  meta.emplace_back(key("attention.value_length"), u32(c.head_dim));
  meta.emplace_back(key("attention.layer_norm_rms_epsilon"),
                    io::GgufValue::of_float32(static_cast<float>(c.rms_norm_eps)));
  meta.emplace_back(key("rope.dimension_count"), u32(c.head_dim));
  meta.emplace_back(key("rope.freq_base"), io::GgufValue::of_float32(static_cast<float>(c.rope_theta)));
  if (c.moe()) {
    meta.emplace_back(key("expert_count"), u32(c.num_experts));
    meta.emplace_back(key("expert_used_count"), u32(c.num_experts_per_tok));
    meta.emplace_back(key("expert_feed_forward_length"), u32(c.moe_intermediate_size));
  }

  // The vocabulary, padded to the model's as convert_hf_to_gguf.py does ("[PAD{i}]", UNUSED).
  io::BpeVocabulary v = tokenizer->vocabulary();
  if (v.token_types.size() != v.tokens.size()) v.token_types.assign(v.tokens.size(), 1);
  for (auto i = static_cast<int64_t>(v.tokens.size()); i < c.vocab_size; ++i) {
    v.tokens.push_back(fmt::format("[PAD{}]", i));
    v.token_types.push_back(5);
  }
  meta.emplace_back("tokenizer.ggml.model", io::GgufValue::of_string("gpt2"));
  meta.emplace_back("tokenizer.ggml.pre", io::GgufValue::of_string(v.pre));
  meta.emplace_back("tokenizer.ggml.tokens", io::GgufValue::of_strings(v.tokens));
  meta.emplace_back("tokenizer.ggml.token_type",
                    io::GgufValue::of_ints(io::GgufType::int32,
                                           std::vector<int64_t>(v.token_types.begin(), v.token_types.end())));
  meta.emplace_back("tokenizer.ggml.merges", io::GgufValue::of_strings(v.merges));
  std::vector<int64_t> eos(options.stop_token_ids.begin(), options.stop_token_ids.end());
  if (eos.empty()) eos = c.eos_token_ids;
  if (c.bos_token_id) meta.emplace_back("tokenizer.ggml.bos_token_id", u32(*c.bos_token_id));
  if (!eos.empty()) meta.emplace_back("tokenizer.ggml.eos_token_id", u32(eos[0]));
  if (const auto pad = tokenizer->token_id("<|pad|>")) {
    meta.emplace_back("tokenizer.ggml.padding_token_id", u32(*pad));
  } else if (!eos.empty()) {
    meta.emplace_back("tokenizer.ggml.padding_token_id", u32(eos[0]));
  }
  // The tokenizer's own add_bos / add_eos (a GGUF's; false for a tokenizer.json, which has none).
  meta.emplace_back("tokenizer.ggml.add_bos_token", io::GgufValue::of_bool(v.add_bos.value_or(false)));
  if (v.add_eos) meta.emplace_back("tokenizer.ggml.add_eos_token", io::GgufValue::of_bool(true));
  if (!options.chat_template.empty())
    meta.emplace_back("tokenizer.chat_template", io::GgufValue::of_string(options.chat_template));

  std::vector<std::vector<uint8_t>> buffers;
  buffers.reserve(model.params().size());
  std::vector<io::GgufTensorToWrite> tensors;
  for (const ParamSpec& spec : model.params()) {
    if (spec.expert > 0) continue;  // written with expert 0, in the layer's 3-D tensor
    const std::string name = gguf_param_name(spec.kind, spec.layer);
    const auto values = model.param(spec.name);
    std::vector<float> permuted;
    std::span<const float> data = values;
    if (spec.expert == 0) {  // every expert's rows, expert after expert: dims {cols, rows, E}
      for (int e = 0; e < static_cast<int>(c.num_experts); ++e) {
        const auto part = model.param(model.params()[static_cast<size_t>(require_param(model.params(), spec.kind, spec.layer, e))].name);
        permuted.insert(permuted.end(), part.begin(), part.end());
      }
      data = permuted;
    }
    if (const int64_t heads = llama_permute_heads(c, spec); heads > 0) {
      permuted = llama_permute_rows(values, heads, spec.is_matrix() ? spec.shape[1] : 1);
      data = permuted;
    }
    // 1-D tensors (norms, biases) stay f32, as llama.cpp's converter keeps them; so do MoE
    // routers (llama-quantize leaves ffn_gate_inp alone; concord runs them in fp32).
    io::GgmlType type = spec.is_matrix() && spec.kind != ParamKind::router ? matrix_type : io::GgmlType::f32;
    if (type == io::GgmlType::tq2_0) {
      if (!is_binary_weight(spec, c.binary_weights)) {
        // The embedding / head as Q8_0 (as llama-quantize keeps a TQ model's embeddings in a
        // wider type, and as concord serves a binary folder natively), anything else f32.
        type = (spec.kind == ParamKind::embed || spec.kind == ParamKind::lm_head) && spec.shape.back() % 32 == 0
                   ? io::GgmlType::q8_0
                   : io::GgmlType::f32;
      } else {
        try {  // every row +-alpha: TQ2_0 then holds it exactly (up to alpha's fp16 rounding)
          (void)tensor::binary_blocks(values, spec.shape[0], spec.shape[1]);
        } catch (const InputError& e) {
          fail(out, fmt::format("tensor '{}' is not binary: {}", spec.name, e.what()));
        }
      }
    }
    const int64_t block = io::ggml_type_traits(static_cast<uint32_t>(type))->block_size;
    if (spec.shape.back() % block != 0)
      fail(out, fmt::format("tensor '{}' rows hold {} values, not a multiple of {}'s block of {} "
                            "(export as f32, f16 or bf16)", spec.name, spec.shape.back(),
                            options.dtype, block));
    buffers.push_back(io::encode_gguf_tensor(type, data));
    tensors.push_back({name, gguf_tensor_dims(spec, c), type, buffers.back()});
  }
  std::error_code ec;
  if (out.has_parent_path()) fs::create_directories(out.parent_path(), ec);
  io::write_gguf(out, meta, tensors);
}

}  // namespace files_detail
}  // namespace concord::model
