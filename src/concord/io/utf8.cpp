// UTF-8 validity and lossy decoding (utf8.h).
#include "concord/io/utf8.h"

#include <cstdint>

namespace concord::io {
namespace {

bool is_continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

}  // namespace

size_t utf8_sequence(std::string_view bytes, size_t i, size_t& valid_prefix) {
  const auto b0 = static_cast<uint8_t>(bytes[i]);
  valid_prefix = 1;
  if (b0 < 0x80) return 1;
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;  // E0 80..9F would be overlong
    if (b0 == 0xED) hi = 0x9F;  // ED A0..BF would be a surrogate
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;  // F0 80..8F would be overlong
    if (b0 == 0xF4) hi = 0x8F;  // F4 90.. would exceed U+10FFFF
  } else {
    return 0;  // a continuation byte, C0/C1 (overlong) or F5..FF: never a lead
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= bytes.size()) return 0;
    const auto b = static_cast<uint8_t>(bytes[i + k]);
    const bool ok = k == 1 ? (b >= lo && b <= hi) : is_continuation(b);
    if (!ok) return 0;
    valid_prefix = k + 1;
  }
  return need + 1;
}

bool utf8_incomplete_at_end(std::string_view bytes, size_t i) {
  const auto b0 = static_cast<uint8_t>(bytes[i]);
  if (b0 < 0xC2 || b0 > 0xF4) return false;
  size_t prefix = 0;
  // Every byte after the lead was acceptable and the end came first.
  return utf8_sequence(bytes, i, prefix) == 0 && i + prefix == bytes.size();
}

size_t invalid_utf8_offset(std::string_view text) {
  size_t i = 0, prefix = 0;
  while (i < text.size()) {
    if (static_cast<uint8_t>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = utf8_sequence(text, i, prefix);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0, prefix = 0;
  while (i < bytes.size()) {
    const size_t n = utf8_sequence(bytes, i, prefix);
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      out += kReplacementCharacter;
      i += prefix;
    }
  }
  return out;
}

}  // namespace concord::io
