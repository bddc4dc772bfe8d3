// The tokenizer's three sources and two outputs: tokenizer.json (read strictly, written in the
// Qwen2 shape), GGUF's BpeVocabulary, and the training byte tokenizer.
#include <fstream>
#include <set>
#include <unordered_map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/io/tokenizer_impl.h"
#include "concord/numerics/check.h"

namespace concord::io {

using namespace tokenizer_detail;
using json = nlohmann::json;

namespace {

[[noreturn]] void fail(const std::string& label, const std::string& problem) {
  throw InputError(fmt::format("[tokenizer] {}: {}", label, problem));
}

std::string type_of(const json& component) {
  if (!component.is_object() || !component.contains("type") || !component["type"].is_string()) {
    return "(no type)";
  }
  return component["type"].get<std::string>();
}

// A flag that may be absent (then `fallback`), else must be a boolean.
bool flag(const std::string& label, const json& object, const char* key, bool fallback,
          const std::string& where) {
  if (!object.contains(key) || object[key].is_null()) return fallback;
  if (!object[key].is_boolean()) fail(label, fmt::format("{}.{} must be true or false", where, key));
  return object[key].get<bool>();
}

// null or "": HF's way of saying "none" for BPE's prefix/suffix options.
bool null_or_empty(const json& object, const char* key) {
  return !object.contains(key) || object[key].is_null() ||
         (object[key].is_string() && object[key].get<std::string>().empty());
}

void read_normalizer(const std::string& label, const json& n, Tokenizer::Impl& t) {
  if (n.is_null()) return;
  const std::string type = type_of(n);
  if (type == "NFC") {
    t.nfc = true;
    return;
  }
  if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
    for (const json& inner : n["normalizers"]) {
      if (type_of(inner) != "NFC") {
        fail(label, fmt::format("normalizer {} inside a Sequence is not supported (concord "
                                "implements none, NFC, or a Sequence of NFC)",
                                type_of(inner)));
      }
      t.nfc = true;
    }
    return;
  }
  fail(label, fmt::format("normalizer {} is not supported (concord implements none, NFC, or a "
                          "Sequence of NFC)",
                          type));
}

void read_byte_level(const std::string& label, const json& b, bool in_sequence,
                     Tokenizer::Impl& t) {
  if (flag(label, b, "add_prefix_space", true, "pre_tokenizer ByteLevel")) {
    fail(label, "pre_tokenizer ByteLevel with add_prefix_space true is not supported");
  }
  const bool use_regex = flag(label, b, "use_regex", true, "pre_tokenizer ByteLevel");
  if (use_regex && in_sequence) {
    fail(label, "pre_tokenizer ByteLevel after a Split must have use_regex false");
  }
  if (use_regex) t.split = SplitPattern::kGpt2;
}

void read_split(const std::string& label, const json& s, Tokenizer::Impl& t) {
  const json& pattern = s.value("pattern", json());
  if (!pattern.is_object() || !pattern.contains("Regex") || !pattern["Regex"].is_string()) {
    fail(label, "pre_tokenizer Split must have a pattern {\"Regex\": ...}");
  }
  const std::string regex = pattern["Regex"].get<std::string>();
  if (!split_pattern_from_regex(regex, t.split)) {
    fail(label, fmt::format("pre_tokenizer Split regex '{}' is not one concord implements (the "
                            "GPT-2, Qwen2 and Llama-3 patterns)",
                            regex.substr(0, 60)));
  }
  if (s.value("behavior", json()) != "Isolated") {
    fail(label, fmt::format("pre_tokenizer Split behavior {} is not supported (only Isolated)",
                            s.value("behavior", json()).dump()));
  }
  if (flag(label, s, "invert", false, "pre_tokenizer Split")) {
    fail(label, "pre_tokenizer Split with invert true is not supported");
  }
}

void read_pre_tokenizer(const std::string& label, const json& p, Tokenizer::Impl& t) {
  const std::string type = type_of(p);
  if (type == "ByteLevel") {
    read_byte_level(label, p, false, t);
    return;
  }
  if (type == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array()) {
    const json& list = p["pretokenizers"];
    if (list.size() == 2 && type_of(list[0]) == "Split" && type_of(list[1]) == "ByteLevel") {
      read_split(label, list[0], t);
      read_byte_level(label, list[1], true, t);
      return;
    }
    if (list.size() == 2 && type_of(list[0]) == "Digits" && type_of(list[1]) == "ByteLevel") {
      // SmolLM / StarCoder: each digit alone, then ByteLevel's own GPT-2 regex.
      if (!flag(label, list[0], "individual_digits", false, "pre_tokenizer Digits")) {
        fail(label, "pre_tokenizer Digits with individual_digits false is not supported");
      }
      read_byte_level(label, list[1], false, t);
      if (t.split != SplitPattern::kGpt2) {
        fail(label, "pre_tokenizer Sequence[Digits, ByteLevel] needs ByteLevel use_regex true");
      }
      t.split = SplitPattern::kDigitsGpt2;
      return;
    }
    std::string types;
    for (const json& inner : list) types += (types.empty() ? "" : ", ") + type_of(inner);
    fail(label, fmt::format("pre_tokenizer Sequence[{}] is not supported (concord implements "
                            "ByteLevel, Sequence[Split, ByteLevel] or Sequence[Digits, ByteLevel])",
                            types));
  }
  fail(label, fmt::format("pre_tokenizer {} is not supported (concord implements ByteLevel, "
                          "Sequence[Split, ByteLevel] or Sequence[Digits, ByteLevel])",
                          p.is_null() ? "null" : type));
}

void read_model(const std::string& label, const json& m, Tokenizer::Impl& t) {
  if (type_of(m) != "BPE") {
    fail(label, fmt::format("model {} is not supported (concord implements byte-level BPE)",
                            type_of(m)));
  }
  if (m.contains("dropout") && !m["dropout"].is_null()) {
    fail(label, "model BPE with dropout is not supported (encoding would be random)");
  }
  if (flag(label, m, "byte_fallback", false, "model")) {
    fail(label, "model BPE with byte_fallback true is not supported");
  }
  if (!null_or_empty(m, "continuing_subword_prefix") || !null_or_empty(m, "end_of_word_suffix")) {
    fail(label, "model BPE with continuing_subword_prefix or end_of_word_suffix is not supported");
  }
  t.ignore_merges = flag(label, m, "ignore_merges", false, "model");

  const json& vocab = m.value("vocab", json());
  if (!vocab.is_object()) fail(label, "model.vocab must be an object {token: id}");
  const size_t n = vocab.size();
  t.tokens.assign(n, std::string());
  std::vector<bool> seen(n, false);
  t.model_ids.reserve(n);
  for (const auto& [token, id_json] : vocab.items()) {
    if (!id_json.is_number_integer()) {
      fail(label, fmt::format("model.vocab['{}'] is not an integer id", token));
    }
    const auto id = id_json.get<int64_t>();
    if (id < 0) fail(label, fmt::format("model.vocab['{}'] has negative id {}", token, id));
    if (static_cast<size_t>(id) >= n) {
      fail(label, fmt::format("model.vocab ids leave holes: '{}' has id {} in a vocabulary of {} "
                              "tokens (ids must be 0..{})",
                              token, id, n, n - 1));
    }
    if (seen[static_cast<size_t>(id)]) {
      fail(label, fmt::format("model.vocab id {} is used twice ('{}' and '{}')", id,
                              t.tokens[static_cast<size_t>(id)], token));
    }
    seen[static_cast<size_t>(id)] = true;
    t.tokens[static_cast<size_t>(id)] = token;
    t.model_ids.emplace(token, static_cast<int32_t>(id));
  }
  t.model_vocab_size = static_cast<int32_t>(n);

  const json& merges = m.value("merges", json());
  if (!merges.is_array()) fail(label, "model.merges must be an array");
  t.merges.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& merge = merges[rank];
    if (merge.is_string()) {
      const std::string text = merge.get<std::string>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        fail(label, fmt::format("merge {} '{}' is not two tokens separated by one space", rank,
                                text));
      }
      t.merges.emplace_back(text.substr(0, space), text.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      t.merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      fail(label, fmt::format("merge {} is neither \"a b\" nor [\"a\", \"b\"]", rank));
    }
  }
}

