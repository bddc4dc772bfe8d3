// Encoding and decoding of the byte-level BPE tokenizer (tokenizer.h), step for step as HF
// tokenizers does it: added tokens (AddedVocabulary), normalizer, split, byte-level BPE
// (BPE::merge_word), and the ByteLevel decoder.
#include <algorithm>
#include <unordered_map>

#include <fmt/format.h>

#include "concord/io/tokenizer_impl.h"
#include "concord/numerics/check.h"

namespace concord::io {

using namespace tokenizer_detail;

namespace tokenizer_detail {

void MergeMap::reserve(size_t n) {
  size_t capacity = 16;
  while (capacity < 2 * n) capacity *= 2;
  slots_.assign(capacity, Slot{});
  used_ = 0;
}

namespace {
uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return k;
}
}  // namespace

void MergeMap::insert_or_assign(int32_t left, int32_t right, Merge merge) {
  if (2 * (used_ + 1) > slots_.size()) {
    std::vector<Slot> old = std::move(slots_);
    reserve(std::max<size_t>(used_ + 1, old.size()));
    for (const Slot& s : old) {
      if (s.merge.id >= 0) {
        insert_or_assign(static_cast<int32_t>(s.key >> 32), static_cast<int32_t>(s.key), s.merge);
      }
    }
  }
  const uint64_t k = key(left, right);
  const size_t mask = slots_.size() - 1;
  for (size_t i = mix(k) & mask;; i = (i + 1) & mask) {
    if (slots_[i].merge.id < 0) {
      slots_[i] = Slot{k, merge};
      ++used_;
      return;
    }
    if (slots_[i].key == k) {
      slots_[i].merge = merge;  // a repeated merge takes the later rank, as HF's HashMap does
      return;
    }
  }
}

const MergeMap::Merge* MergeMap::find(int32_t left, int32_t right) const {
  if (slots_.empty()) return nullptr;
  const uint64_t k = key(left, right);
  const size_t mask = slots_.size() - 1;
  for (size_t i = mix(k) & mask;; i = (i + 1) & mask) {
    if (slots_[i].merge.id < 0) return nullptr;
    if (slots_[i].key == k) return &slots_[i].merge;
  }
}

}  // namespace tokenizer_detail

namespace {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// A piece of text between added tokens, or an added token found in it.
struct Segment {
  int32_t id;  // the added token, or -1 for text
  size_t begin, end;
};

// The bytes HF's ByteLevel decoder makes of one token: each character mapped back to its byte
// when every character is a byte-level one, else the token's own UTF-8.
std::string byte_level_decode(std::string_view token) {
  std::string bytes;
  for (size_t pos = 0; pos < token.size();) {
    const int b = char_to_byte(next_code_point(token, pos));
    if (b < 0) return std::string(token);
    bytes += static_cast<char>(b);
  }
  return bytes;
}

// Rust regex \s*$ and ^\s* on a UTF-8 slice, as byte offsets.
size_t trailing_space_start(std::string_view s) {
  size_t start = s.size();
  for (size_t pos = 0; pos < s.size();) {
    const size_t at = pos;
    if (!is_white_space(next_code_point(s, pos))) {
      start = s.size();
    } else if (start == s.size()) {
      start = at;
    }
  }
  return start;
}

size_t leading_space_end(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t next = pos;
    if (!is_white_space(next_code_point(s, next))) break;
    pos = next;
  }
  return pos;
}

char32_t last_code_point(std::string_view s) {
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
  return next_code_point(s, start);
}

