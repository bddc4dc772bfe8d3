// Hugging Face model folders: config.json, model.safetensors or a sharded
// model.safetensors.index.json, tokenizer.json, tokenizer_config.json, generation_config.json.
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "concord/io/atomic_file.h"
#include "concord/io/safetensors.h"
#include "concord/model/files_internal.h"
#include "concord/numerics/convert.h"

namespace concord::model::files_detail {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Parses a JSON file, rejecting duplicate keys (nlohmann would keep the last one silently: in a
// weight map that would hide a tensor named twice).
json read_json(const fs::path& path) {
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  const json::parser_callback_t check = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    if (event == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == json::parse_event_t::key && !keys.empty() &&
        !keys.back().insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  json j = json::parse(read_text(path), check, false);
  if (j.is_discarded()) fail(path, "not valid JSON");
  if (!duplicate.empty()) fail(path, fmt::format("key '{}' appears twice", duplicate));
  return j;
}

// An eos_token_id field: an integer or a list of integers (Llama 3, Qwen2.5 generation configs).
std::vector<int64_t> token_ids(const json& j, const char* key, const fs::path& source) {
  if (!j.contains(key) || j.at(key).is_null()) return {};
  const json& v = j.at(key);
  if (v.is_number_integer()) return {v.get<int64_t>()};
  std::vector<int64_t> ids;
  if (v.is_array())
    for (const json& id : v) {
      if (!id.is_number_integer()) fail(source, fmt::format("'{}' must be an integer or a list of integers", key));
      ids.push_back(id.get<int64_t>());
    }
  else
    fail(source, fmt::format("'{}' must be an integer or a list of integers", key));
  return ids;
}

// tokenizer_config.json's special token: "<|im_end|>" or {"content": "<|im_end|>", ...}.
std::optional<std::string> special_token_text(const json& j, const char* key) {
  if (!j.contains(key)) return std::nullopt;
  const json& v = j.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string())
    return v.at("content").get<std::string>();
  return std::nullopt;
}

// tokenizer_config.json's chat_template: a string, or a list of {name, template} (the "default").
std::string chat_template_of(const json& j, const fs::path& source) {
  if (!j.contains("chat_template") || j.at("chat_template").is_null()) return "";
  const json& t = j.at("chat_template");
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    for (const json& entry : t)
      if (entry.is_object() && entry.contains("name") && entry.at("name") == "default" &&
          entry.contains("template") && entry.at("template").is_string())
        return entry.at("template").get<std::string>();
    fail(source, "chat_template is a list without a 'default' entry");
  }
  fail(source, "chat_template must be a string or a list of {name, template}");
}

// Every tensor of the folder's weight files, by name, with the file it came from.
struct FolderTensors {
  std::vector<io::SafetensorsFile> files;
  std::map<std::string, std::pair<const io::TensorInfo*, fs::path>> tensors;
};

FolderTensors open_weights(const fs::path& dir) {
  FolderTensors out;
  const fs::path single = dir / "model.safetensors";
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (fs::exists(single)) {  // HF prefers the single file when both are present
    out.files.push_back(io::SafetensorsFile::open(single));
    for (const io::TensorInfo& t : out.files.back().tensors()) out.tensors[t.name] = {&t, single};
    return out;
  }
  if (!fs::exists(index_path))
    fail(dir, "no model.safetensors and no model.safetensors.index.json");
  const json index = read_json(index_path);
  if (!index.is_object() || !index.contains("weight_map") || !index.at("weight_map").is_object())
    fail(index_path, "expected an object with a 'weight_map' object");
  // Shards in the order they are first named; every weight-map entry must be in its shard.
  std::map<std::string, std::string> weight_map;
  std::vector<std::string> shards;
  for (const auto& [name, file] : index.at("weight_map").items()) {
    if (!file.is_string()) fail(index_path, fmt::format("weight_map['{}'] must be a file name", name));
    const std::string shard = file.get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard.find('\\') != std::string::npos ||
        shard == "." || shard == "..")
      fail(index_path, fmt::format("weight_map['{}'] = '{}' is not a file name in the folder", name, shard));
    weight_map[name] = shard;
    if (std::find(shards.begin(), shards.end(), shard) == shards.end()) shards.push_back(shard);
  }
  for (const std::string& shard : shards)
    if (!fs::is_regular_file(dir / shard))
      fail(index_path, fmt::format("shard '{}' does not exist", shard));
  out.files.reserve(shards.size());
  for (const std::string& shard : shards) {
    const fs::path shard_path = dir / shard;
    out.files.push_back(io::SafetensorsFile::open(shard_path));
    for (const io::TensorInfo& t : out.files.back().tensors()) {
      const auto it = weight_map.find(t.name);
      if (it == weight_map.end())
        fail(shard_path, fmt::format("tensor '{}' is not in the weight map of {}", t.name,
                                     index_path.filename().string()));
      if (it->second != shard)
        fail(shard_path, fmt::format("tensor '{}' belongs to shard '{}' by the weight map", t.name,
                                     it->second));
      out.tensors[t.name] = {&t, shard_path};
    }
  }
  for (const auto& [name, shard] : weight_map)
    if (!out.tensors.count(name))
      fail(dir / shard, fmt::format("tensor '{}' named by the weight map is not in this shard", name));
  return out;
}