// Added tokens take ids the way HF's AddedVocabulary::add_tokens assigns them, in file order:
// the model's id when the content is in the model vocabulary, else the next id after the model
// vocabulary and the added tokens before. A file that says otherwise would load differently in
// HF, so it is rejected.
void read_added_tokens(const std::string& label, const json& list, Tokenizer::Impl& t) {
  if (list.is_null()) return;
  if (!list.is_array()) fail(label, "added_tokens must be an array");
  int64_t next_id = t.model_vocab_size;
  std::set<std::string> contents;
  for (const json& a : list) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        !a.contains("content") || !a["content"].is_string()) {
      fail(label, "every added token needs an integer id and a string content");
    }
    AddedToken token;
    token.content = a["content"].get<std::string>();
    const auto id = a["id"].get<int64_t>();
    const std::string where = fmt::format("added token '{}'", token.content);
    if (token.content.empty()) fail(label, fmt::format("added token {} has empty content", id));
    if (!contents.insert(token.content).second) {
      fail(label, fmt::format("added token '{}' is listed twice", token.content));
    }
    token.special = flag(label, a, "special", false, where);
    token.lstrip = flag(label, a, "lstrip", false, where);
    token.rstrip = flag(label, a, "rstrip", false, where);
    token.single_word = flag(label, a, "single_word", false, where);
    token.normalized = flag(label, a, "normalized", true, where);
    int64_t expected = 0;
    if (auto it = t.model_ids.find(token.content); it != t.model_ids.end()) {
      expected = it->second;
    } else {
      expected = next_id;
      t.tokens.push_back(token.content);
    }
    if (id != expected) {
      fail(label, fmt::format("added token '{}' has id {}, but HF tokenizers gives it id {} (the "
                              "model's id for a token in the vocabulary, else the next free id)",
                              token.content, id, expected));
    }
    next_id = std::max(next_id, expected + 1);
    token.id = static_cast<int32_t>(id);
    t.added.push_back(std::move(token));
  }
  std::sort(t.added.begin(), t.added.end(),
            [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });
}

