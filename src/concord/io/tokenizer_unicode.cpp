// Unicode for the tokenizer: code points, the character classes of the split patterns
// (categories from utf8proc), NFC and GPT-2's byte-level alphabet (UTF-8 validity: io/utf8.h).
#include <cstdlib>
#include <memory>

#include <utf8proc.h>

#include "concord/io/tokenizer_impl.h"
#include "concord/numerics/check.h"

namespace concord::io::tokenizer_detail {
namespace {

struct ByteLevelTables {
  std::array<std::string, 256> byte_to_char;
  std::array<char32_t, 256> byte_to_cp{};
  ByteLevelTables() {
    // Printable Latin-1 bytes stand for themselves; the others get U+0100 onwards, in order.
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      byte_to_cp[static_cast<size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
      append_utf8(byte_to_char[static_cast<size_t>(b)], byte_to_cp[static_cast<size_t>(b)]);
    }
  }
};

const ByteLevelTables& byte_level_tables() {
  static const ByteLevelTables tables;
  return tables;
}

uint8_t flags_uncached(char32_t cp) {
  uint8_t f = 0;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: f = kLetter; break;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO: f = kNumber; break;
    default: break;
  }
  // White_Space (PropList.txt); stable since Unicode 6.3.
  const bool space = (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
                     cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
                     cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
  if (space) f |= kWhitespace;
  if (cp == '\r' || cp == '\n') f |= kNewline;
  return f;
}

struct AsciiFlags {
  std::array<uint8_t, 128> table{};
  AsciiFlags() {
    for (char32_t c = 0; c < 128; ++c) table[c] = flags_uncached(c);
  }
};

}  // namespace

char32_t next_code_point(std::string_view text, size_t& pos) {
  const auto b0 = static_cast<uint8_t>(text[pos]);
  if (b0 < 0x80) {
    ++pos;
    return b0;
  }
  const size_t n = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
  char32_t cp = b0 & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(text[pos + k]) & 0x3F);
  pos += n;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint8_t char_flags(char32_t cp) {
  static const AsciiFlags ascii;
  return cp < 128 ? ascii.table[cp] : flags_uncached(cp);
}

bool is_word_char(char32_t cp) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC: return true;
    default: break;
  }
  // Join_Control, and the Other_Alphabetic symbols outside the categories above (circled and
  // squared Latin letters, category So).
  return cp == 0x200C || cp == 0x200D || (cp >= 0x24B6 && cp <= 0x24E9) ||
         (cp >= 0x1F130 && cp <= 0x1F149) || (cp >= 0x1F150 && cp <= 0x1F169) ||
         (cp >= 0x1F170 && cp <= 0x1F189);
}

std::string nfc(std::string_view text) {
  // Every code point below U+0300 is NFC-stable and composes with nothing before it.
  bool stable = true;
  for (size_t i = 0; i < text.size() && stable; ++i) {
    const auto b = static_cast<uint8_t>(text[i]);
    stable = b < 0xCC;  // lead bytes from 0xCC start U+0300 and above
  }
  if (stable) return std::string(text);
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &out,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  CONCORD_CHECK(n >= 0, "utf8proc_map failed on valid UTF-8");
  const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(out, &std::free);
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

const std::array<std::string, 256>& byte_to_char() { return byte_level_tables().byte_to_char; }

int char_to_byte(char32_t cp) {
  if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) {
    return static_cast<int>(cp);
  }
  if (cp < 0x100 || cp > 0x143) return -1;
  // U+0100.. stand for the non-printable bytes in increasing order.
  const auto& t = byte_level_tables().byte_to_cp;
  for (int b = 0; b < 256; ++b) {
    if (t[static_cast<size_t>(b)] == cp) return b;
  }
  return -1;
}

std::string to_byte_level(std::string_view bytes) {
  const auto& table = byte_to_char();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += table[static_cast<uint8_t>(c)];
  return out;
}

}  // namespace concord::io::tokenizer_detail
