// concord codec: encode/decode single values and quantize/dequantize single blocks, as text.
// The exact I/O format is in the help text below and in docs/codec.md.
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "concord/cli/commands.h"
#include "concord/cli/flags.h"
#include "concord/numerics/block.h"
#include "concord/numerics/check.h"
#include "concord/numerics/scalar.h"

namespace concord::cli {
namespace {

using numerics::Format;
using numerics::QuantDesc;

struct CodecOptions {
  std::string format;
  std::string round = "rne";
  std::string scale_rule = "floor";
  uint64_t seed = 0;
  bool saturate = false;
  bool bits = false;
};

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return {};
  const size_t b = s.find_last_not_of(" \t\r");
  return s.substr(a, b - a + 1);
}

std::vector<std::string> split_fields(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : line) {
    if (c == ' ' || c == '\t' || c == ',' || c == '\r') {
      if (!cur.empty()) out.push_back(cur), cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

[[noreturn]] void bad_line(const std::string& cmd, long line_no, const std::string& what) {
  throw InputError("[codec " + cmd + "] line " + std::to_string(line_no) + ": " + what);
}

// A value: decimal, hex-float, nan, inf (strtof's syntax, whole token); with --bits, 8 hex
// digits of an fp32 bit pattern (optional 0x).
float parse_value(const std::string& token, bool bits, const std::string& cmd, long line_no) {
  if (bits) {
    std::string hex = token;
    if (hex.rfind("0x", 0) == 0 || hex.rfind("0X", 0) == 0) hex = hex.substr(2);
    if (hex.size() != 8 || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
      bad_line(cmd, line_no, "'" + token + "' is not 8 hex digits of an fp32 bit pattern");
    }
    return numerics::f32_from_bits(static_cast<uint32_t>(std::stoul(hex, nullptr, 16)));
  }
  char* end = nullptr;
  errno = 0;
  const float v = std::strtof(token.c_str(), &end);
  if (end == token.c_str() || *end != '\0') {
    bad_line(cmd, line_no, "cannot parse '" + token + "' as a number (decimal, hex-float, nan, inf)");
  }
  return v;  // ERANGE: strtof already returned +-Inf or a correctly rounded subnormal/zero
}

uint32_t parse_code(const std::string& token, uint32_t max_code, const std::string& cmd,
                    long line_no) {
  char* end = nullptr;
  const unsigned long v = std::strtoul(token.c_str(), &end, 0);  // 0x.. hex or decimal
  if (end == token.c_str() || *end != '\0' || v > max_code) {
    bad_line(cmd, line_no, fmt::format("'{}' is not a code in 0..0x{:X}", token, max_code));
  }
  return static_cast<uint32_t>(v);
}

std::string code_text(uint32_t code, int bits) {
  return bits > 8 ? fmt::format("0x{:04X}", code) : fmt::format("0x{:02X}", code);
}

std::string value_text(float v) {
  if (std::isnan(v)) return std::signbit(v) ? "-nan" : "nan";
  return fmt::format("{}", v);  // shortest decimal that reads back to the same fp32
}

numerics::Rounding rounding_of(const CodecOptions& o) {
  auto r = numerics::rounding_from_name(o.round);
  if (!r) throw InputError("[codec] unknown --round '" + o.round + "' (use rne, rtz or sr)");
  return *r;
}

Format element_format_of(const CodecOptions& o) {
  auto f = numerics::format_from_name(o.format);
  if (!f || *f == Format::f32) {
    std::string names;  // every element format except f32, which is not a codec target
    for (const numerics::FormatTraits& t : numerics::kFormatTable) {
      if (t.format == Format::f32) continue;
      names += (names.empty() ? "" : ", ") + std::string(t.name);
    }
    throw InputError("[codec] unknown --format '" + o.format + "' (use one of: " + names + ")");
  }
  return *f;
}

QuantDesc block_desc_of(const CodecOptions& o) {
  auto d = QuantDesc::from_name(o.format);
  if (!d || !d->has_scale || d->is_per_tensor() || d->block.rows != 1) {
    throw InputError("[codec] unknown block --format '" + o.format +
                     "' (use mxfp8-e4m3, mxfp8-e5m2, mxfp6-e2m3, mxfp6-e3m2, mxfp4 or nvfp4)");
  }
  auto rule = numerics::scale_rule_from_name(o.scale_rule);
  if (!rule) {
    throw InputError("[codec] unknown --scale-rule '" + o.scale_rule +
                     "' (use floor, ceil, even or rceil)");
  }
  d->scale_rule = *rule;
  d->rounding = rounding_of(o);
  return *d;
}

void run_encode(const CodecOptions& o) {
  const Format f = element_format_of(o);
  const auto rounding = rounding_of(o);
  const auto overflow = o.saturate ? numerics::Overflow::saturate : numerics::Overflow::ieee;
  const numerics::RandomStream rng{o.seed, 0};
  std::string line;
  long line_no = 0;
  uint64_t index = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    const std::string token = trim(line);
    if (token.empty()) continue;
    const float x = parse_value(token, o.bits, "encode", line_no);
    const uint32_t random = rounding == numerics::Rounding::stochastic ? rng.word(index) : 0u;
    ++index;
    const uint32_t code = numerics::encode_ref(f, x, rounding, overflow, random);
    std::cout << code_text(code, numerics::traits(f).bits) << '\n';
  }
}

void run_decode(const CodecOptions& o) {
  const Format f = element_format_of(o);
  std::string line;
  long line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    const std::string token = trim(line);
    if (token.empty()) continue;
    const uint32_t code = parse_code(token, numerics::traits(f).code_mask(), "decode", line_no);
    const float v = numerics::decode_ref(f, code);
    std::cout << fmt::format("0x{:08X} {}\n", numerics::f32_bits(v), value_text(v));
  }
}

void run_quantize(const CodecOptions& o) {
  const QuantDesc desc = block_desc_of(o);
  const int block = desc.block.cols;
  std::string line;
  long line_no = 0;
  uint64_t stream = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    const auto fields = split_fields(line);
    if (fields.empty()) continue;
    if (static_cast<int>(fields.size()) > block) {
      bad_line("quantize", line_no, fmt::format("{} values; one line is one block of at most {}",
                                                fields.size(), block));
    }
    std::vector<float> x;
    for (const auto& t : fields) x.push_back(parse_value(t, o.bits, "quantize", line_no));
    // Each line is its own tensor (its own NVFP4 tensor scale); SR stream = line index.
    const auto q = numerics::quantize_ref(desc, x.data(), 1, static_cast<int64_t>(x.size()),
                                          numerics::RandomStream{o.seed, static_cast<uint32_t>(stream++)});
    std::string out;
    if (desc.is_nvfp4()) out += fmt::format("0x{:08X} ", numerics::f32_bits(q.tensor_scale));
    out += fmt::format("0x{:02X}", q.scales.at(0));
    const int bits = numerics::traits(desc.element).bits;
    for (int64_t i = 0; i < q.numel(); ++i) {
      out += ' ';
      out += code_text(numerics::get_code(desc.element, q.codes, i), bits);
    }
    std::cout << out << '\n';
  }
}