Tokenizer::Impl parse(std::string_view text, const std::string& label) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    fail(label, fmt::format("not valid JSON (byte {}); a tokenizer.json is a JSON object",
                            e.byte));
  }
  if (!j.is_object()) fail(label, "not a JSON object");
  Tokenizer::Impl t;
  t.label = label;
  for (const char* key : {"truncation", "padding"}) {
    if (j.contains(key) && !j[key].is_null()) {
      fail(label, fmt::format("{} is set; concord does not truncate or pad (set it to null)", key));
    }
  }
  read_model(label, j.value("model", json()), t);
  read_normalizer(label, j.value("normalizer", json()), t);
  read_pre_tokenizer(label, j.value("pre_tokenizer", json()), t);
  const json& decoder = j.value("decoder", json());
  if (type_of(decoder) != "ByteLevel") {
    fail(label, fmt::format("decoder {} is not supported (concord implements ByteLevel)",
                            decoder.is_null() ? "null" : type_of(decoder)));
  }
  read_added_tokens(label, j.value("added_tokens", json()), t);
  for (const AddedToken& a : t.added) {
    if (invalid_utf8_offset(a.content) != std::string_view::npos) {
      fail(label, "an added token is not valid UTF-8");
    }
  }
  return t;
}

}  // namespace

Tokenizer Tokenizer::from_json(std::string_view json_text, std::string label) {
  auto impl = std::make_unique<Impl>(parse(json_text, label));
  impl->finish();
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load(const std::filesystem::path& tokenizer_json) {
  const std::string label = tokenizer_json.string();
  std::error_code ec;
  if (std::filesystem::is_directory(tokenizer_json, ec)) {
    fail(label, "is a directory; give the tokenizer.json file");
  }
  std::ifstream in(tokenizer_json, std::ios::binary);
  if (!in) fail(label, "cannot open (give the path of a tokenizer.json)");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) fail(label, "cannot read");
  return from_json(buffer.str(), label);
}

namespace {
std::string supported_pre_names() {
  std::string names;
  for (const GgufPreTokenizer& p : gguf_pre_tokenizers()) {
    names += (names.empty() ? "" : ", ") + std::string(p.name);
  }
  return names;
}
}  // namespace

