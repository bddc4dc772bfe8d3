// concord tokenize: text on stdin -> token ids on stdout (or ids -> text with --decode), with a
// tokenizer.json or a GGUF file's tokenizer.ggml.* vocabulary, as HF tokenizers'
// encode(text, add_special_tokens=False) / decode(ids).
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "concord/cli/commands.h"
#include "concord/io/atomic_file.h"
#include "concord/io/gguf.h"
#include "concord/io/tokenizer.h"
#include "concord/io/utf8.h"
#include "concord/numerics/check.h"

namespace concord::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer;
  bool decode = false;
  bool no_special = false;
  bool add_special = false;
  bool batch = false;
  std::string export_path;
};

std::string read_stdin() {
  std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  if (std::cin.bad()) throw InputError("[tokenize] stdin: cannot read");
  return text;
}

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (true) {
    pos = text.find_first_not_of(" \t\r\n", pos);
    if (pos == std::string::npos) break;
    const size_t end = std::min(text.find_first_of(" \t\r\n", pos), text.size());
    int32_t id = 0;
    const auto [ptr, ec] = std::from_chars(text.data() + pos, text.data() + end, id);
    if (ec != std::errc() || ptr != text.data() + end) {
      throw InputError(fmt::format("[tokenize] stdin: '{}' is not a token id (give integers "
                                   "separated by whitespace)",
                                   text.substr(pos, std::min<size_t>(end - pos, 40))));
    }
    ids.push_back(id);
    pos = end;
  }
  return ids;
}

void run_tokenize(const TokenizeOptions& o) {
  if (o.add_special && (o.no_special || o.decode)) {
    throw InputError("[tokenize] --add-special: encodes with special tokens parsed; it goes with "
                     "neither --no-special nor --decode");
  }
  std::filesystem::path path = o.tokenizer;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) path /= "tokenizer.json";  // a model folder
  std::optional<io::Tokenizer> loaded;
  if (!std::filesystem::is_directory(path, ec) && io::is_gguf_path(path)) {
    loaded = io::tokenizer_from_gguf(io::GgufFile::open(path));  // metadata only
    if (!loaded) {
      throw InputError(fmt::format("[tokenize] {}: the GGUF file has no tokenizer "
                                   "(tokenizer.ggml.model is absent or 'none')",
                                   path.string()));
    }
  } else {
    loaded = io::Tokenizer::load(path);
  }
  const io::Tokenizer& tokenizer = *loaded;
  if (!o.export_path.empty()) {
    io::write_file_atomic(o.export_path, std::string_view(tokenizer.to_json()));
    return;
  }
  const std::string input = read_stdin();
  // --batch: NUL-separated texts (encode) or one line of ids per text (decode), each alone.
  std::vector<std::string> parts;
  std::vector<size_t> starts;  // byte offset of each part in stdin
  const char separator = o.decode ? '\n' : '\0';
  if (o.batch) {
    size_t start = 0;
    while (start < input.size()) {
      const size_t end = std::min(input.find(separator, start), input.size());
      parts.push_back(input.substr(start, end - start));
      starts.push_back(start);
      start = end + 1;
    }
  } else {
    parts.push_back(input);
    starts.push_back(0);
  }
  std::string out;
  for (size_t k = 0; k < parts.size(); ++k) {
    const std::string& part = parts[k];
    if (o.decode) {
      out += tokenizer.decode(parse_ids(part), o.no_special);
      if (o.batch) out += '\0';
      continue;
    }
    // The text's own problem, named with where it is (the tokenizer is not at fault).
    if (const size_t bad = io::invalid_utf8_offset(part); bad != std::string::npos) {
      throw InputError(fmt::format(
          "[tokenize] stdin: not valid UTF-8 (byte {}{}); only UTF-8 text can be encoded",
          starts[k] + bad, o.batch ? fmt::format(", in text {} of the batch", k + 1) : ""));
    }
    const std::vector<int32_t> ids =
        o.add_special ? tokenizer.encode_for_model(part) : tokenizer.encode(part, !o.no_special);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) out += ' ';
      out += std::to_string(ids[i]);
    }
    out += '\n';
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto opts = std::make_shared<TokenizeOptions>();
  auto* cmd = app.add_subcommand(
      "tokenize",
      "Encode stdin to token ids (or decode ids to text) with a tokenizer.json or a GGUF file");
  cmd->footer(
      "\nEncoding prints the ids on one line, separated by spaces, exactly as HF tokenizers'\n"
      "encode(text, add_special_tokens=False). Special tokens written in the text are recognised\n"
      "unless --no-special (non-special added tokens such as Qwen3's <think> still are, as in\n"
      "HF). The text must be UTF-8. --decode reads whitespace-separated ids and writes the text\n"
      "as HF's decode (invalid UTF-8 becomes U+FFFD); with --no-special it skips special tokens.\n"
      "--add-special adds the BOS/EOS a GGUF's add_bos_token/add_eos_token ask for (llama.cpp's\n"
      "add_special). A GGUF's tokenizer comes from its tokenizer.ggml.* metadata (gpt2 model;\n"
      "the pre-tokenizer names concord implements are in docs/tokenizer.md).\n"
      "--export PATH writes the tokenizer as concord understands it, in the Qwen2 shape of\n"
      "tokenizer.json, which HF tokenizers encodes identically. See docs/tokenizer.md.");
  cmd->add_option("--tokenizer", opts->tokenizer,
                  "A tokenizer.json, a model folder holding one, or a GGUF file")
      ->required();
  cmd->add_flag("--decode", opts->decode, "Read token ids, write text");
  cmd->add_flag("--no-special", opts->no_special,
                "Encode: treat special tokens in the text as text; decode: skip special tokens");
  cmd->add_flag("--add-special", opts->add_special,
                "Encode as a model is given the text: add BOS / EOS where the GGUF's "
                "tokenizer.ggml.add_bos_token / add_eos_token say (llama.cpp's add_special)");
  cmd->add_flag("--batch", opts->batch,
                "Encode: stdin holds NUL-separated texts, one line of ids each; decode: one "
                "line of ids per text, texts written NUL-terminated");
  cmd->add_option("--export", opts->export_path,
                  "Write concord's own tokenizer.json for this tokenizer (Qwen2 shape) and exit");
  cmd->callback([opts] { run_tokenize(*opts); });
}

}  // namespace concord::cli