// The merges of one piece: HF's Word::merge_all with a min-heap on (rank, position).
class BpeWord {
 public:
  void encode(const Tokenizer::Impl& t, std::string_view piece, std::vector<int32_t>& out) {
    symbols_.clear();
    heap_.clear();
    for (size_t i = 0; i < piece.size(); ++i) {
      // A byte without a token (SmolLM2's vocabulary lacks a few) is dropped, and its neighbours
      // become adjacent, as in HF's Word (no unk_token).
      const int32_t id = t.byte_ids[static_cast<uint8_t>(piece[i])];
      if (id < 0) continue;
      const auto at = static_cast<int32_t>(symbols_.size());
      symbols_.push_back(Symbol{id, at - 1, at + 1, true});
    }
    if (symbols_.empty()) return;
    symbols_.back().next = -1;
    for (size_t i = 0; i + 1 < symbols_.size(); ++i) push(t, i, i + 1);
    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), Later{});
      const Candidate top = heap_.back();
      heap_.pop_back();
      Symbol& left = symbols_[top.pos];
      if (!left.alive || left.next < 0) continue;
      const auto right_pos = static_cast<size_t>(left.next);
      const Symbol right = symbols_[right_pos];
      // A stale entry: the pair at this position no longer merges into the same token.
      const MergeMap::Merge* m = t.merge_map.find(left.id, right.id);
      if (m == nullptr || m->id != top.id) continue;
      left.id = top.id;
      left.next = right.next;
      symbols_[right_pos].alive = false;
      if (right.next >= 0) symbols_[static_cast<size_t>(right.next)].prev = static_cast<int32_t>(top.pos);
      if (left.prev >= 0) push(t, static_cast<size_t>(left.prev), top.pos);
      if (left.next >= 0) push(t, top.pos, static_cast<size_t>(left.next));
    }
    for (const Symbol& s : symbols_) {
      if (s.alive) out.push_back(s.id);
    }
  }

 private:
  struct Symbol {
    int32_t id, prev, next;
    bool alive;
  };
  struct Candidate {
    uint32_t rank;
    uint32_t pos;
    int32_t id;
  };
  struct Later {  // makes std::*_heap a min-heap on (rank, pos)
    bool operator()(const Candidate& a, const Candidate& b) const {
      return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
    }
  };
  void push(const Tokenizer::Impl& t, size_t left, size_t right) {
    if (const MergeMap::Merge* m = t.merge_map.find(symbols_[left].id, symbols_[right].id)) {
      heap_.push_back(Candidate{m->rank, static_cast<uint32_t>(left), m->id});
      std::push_heap(heap_.begin(), heap_.end(), Later{});
    }
  }
  std::vector<Symbol> symbols_;
  std::vector<Candidate> heap_;
};

// State of one encode call: the scratch buffers and the bounded cache of pieces already seen.
class Encoder {
 public:
  explicit Encoder(const Tokenizer::Impl& t) : t_(t) {}

  void encode_text(std::string_view normalized, std::vector<int32_t>& out) {
    pieces_.clear();
    split_text(t_.split, normalized, scratch_, pieces_);
    for (const auto& [begin, end] : pieces_) encode_piece(normalized.substr(begin, end - begin), out);
  }

 private:
  static constexpr size_t kMaxCached = 1 << 17;