// The messages name GGUF's keys, as the vocabulary is in its terms.
Tokenizer Tokenizer::from_vocabulary(const BpeVocabulary& vocab, std::string label) {
  const size_t n = vocab.tokens.size();
  if (vocab.token_types.size() != n) {
    fail(label, fmt::format("tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens "
                            "has {} (one type per token)",
                            vocab.token_types.size(), n));
  }
  auto t = std::make_unique<Impl>();
  t->label = label;
  const GgufPreTokenizer* pre = gguf_pre_tokenizer(vocab.pre);
  if (pre == nullptr) {
    fail(label, fmt::format("tokenizer.ggml.pre '{}' is not supported (concord implements {})",
                            vocab.pre, supported_pre_names()));
  }
  t->split = pre->split;
  t->nfc = vocab.nfc.value_or(pre->nfc);
  if (t->split == SplitPattern::kNone && !vocab.merges.empty()) {
    fail(label, "tokenizer.ggml.pre 'default' with merges is llama.cpp's default split, which "
                "concord does not implement");
  }
  // The model vocabulary runs up to the last normal token; added tokens after it follow it.
  size_t model_size = 0;
  for (size_t id = 0; id < n; ++id) {
    const int32_t type = vocab.token_types[id];
    if (type != 1 && type != 3 && type != 4) {
      fail(label, fmt::format("tokenizer.ggml.token_type: token {} has type {}; concord supports "
                              "1 (normal), 3 (control) and 4 (user-defined)",
                              id, type));
    }
    if (type == 1) model_size = id + 1;
    if (invalid_utf8_offset(vocab.tokens[id]) != std::string_view::npos || vocab.tokens[id].empty()) {
      fail(label, fmt::format("tokenizer.ggml.tokens: token {} is empty or not valid UTF-8", id));
    }
  }
  t->ignore_merges = pre->ignore_merges;
  t->tokens = vocab.tokens;
  t->model_vocab_size = static_cast<int32_t>(model_size);
  std::unordered_map<std::string_view, size_t> seen;
  seen.reserve(n);
  for (size_t id = 0; id < n; ++id) {
    if (auto [it, fresh] = seen.emplace(vocab.tokens[id], id); !fresh) {
      fail(label, fmt::format("tokenizer.ggml.tokens: token '{}' appears twice (ids {} and {})",
                              vocab.tokens[id], it->second, id));
    }
    if (id < model_size) t->model_ids.emplace(vocab.tokens[id], static_cast<int32_t>(id));
    if (vocab.token_types[id] != 1) {
      AddedToken a;
      a.id = static_cast<int32_t>(id);
      a.content = vocab.tokens[id];
      a.special = vocab.token_types[id] == 3;
      a.normalized = false;  // as transformers' GGUF converter adds them (normalized=False)
      t->added.push_back(std::move(a));
    }
  }
  for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
    const std::string& text = vocab.merges[rank];
    const size_t space = text.find(' ');
    if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
      fail(label, fmt::format("tokenizer.ggml.merges: merge {} '{}' is not two tokens separated "
                              "by one space",
                              rank, text));
    }
    const std::string left = text.substr(0, space), right = text.substr(space + 1);
    for (const std::string* part : {&left, &right, static_cast<const std::string*>(nullptr)}) {
      const std::string whole = part ? *part : left + right;
      if (t->model_ids.find(whole) == t->model_ids.end()) {
        fail(label, fmt::format("tokenizer.ggml.merges: merge {} '{}' {} '{}', which is not in "
                                "tokenizer.ggml.tokens",
                                rank, text, part ? "names" : "makes", whole));
      }
    }
    t->merges.emplace_back(left, right);
  }
  const std::pair<const char*, std::optional<int32_t>> specials[] = {
      {"bos_token_id", vocab.bos_id},
      {"eos_token_id", vocab.eos_id},
      {"unknown_token_id", vocab.unk_id},
      {"padding_token_id", vocab.pad_id}};
  for (const auto& [key, id] : specials) {
    if (id && (*id < 0 || static_cast<size_t>(*id) >= n)) {
      fail(label, fmt::format("tokenizer.ggml.{} is {}, outside the vocabulary (0..{})", key, *id,
                              n - 1));
    }
  }
  const bool add_bos = vocab.add_bos.value_or(pre->add_bos);
  if (add_bos && !vocab.bos_id) {
    fail(label, "tokenizer.ggml.add_bos_token is true but there is no tokenizer.ggml.bos_token_id");
  }
  if (vocab.add_eos && !vocab.eos_id) {
    fail(label, "tokenizer.ggml.add_eos_token is true but there is no tokenizer.ggml.eos_token_id");
  }
  t->bos_id = vocab.bos_id;
  t->eos_id = vocab.eos_id;
  t->unk_id = vocab.unk_id;
  t->pad_id = vocab.pad_id;
  t->add_bos = add_bos;
  t->add_eos = vocab.add_eos;
  t->finish();
  return Tokenizer(std::move(t));
}