void run_dequantize(const CodecOptions& o) {
  const QuantDesc desc = block_desc_of(o);
  const int block = desc.block.cols;
  const int header = desc.is_nvfp4() ? 2 : 1;
  std::string line;
  long line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    const auto fields = split_fields(line);
    if (fields.empty()) continue;
    const int n = static_cast<int>(fields.size()) - header;
    if (n < 1 || n > block) {
      bad_line("dequantize", line_no,
               fmt::format("expected {} then 1..{} element codes, got {} fields",
                           desc.is_nvfp4() ? "a tensor scale (fp32 bits) and a block scale"
                                           : "a scale code",
                           block, fields.size()));
    }
    numerics::QuantizedTensor q;
    q.desc = desc;
    q.rows = 1;
    q.cols = n;
    q.codes.assign(numerics::code_bytes(desc.element, n), 0);
    int k = 0;
    if (desc.is_nvfp4()) q.tensor_scale = parse_value(fields[k++], true, "dequantize", line_no);
    q.scales = {static_cast<uint8_t>(parse_code(fields[k++], 0xFF, "dequantize", line_no))};
    const uint32_t max_code = numerics::traits(desc.element).code_mask();
    for (int i = 0; i < n; ++i) {
      numerics::set_code(desc.element, q.codes, i,
                         parse_code(fields[k++], max_code, "dequantize", line_no));
    }
    std::vector<float> out(static_cast<size_t>(n));
    numerics::dequantize_ref(q, out.data());
    std::string text;
    for (int i = 0; i < n; ++i) {
      if (i) text += ' ';
      text += value_text(out[static_cast<size_t>(i)]);
    }
    std::cout << text << '\n';
  }
}