  void encode_piece(std::string_view piece, std::vector<int32_t>& out) {
    if (piece.size() == 1) {
      if (const int32_t id = t_.byte_ids[static_cast<uint8_t>(piece[0])]; id >= 0) out.push_back(id);
      return;
    }
    if (auto it = cache_.find(piece); it != cache_.end()) {
      out.insert(out.end(), pool_.begin() + it->second.first,
                 pool_.begin() + it->second.first + it->second.second);
      return;
    }
    const size_t first = out.size();
    bool whole = false;
    if (t_.ignore_merges) {
      // HF's ignore_merges: a piece that is itself in the vocabulary is one token.
      if (auto it = t_.model_ids.find(to_byte_level(piece)); it != t_.model_ids.end()) {
        out.push_back(it->second);
        whole = true;
      }
    }
    if (!whole) word_.encode(t_, piece, out);
    if (cache_.size() >= kMaxCached) {
      cache_.clear();
      pool_.clear();
    }
    cache_.emplace(std::string(piece), std::pair<size_t, size_t>(pool_.size(), out.size() - first));
    pool_.insert(pool_.end(), out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
  }

  const Tokenizer::Impl& t_;
  SplitScratch scratch_;
  std::vector<std::pair<uint32_t, uint32_t>> pieces_;
  BpeWord word_;
  std::unordered_map<std::string, std::pair<size_t, size_t>, StringHash, std::equal_to<>> cache_;
  std::vector<int32_t> pool_;
};

// HF's AddedVocabulary::find_matches: leftmost-longest matches of `by_first_byte`'s tokens,
// then single_word, lstrip and rstrip. A discarded match still consumes its text, as there.
void find_added(const Tokenizer::Impl& t, std::string_view s,
                const std::array<std::vector<int32_t>, 256>& by_first_byte,
                const std::vector<std::string>* normalized_content, bool skip_special,
                std::vector<Segment>& segments) {
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < s.size()) {
    int32_t found = -1;
    size_t length = 0;
    for (; pos < s.size(); ++pos) {
      for (int32_t index : by_first_byte[static_cast<uint8_t>(s[pos])]) {
        const std::string& content = normalized_content != nullptr
                                         ? (*normalized_content)[static_cast<size_t>(index)]
                                         : t.added[static_cast<size_t>(index)].content;
        if (s.compare(pos, content.size(), content) == 0) {  // longest first
          found = index;
          length = content.size();
          break;
        }
      }
      if (found >= 0) break;
    }
    if (found < 0) break;
    const AddedToken& token = t.added[static_cast<size_t>(found)];
    size_t start = pos, stop = pos + length;
    pos = stop;
    if (skip_special && token.special) continue;
    if (token.single_word) {
      const bool start_space = start == 0 || !is_word_char(last_code_point(s.substr(0, start)));
      size_t after = stop;
      const bool stop_space = stop == s.size() || !is_word_char(next_code_point(s, after));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) start = std::max(trailing_space_start(s.substr(0, start)), start_offset);
    if (token.rstrip) stop += leading_space_end(s.substr(stop));
    if (start_offset < start) segments.push_back(Segment{-1, start_offset, start});
    segments.push_back(Segment{token.id, start, stop});
    start_offset = stop;
  }
  if (start_offset < s.size()) segments.push_back(Segment{-1, start_offset, s.size()});
}

int32_t checked_id(const Tokenizer::Impl& t, int32_t id) {
  if (id < 0 || static_cast<size_t>(id) >= t.tokens.size()) {
    throw InputError(fmt::format("[tokenizer] {}: token id {} is outside the vocabulary (0..{})",
                                 t.label, id, t.tokens.size() - 1));
  }
  return id;
}

}  // namespace