Tokenizer Tokenizer::byte_level(const std::vector<std::string>& special_tokens) {
  BpeVocabulary vocab;
  vocab.pre = "default";
  vocab.nfc = false;
  for (const std::string& c : byte_to_char()) {
    vocab.tokens.push_back(c);
    vocab.token_types.push_back(1);
  }
  for (const std::string& s : special_tokens) {
    vocab.tokens.push_back(s);
    vocab.token_types.push_back(3);
  }
  return from_vocabulary(vocab, "byte-level");
}

std::string Tokenizer::to_json() const {
  using ojson = nlohmann::ordered_json;
  const Impl& t = *impl_;
  ojson j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  ojson added = ojson::array();
  for (const AddedToken& a : t.added) {
    added.push_back({{"id", a.id},
                     {"content", a.content},
                     {"single_word", a.single_word},
                     {"lstrip", a.lstrip},
                     {"rstrip", a.rstrip},
                     {"normalized", a.normalized},
                     {"special", a.special}});
  }
  j["added_tokens"] = added;
  j["normalizer"] = t.nfc ? ojson{{"type", "NFC"}} : ojson();
  const ojson byte_level = {{"type", "ByteLevel"},
                            {"add_prefix_space", false},
                            {"trim_offsets", false},
                            {"use_regex", false}};
  if (t.split == SplitPattern::kNone) {
    j["pre_tokenizer"] = byte_level;
  } else if (t.split == SplitPattern::kDigitsGpt2) {
    ojson byte_level_regex = byte_level;
    byte_level_regex["use_regex"] = true;
    j["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "Digits"}, {"individual_digits", true}}, byte_level_regex}}};
  } else {
    const ojson split = {{"type", "Split"},
                         {"pattern", {{"Regex", std::string(split_pattern_regex(t.split))}}},
                         {"behavior", "Isolated"},
                         {"invert", false}};
    j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {split, byte_level}}};
  }
  j["post_processor"] = byte_level;
  j["decoder"] = byte_level;
  // In id order. ordered_json's own insert searches linearly for the key (quadratic for 151k
  // tokens); the keys are known to be unique, so append to its underlying vector directly.
  ojson vocab = ojson::object();
  auto& entries = vocab.get_ref<ojson::object_t&>();
  using Entries = std::vector<ojson::object_t::value_type, ojson::object_t::allocator_type>;
  static_cast<Entries&>(entries).reserve(static_cast<size_t>(t.model_vocab_size));
  for (int32_t id = 0; id < t.model_vocab_size; ++id) {
    static_cast<Entries&>(entries).emplace_back(t.tokens[static_cast<size_t>(id)], ojson(id));
  }
  ojson merges = ojson::array();
  for (const auto& [left, right] : t.merges) merges.push_back({left, right});
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", t.ignore_merges},
                {"vocab", vocab},
                {"merges", merges}};
  return j.dump(2);
}

BpeVocabulary Tokenizer::vocabulary() const {
  const Impl& t = *impl_;
  BpeVocabulary v;
  v.tokens = t.tokens;
  v.token_types.assign(t.tokens.size(), 1);
  for (const AddedToken& a : t.added) v.token_types[static_cast<size_t>(a.id)] = a.special ? 3 : 4;
  v.merges.reserve(t.merges.size());
  for (const auto& [left, right] : t.merges) v.merges.push_back(left + " " + right);
  v.pre = std::string(split_pattern_gguf_name(t.split));
  v.nfc = t.nfc;
  v.bos_id = t.bos_id;
  v.eos_id = t.eos_id;
  v.unk_id = t.unk_id;
  v.pad_id = t.pad_id;
  v.add_bos = t.add_bos;
  v.add_eos = t.add_eos;
  return v;
}

}  // namespace concord::io