constexpr const char* kCodecHelp = R"(Encode, decode, quantize and dequantize values as text (stdin -> stdout).

  encode      one value per line: decimal, hex-float (0x1.8p3), nan, inf, -inf; with --bits an
              fp32 bit pattern as 8 hex digits. Prints one code per line: 0xHH, or 0xHHHH for
              16-bit formats (bf16, fp16). Codes are right-aligned: e2m1 0x0..0xF.
  decode      one code per line (0x.. or decimal). Prints '0xBBBBBBBB <value>': the fp32 bits
              of the decoded value, then the value (shortest decimal that reads back exactly).
  quantize    one block per line, values separated by spaces or commas (at most 32 for MX,
              16 for nvfp4; fewer makes a partial block). Prints the scale code then the
              element codes; for nvfp4 first the fp32 tensor decode scale as 0xBBBBBBBB, then
              the ue4m3 block scale, then the codes. Each line is its own tensor.
  dequantize  the output of quantize, one block per line -> the decoded values.
Element formats: bf16 fp16 e4m3 e5m2 e2m3 e3m2 e2m1 e8m0 ue4m3 int8 int4.
Block formats: mxfp8-e4m3 mxfp8-e5m2 mxfp6-e2m3 mxfp6-e3m2 mxfp4 nvfp4.
Overflow defaults to IEEE (to Inf, else NaN, else max); --saturate clamps to +-max.
Stochastic rounding (--round sr) takes value i's random word from Philox4x32-10(seed, i).)";

}  // namespace

void add_codec_command(CLI::App& app) {
  auto* codec = app.add_subcommand("codec", "Encode/decode values and blocks as text");
  codec->footer(kCodecHelp);
  codec->require_subcommand(1);
  auto opts = std::make_shared<CodecOptions>();
  auto add_common = [&](CLI::App* sub) {
    sub->add_option("--format,-f", opts->format, "Format name (see 'concord codec --help')")
        ->required();
    sub->add_option("--round", opts->round, "Rounding: rne (default), rtz, sr");
    add_seed_flag(sub, "--seed", opts->seed, "Seed for stochastic rounding (default 0)");
    sub->add_flag("--bits", opts->bits, "Read values as fp32 bit patterns (8 hex digits)");
  };
  auto* encode = codec->add_subcommand("encode", "Values -> codes, one per line");
  add_common(encode);
  encode->add_flag("--saturate", opts->saturate, "Clamp overflow to +-max (default: IEEE)");
  encode->callback([opts] { run_encode(*opts); });
  auto* decode = codec->add_subcommand("decode", "Codes -> '0xBBBBBBBB value', one per line");
  decode->add_option("--format,-f", opts->format, "Format name")->required();
  decode->callback([opts] { run_decode(*opts); });
  auto* quantize = codec->add_subcommand("quantize", "Blocks of values -> scale and codes");
  add_common(quantize);
  quantize->add_option("--scale-rule", opts->scale_rule, "MX scale rule: floor (default), ceil, even, rceil");
  quantize->callback([opts] { run_quantize(*opts); });
  auto* dequantize = codec->add_subcommand("dequantize", "Scale and codes -> values");
  dequantize->add_option("--format,-f", opts->format, "Block format name")->required();
  dequantize->callback([opts] { run_dequantize(*opts); });
}

}  // namespace concord::cli