std::vector<float> tensor_values(const io::TensorInfo& t, const ParamSpec& spec, const fs::path& file) {
  if (t.dtype != io::Dtype::F32 && t.dtype != io::Dtype::F16 && t.dtype != io::Dtype::BF16)
    fail(file, fmt::format("tensor '{}' has dtype {}; model weights must be F32, F16 or BF16",
                           t.name, io::dtype_name(t.dtype)));
  if (t.shape != spec.shape)
    fail(file, fmt::format("tensor '{}' has shape {}; the config implies {}", t.name,
                           io::shape_text(t.shape), io::shape_text(spec.shape)));
  return io::tensor_to_floats(t);
}

// fp32 -> safetensors dtype bytes: F32 as is, BF16/F16 rounded to nearest even; a finite value
// that overflows F16 is an error rather than an Inf in the file.
std::vector<uint8_t> encode_values(std::span<const float> v, io::Dtype dtype, const std::string& name,
                                   const fs::path& out) {
  std::vector<uint8_t> bytes;
  if (dtype == io::Dtype::F32) {
    bytes.resize(v.size() * sizeof(float));
    if (!v.empty()) std::memcpy(bytes.data(), v.data(), bytes.size());
    return bytes;
  }
  const auto format = dtype == io::Dtype::BF16 ? numerics::Format::bf16 : numerics::Format::fp16;
  bytes.resize(v.size() * 2);
  numerics::encode_array(format, numerics::Rounding::rne, numerics::Overflow::ieee, v.data(),
                         bytes.data(), v.size());
  std::vector<float> back(v.size());
  numerics::decode_array(format, bytes.data(), back.data(), v.size());
  for (size_t i = 0; i < v.size(); ++i)
    if (std::isfinite(v[i]) && !std::isfinite(back[i]))
      fail(out, fmt::format("tensor '{}' holds {} which overflows {} (export as f32 or bf16)", name,
                            v[i], io::dtype_name(dtype)));
  return bytes;
}

}  // namespace

ModelSource inspect_hf_folder(const fs::path& dir) {
  ModelSource s;
  s.path = dir;
  s.format = "safetensors";
  const fs::path config_path = dir / "config.json";
  if (!fs::exists(config_path)) fail(dir, "no config.json (not a Hugging Face model folder)");
  s.config = ModelConfig::load(config_path);
  if (fs::exists(dir / "tokenizer.json")) {
    s.tokenizer = io::Tokenizer::load(dir / "tokenizer.json");
  } else if (s.config.vocab_size == kByteVocabulary) {
    s.tokenizer = io::Tokenizer::byte_level(byte_special_tokens());
  }
  std::vector<int64_t> generation_eos, tokenizer_eos;
  if (fs::exists(dir / "generation_config.json")) {
    const fs::path path = dir / "generation_config.json";
    const json g = read_json(path);
    if (!g.is_object()) fail(path, "expected a JSON object");
    generation_eos = token_ids(g, "eos_token_id", path);
  }
  if (fs::exists(dir / "tokenizer_config.json")) {
    const fs::path path = dir / "tokenizer_config.json";
    const json t = read_json(path);
    if (!t.is_object()) fail(path, "expected a JSON object");
    s.chat_template = chat_template_of(t, path);
    if (const auto eos = special_token_text(t, "eos_token"); eos && s.tokenizer)
      if (const auto id = s.tokenizer->token_id(*eos)) tokenizer_eos.push_back(*id);
  }
  // HF's generate stops at generation_config's ids; config.json's and the tokenizer's eos follow.
  append_unique(s.stop_token_ids, generation_eos, dir / "generation_config.json", "eos_token_id");
  append_unique(s.stop_token_ids, s.config.eos_token_ids, config_path, "eos_token_id");
  append_unique(s.stop_token_ids, tokenizer_eos, dir / "tokenizer_config.json", "eos_token");
  check_source(s);
  return s;
}

