// UTF-8 validity, shared by the tokenizer (which encodes only UTF-8 and decodes lossily) and the
// text streamed out of the engine (serve/text.h): well-formed sequences as Unicode defines them
// (no overlong forms, no surrogates, nothing above U+10FFFF), and the "maximal subpart" rule by
// which Rust's String::from_utf8_lossy, HF tokenizers and WHATWG replace bad bytes by U+FFFD.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace concord::io {

inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

// The length (1 to 4) of the well-formed sequence at bytes[i]; or 0, with `valid_prefix` set to
// the length (at least 1) of the longest prefix of bytes[i..] that could still begin one: the
// maximal subpart, which the lossy decoders replace by one U+FFFD.
size_t utf8_sequence(std::string_view bytes, size_t i, size_t& valid_prefix);

// Whether bytes[i..] is a proper prefix of a well-formed sequence: it is cut short by the end
// of `bytes`, and more bytes could complete it (a streaming decoder waits for them).
bool utf8_incomplete_at_end(std::string_view bytes, size_t i);

// Offset of the first byte that is not part of well-formed UTF-8, or npos when all of it is.
size_t invalid_utf8_offset(std::string_view text);

// Rust's String::from_utf8_lossy: each maximal invalid subpart becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);

}  // namespace concord::io