void Tokenizer::Impl::finish() {
  const auto fail = [this](const std::string& problem) {
    throw InputError(fmt::format("[tokenizer] {}: {}", label, problem));
  };
  const size_t n = tokens.size();
  added_index.assign(n, -1);
  added_ids.clear();
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& a = added[i];
    CONCORD_CHECK(a.id >= 0 && static_cast<size_t>(a.id) < n && tokens[static_cast<size_t>(a.id)] == a.content,
                  "added token out of place");
    added_index[static_cast<size_t>(a.id)] = static_cast<int32_t>(i);
    added_ids.emplace(a.content, a.id);
  }
  // A byte with no token of its own is dropped from the text it is in, as HF's BPE does without
  // an unk_token (SmolLM2 lacks 0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xF1, 0xF2 and the bytes
  // that never occur in UTF-8).
  for (int b = 0; b < 256; ++b) {
    auto it = model_ids.find(byte_to_char()[static_cast<size_t>(b)]);
    byte_ids[static_cast<size_t>(b)] = it == model_ids.end() ? -1 : it->second;
  }
  merge_map.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    auto l = model_ids.find(left), r = model_ids.find(right), m = model_ids.find(left + right);
    if (l == model_ids.end() || r == model_ids.end()) {
      fail(fmt::format("merge {} '{} {}' names a token that is not in the vocabulary", rank, left,
                       right));
    }
    if (m == model_ids.end()) {
      fail(fmt::format("merge {} '{} {}' makes '{}{}', which is not in the vocabulary", rank,
                       left, right, left, right));
    }
    merge_map.insert_or_assign(l->second, r->second,
                               MergeMap::Merge{static_cast<uint32_t>(rank), m->second});
  }
  decoded.resize(n);
  for (size_t id = 0; id < n; ++id) decoded[id] = byte_level_decode(tokens[id]);

  added_match_norm.assign(added.size(), std::string());
  for (auto& v : added_by_first_byte_raw) v.clear();
  for (auto& v : added_by_first_byte_norm) v.clear();
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& a = added[i];
    if (a.normalized) {
      added_match_norm[i] = nfc ? tokenizer_detail::nfc(a.content) : a.content;
      added_by_first_byte_norm[static_cast<uint8_t>(added_match_norm[i][0])].push_back(
          static_cast<int32_t>(i));
    } else {
      added_by_first_byte_raw[static_cast<uint8_t>(a.content[0])].push_back(static_cast<int32_t>(i));
    }
  }
  // Longest first, so that the first token that matches at a position is the longest.
  auto by_length = [](const std::vector<std::string>& text) {
    return [&text](int32_t a, int32_t b) {
      return text[static_cast<size_t>(a)].size() > text[static_cast<size_t>(b)].size();
    };
  };
  std::vector<std::string> raw_content(added.size());
  for (size_t i = 0; i < added.size(); ++i) raw_content[i] = added[i].content;
  for (auto& v : added_by_first_byte_raw) std::stable_sort(v.begin(), v.end(), by_length(raw_content));
  for (auto& v : added_by_first_byte_norm) {
    std::stable_sort(v.begin(), v.end(), by_length(added_match_norm));
  }
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(const Tokenizer& other) : impl_(std::make_unique<Impl>(*other.impl_)) {}
Tokenizer& Tokenizer::operator=(const Tokenizer& other) {
  if (this != &other) impl_ = std::make_unique<Impl>(*other.impl_);
  return *this;
}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  const Impl& t = *impl_;
  if (const size_t bad = invalid_utf8_offset(text); bad != std::string_view::npos) {
    // A problem of the text, not of the tokenizer: the caller names where the text came from.
    throw InputError(fmt::format("[tokenizer] encode: the text is not valid UTF-8 (byte {}); only "
                                 "UTF-8 text can be encoded", bad));
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 16);
  Encoder encoder(t);
  std::vector<Segment> raw, norm;
  find_added(t, text, t.added_by_first_byte_raw, nullptr, !parse_special, raw);
  for (const Segment& r : raw) {
    if (r.id >= 0) {
      ids.push_back(r.id);
      continue;
    }
    const std::string_view piece = text.substr(r.begin, r.end - r.begin);
    const std::string normalized = t.nfc ? nfc(piece) : std::string(piece);
    norm.clear();
    find_added(t, normalized, t.added_by_first_byte_norm, &t.added_match_norm, !parse_special,
               norm);
    for (const Segment& s : norm) {
      if (s.id >= 0) {
        ids.push_back(s.id);
      } else {
        encoder.encode_text(std::string_view(normalized).substr(s.begin, s.end - s.begin), ids);
      }
    }
  }
  return ids;
}

std::vector<int32_t> Tokenizer::encode_for_model(std::string_view text) const {
  std::vector<int32_t> ids = encode(text, true);
  if (impl_->add_bos && (ids.empty() || ids.front() != *impl_->bos_id)) {
    ids.insert(ids.begin(), *impl_->bos_id);
  }
  if (impl_->add_eos) ids.push_back(*impl_->eos_id);
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    checked_id(*impl_, id);
    if (skip_special && is_special(id)) continue;
    bytes += impl_->decoded[static_cast<size_t>(id)];
  }
  return utf8_lossy(bytes);
}

std::string Tokenizer::token_bytes(int32_t id) const {
  return impl_->decoded[static_cast<size_t>(checked_id(*impl_, id))];
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->tokens.size()); }

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  const std::string key(token);
  if (auto it = impl_->added_ids.find(key); it != impl_->added_ids.end()) return it->second;
  if (auto it = impl_->model_ids.find(key); it != impl_->model_ids.end()) return it->second;
  return std::nullopt;
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos_id; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos_id; }

bool Tokenizer::is_special(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->tokens.size()) return false;
  const int32_t index = impl_->added_index[static_cast<size_t>(id)];
  return index >= 0 && impl_->added[static_cast<size_t>(index)].special;
}

}  // namespace concord::io