void read_hf_weights(const fs::path& dir, Model& model) {
  const FolderTensors weights = open_weights(dir);
  const ModelConfig& c = model.config();
  std::set<std::string> used;
  for (const ParamSpec& spec : model.params()) {
    const auto it = weights.tensors.find(spec.name);
    if (it == weights.tensors.end())
      fail(dir, fmt::format("tensor '{}' is missing ({} with {} layers needs it)", spec.name,
                            c.architecture, c.num_hidden_layers));
    const auto& [tensor, file] = it->second;
    const std::vector<float> values = tensor_values(*tensor, spec, file);
    std::copy(values.begin(), values.end(), model.param(spec.name).begin());
    used.insert(spec.name);
  }
  for (const auto& [name, entry] : weights.tensors) {
    if (used.count(name) || is_ignored_hf_tensor(name)) continue;
    const auto& [tensor, file] = entry;
    if (parse_hf_param_name(name) == ParamName{ParamKind::lm_head, -1} && c.tie_word_embeddings) {
      // Some tied checkpoints store the head anyway; it must be the embedding table.
      const ParamSpec head{name, {c.vocab_size, c.hidden_size}, ParamKind::lm_head, -1};
      const std::vector<float> values = tensor_values(*tensor, head, file);
      const auto embed = model.param(model.params()[static_cast<size_t>(require_param(model.params(), ParamKind::embed))].name);
      if (std::memcmp(values.data(), embed.data(), values.size() * sizeof(float)) != 0)
        fail(file, "lm_head.weight differs from model.embed_tokens.weight, but config.json ties "
                   "them (set tie_word_embeddings to false)");
      continue;
    }
    fail(file, fmt::format("unknown tensor '{}': not a parameter of this {} config (concord "
                           "ignores only rotary_emb.inv_freq)", name, c.architecture));
  }
  model.weights_changed();
}

void write_hf_folder(const Model& model, const fs::path& out, const ExportOptions& options) {
  io::Dtype dtype = io::Dtype::F32;
  std::string torch_dtype = "float32";
  if (options.dtype == "bf16") {
    dtype = io::Dtype::BF16;
    torch_dtype = "bfloat16";
  } else if (options.dtype == "f16") {
    dtype = io::Dtype::F16;
    torch_dtype = "float16";
  } else if (options.dtype != "f32") {
    fail(out, fmt::format("safetensors export dtype '{}' is not supported (f32, bf16, f16)", options.dtype));
  }
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_directory(out, ec)) fail(out, "exists and is not a folder");
  fs::create_directories(out, ec);
  if (ec) fail(out, fmt::format("cannot create the folder: {}", ec.message()));

  const ModelConfig& c = model.config();
  std::vector<std::vector<uint8_t>> buffers;
  buffers.reserve(model.params().size());
  std::vector<io::TensorToWrite> tensors;
  for (const ParamSpec& spec : model.params()) {
    buffers.push_back(encode_values(model.param(spec.name), dtype, spec.name, out));
    tensors.push_back({spec.name, dtype, spec.shape, buffers.back()});
  }
  std::map<std::string, std::string> metadata = options.metadata;
  metadata["format"] = "pt";
  io::write_safetensors(out / "model.safetensors", std::move(tensors), metadata);

  json config = c.to_json();
  config["torch_dtype"] = torch_dtype;
  io::write_file_atomic(out / "config.json", config.dump(2) + "\n");

  std::vector<int64_t> eos(options.stop_token_ids.begin(), options.stop_token_ids.end());
  if (eos.empty()) eos = c.eos_token_ids;
  json generation = json::object();
  if (c.bos_token_id) generation["bos_token_id"] = *c.bos_token_id;
  if (eos.size() == 1) generation["eos_token_id"] = eos[0];
  if (eos.size() > 1) generation["eos_token_id"] = eos;
  io::write_file_atomic(out / "generation_config.json", generation.dump(2) + "\n");

  if (!options.tokenizer) return;
  const io::Tokenizer& tokenizer = *options.tokenizer;
  io::write_file_atomic(out / "tokenizer.json", tokenizer.to_json());
  const io::BpeVocabulary vocabulary = tokenizer.vocabulary();
  auto token_text = [&](std::optional<int64_t> id) -> std::optional<std::string> {
    if (!id || *id < 0 || *id >= static_cast<int64_t>(vocabulary.tokens.size())) return std::nullopt;
    return vocabulary.tokens[static_cast<size_t>(*id)];
  };
  json tokenizer_config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                           {"model_max_length", c.max_position_embeddings},
                           {"clean_up_tokenization_spaces", false}};
  if (const auto bos = token_text(c.bos_token_id)) tokenizer_config["bos_token"] = *bos;
  if (const auto e = token_text(eos.empty() ? std::nullopt : std::optional<int64_t>(eos[0])))
    tokenizer_config["eos_token"] = *e;
  if (const auto pad = tokenizer.token_id("<|pad|>")) tokenizer_config["pad_token"] = "<|pad|>";
  if (!options.chat_template.empty()) tokenizer_config["chat_template"] = options.chat_template;
  io::write_file_atomic(out / "tokenizer_config.json", tokenizer_config.dump(2) + "\n");
}

}  // namespace concord::model::files_detail
