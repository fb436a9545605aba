// YAML text -> YNode with origins (see yaml_tree.h), merging, dotted paths and name hints.
#include "lab/config/yaml_tree.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lab/core/error.h"

namespace mxlab {

std::string YLoc::str() const { return line > 0 ? msg(origin, ":", line) : origin; }

const YEntry* YNode::find(const std::string& key) const {
  for (const YEntry& e : map)
    if (e.key == key) return &e;
  return nullptr;
}

YEntry* YNode::find(const std::string& key) {
  for (YEntry& e : map)
    if (e.key == key) return &e;
  return nullptr;
}

std::string YNode::describe() const {
  switch (kind) {
    case Kind::scalar: return quoted_excerpt(text);
    case Kind::map: return "a mapping";
    case Kind::seq: return "a list";
    default: return "nothing";
  }
}

namespace {

// A scalar that can stand unquoted inside flow YAML ([a, b] / {k: v}) and read back as
// the same text; numbers and names qualify, text with YAML punctuation does not.
bool plain_in_flow(const std::string& s) {
  if (s.empty()) return false;
  const bool negative_number = s.size() > 1 && s[0] == '-' && std::isdigit(static_cast<unsigned char>(s[1]));
  if (std::string("-?:!&*|>'\"%@`#").find(s.front()) != std::string::npos && !negative_number) return false;
  for (char c : s)
    if (std::string(",[]{}#\"'\n\t\\").find(c) != std::string::npos) return false;
  if (s.find(": ") != std::string::npos || s.back() == ':' || s.back() == ' ' || s.front() == ' ') return false;
  return true;
}

std::string double_quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

int mark_line(const YAML::Node& n, int fallback) {
  const YAML::Mark m = n.Mark();
  return m.line >= 0 ? m.line + 1 : fallback;  // yaml-cpp marks are 0-based
}

// What one document may expand to. yaml-cpp keeps an alias (*a) as a second reference to its
// anchor's node, but the tree built here copies it, so nested aliases multiply ("billion laughs":
// 9 levels of ten aliases each, 530 bytes of text, are 10^9 nodes). The bounds are far above any
// experiment (a few hundred keys and values) and far below what would exhaust memory.
constexpr size_t kMaxTreeNodes = 100000;                  // keys, values and list items
constexpr size_t kMaxAliasBytes = size_t{16} << 20;       // scalar bytes beyond those of the text itself

// One document being converted: where it came from, its text (for quoted-scalar checks) and
// what it has expanded to so far.
struct Converter {
  const std::string& origin;
  const std::string& text;
  size_t nodes = 0, bytes = 0;

  [[noreturn]] void too_large(int line) const {
    const std::string what = nodes > kMaxTreeNodes
                                 ? msg("more than ", kMaxTreeNodes, " keys and values")
                                 : msg("more than ", text.size() + kMaxAliasBytes, " bytes of text (the file holds ",
                                       text.size(), ")");
    throw Error(msg(YLoc{origin, line}.str(), ": the YAML expands to ", what,
                    ": aliases (*name) repeat what their anchor (&name) holds, and nested aliases multiply it; "
                    "write the values out, or use fewer aliases"));
  }
  void count(size_t scalar_bytes, int line) {
    ++nodes;
    bytes += scalar_bytes;
    if (nodes > kMaxTreeNodes || bytes > text.size() + kMaxAliasBytes) too_large(line);
  }

  // yaml-cpp 0.7 reads a quoted scalar with no closing quote up to the end of the text and
  // accepts it (`name: "abc` then swallows every line after it). The node's mark is at its
  // opening quote: find the closing one as YAML does (\" escapes in double quotes, '' in single).
  void check_quotes(const YAML::Node& n) const {
    const YAML::Mark m = n.Mark();
    // Marks count the characters after a UTF-8 byte order mark.
    const size_t bom = text.compare(0, 3, "\xEF\xBB\xBF") == 0 ? 3 : 0;
    if (m.pos < 0 || static_cast<size_t>(m.pos) + bom >= text.size()) return;
    size_t i = static_cast<size_t>(m.pos) + bom;
    while (i < text.size() && (text[i] == '&' || text[i] == '!')) {  // an anchor or a tag before the scalar
      while (i < text.size() && !std::isspace(static_cast<unsigned char>(text[i]))) ++i;
      while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
    }
    if (i >= text.size()) return;
    const char q = text[i];
    if (q != '"' && q != '\'') return;  // a plain or block scalar
    for (++i; i < text.size(); ++i) {
      if (q == '"' && text[i] == '\\') {
        ++i;
      } else if (text[i] == q) {
        if (q == '\'' && i + 1 < text.size() && text[i + 1] == '\'') {
          ++i;
        } else {
          return;
        }
      }
    }
    throw Error(msg(YLoc{origin, m.line + 1}.str(), ": YAML syntax error: unterminated ",
                    q == '"' ? "double" : "single", "-quoted string (column ", m.column + 1, "): add the closing ",
                    q, " (or remove the opening one)"));
  }

  YNode convert(const YAML::Node& n, int fallback_line) {
    YNode out;
    out.loc = {origin, fallback_line};
    switch (n.Type()) {
      case YAML::NodeType::Scalar:
        out.kind = YNode::Kind::scalar;
        out.loc.line = mark_line(n, fallback_line);
        count(n.Scalar().size(), out.loc.line);
        check_quotes(n);
        out.text = n.Scalar();
        break;
      case YAML::NodeType::Sequence:
        out.kind = YNode::Kind::seq;
        out.loc.line = mark_line(n, fallback_line);
        count(0, out.loc.line);
        for (const YAML::Node& e : n) out.seq.push_back(convert(e, out.loc.line));
        break;
      case YAML::NodeType::Map:
        out.kind = YNode::Kind::map;
        out.loc.line = mark_line(n, fallback_line);
        count(0, out.loc.line);
        for (auto it = n.begin(); it != n.end(); ++it) {
          const int key_line = mark_line(it->first, out.loc.line);
          if (!it->first.IsScalar())
            throw Error(msg(YLoc{origin, key_line}.str(), ": mapping keys must be plain names"));
          count(it->first.Scalar().size(), key_line);
          check_quotes(it->first);
          YEntry e;
          e.key = it->first.Scalar();
          e.key_loc = {origin, key_line};
          if (const YEntry* prev = out.find(e.key))
            throw Error(msg(e.key_loc.str(), ": duplicate key ", quoted_excerpt(e.key), " (first given at line ",
                            prev->key_loc.line, "): keep one of them"));
          // A null value (`key:` with nothing after it) has no position of its own: use the key's.
          e.value = convert(it->second, key_line);
          out.map.push_back(std::move(e));
        }
        break;
      default:  // Null, Undefined
        out.kind = YNode::Kind::null;
        count(0, fallback_line);
        break;
    }
    return out;
  }
};

// yaml-cpp reports a tab in the indentation as e.g. "illegal map value": say what it is. The
// line of the error (1-based) if its indentation holds a tab, else 0.
int tab_indented_line(const std::string& text, int line) {
  if (line <= 0) return 0;
  size_t at = 0;
  for (int l = 1; l < line; ++l) {
    at = text.find('\n', at);
    if (at == std::string::npos) return 0;
    ++at;
  }
  for (size_t i = at; i < text.size() && (text[i] == ' ' || text[i] == '\t'); ++i)
    if (text[i] == '\t') return line;
  return 0;
}

void relocate(YNode& n, const YLoc& loc) {
  n.loc = loc;
  for (YEntry& e : n.map) {
    e.key_loc = loc;
    relocate(e.value, loc);
  }
  for (YNode& c : n.seq) relocate(c, loc);
}

}  // namespace

std::string YNode::flow() const {
  switch (kind) {
    case Kind::scalar: return plain_in_flow(text) ? text : double_quoted(text);
    case Kind::map: {
      std::string s = "{";
      for (size_t i = 0; i < map.size(); ++i) s += (i ? ", " : "") + map[i].key + ": " + map[i].value.flow();
      return s + "}";
    }
    case Kind::seq: {
      std::string s = "[";
      for (size_t i = 0; i < seq.size(); ++i) s += (i ? ", " : "") + seq[i].flow();
      return s + "]";
    }
    default: return "null";
  }
}

YNode YNode::scalar(std::string text, YLoc loc) {
  YNode n;
  n.kind = Kind::scalar;
  n.text = std::move(text);
  n.loc = std::move(loc);
  return n;
}

YNode yaml_parse(const std::string& text, const std::string& origin) {
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(text);
  } catch (const YAML::Exception& e) {
    const YLoc at{origin, e.mark.line >= 0 ? e.mark.line + 1 : 0};
    if (tab_indented_line(text, at.line) > 0)
      throw Error(msg(at.str(), ": YAML syntax error: tabs are not allowed in YAML indentation: indent with spaces"));
    const std::string col = e.mark.column >= 0 ? msg(" (column ", e.mark.column + 1, ")") : "";
    throw Error(msg(at.str(), ": YAML syntax error: ", e.msg, col));
  }
  if (docs.size() > 1)
    throw Error(msg(origin, ": holds ", docs.size(), " YAML documents (separated by ---): put one experiment per file"));
  if (docs.empty()) return YNode{YNode::Kind::null, {}, {}, {}, {origin, 0}};
  Converter conv{origin, text};
  return conv.convert(docs[0], 1);
}

YNode yaml_load_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error(msg(path, ": is a directory, not a YAML file: pass the experiment file itself"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(msg(path, ": cannot read the file (", std::strerror(errno), "): check the path"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw Error(msg(path, ": read error (", std::strerror(errno), ")"));
  YNode root = yaml_parse(ss.str(), path);
  // An empty file would silently run every default (the paper's full-size model, hours on a
  // CPU): almost certainly the wrong file, or one not written yet.
  if (root.is_null() || (root.is_map() && root.map.empty()))
    throw Error(msg(path, ": the experiment file is empty (no keys, only comments or blank lines); start from `mxlab "
                    "dump-config > ", path, "` and edit it"));
  return root;
}

void yaml_merge(YNode& base, const YNode& over) {
  if (over.is_null() && base.is_map()) return;  // `model:` with nothing under it changes nothing
  if (!(base.is_map() && over.is_map())) {
    base = over;
    return;
  }
  for (const YEntry& e : over.map) {
    if (YEntry* b = base.find(e.key)) {
      b->key_loc = e.key_loc;
      yaml_merge(b->value, e.value);
    } else {
      base.map.push_back(e);
    }
  }
}

void yaml_set_path(YNode& root, const std::vector<std::string>& path, const YNode& value, const YLoc& key_loc) {
  YNode* cur = &root;
  for (size_t i = 0; i < path.size(); ++i) {
    if (!cur->is_map()) {
      const YLoc keep = cur->loc;
      *cur = YNode{};
      cur->kind = YNode::Kind::map;
      cur->loc = keep.origin.empty() ? key_loc : keep;
    }
    YEntry* e = cur->find(path[i]);
    if (!e) {
      YEntry ne;
      ne.key = path[i];
      ne.key_loc = key_loc;
      ne.value.loc = key_loc;
      cur->map.push_back(std::move(ne));
      e = &cur->map.back();
    }
    e->key_loc = key_loc;
    if (i + 1 == path.size()) {
      e->value = value;
    } else {
      cur = &e->value;
    }
  }
}

YNode yaml_option_value(const std::string& text, const YLoc& loc) {
  if (!text.empty() && (text.front() == '[' || text.front() == '{')) {
    YNode n = yaml_parse(text, loc.origin);
    relocate(n, loc);
    return n;
  }
  return YNode::scalar(text, loc);
}

std::string yaml_quote(const std::string& s) {
  static const char* const kReserved[] = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"};
  bool plain = !s.empty() && (std::isalpha(static_cast<unsigned char>(s.front())) || s.front() == '_');
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' || c == '/' || c == ':'))
      plain = false;
  if (plain && s.back() == ':') plain = false;
  if (plain) {
    std::string lower = s;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    for (const char* r : kReserved)
      if (lower == r) plain = false;
  }
  return plain ? s : double_quoted(s);
}

int edit_distance(const std::string& a, const std::string& b) {
  // Optimal string alignment distance: a swapped pair of letters ("widht") costs 1.
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1, 0));
  for (size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

std::string did_you_mean(const std::string& bad, const std::vector<std::string>& valid) {
  // Close enough to be a typo: one edit for short names, about a third of the letters otherwise.
  const int limit = bad.size() <= 3 ? 1 : std::max(2, static_cast<int>(bad.size()) / 3);
  int best = limit + 1;
  std::string best_name;
  for (const std::string& v : valid) {
    // Lengths further apart than the limit cannot be within it (and a huge name costs nothing).
    const size_t gap = bad.size() > v.size() ? bad.size() - v.size() : v.size() - bad.size();
    if (gap > static_cast<size_t>(limit)) continue;
    const int d = edit_distance(bad, v);
    if (d < best) {
      best = d;
      best_name = v;
    }
  }
  if (!best_name.empty()) return " (did you mean '" + best_name + "'?)";
  std::string list;
  for (size_t i = 0; i < valid.size(); ++i) list += (i ? ", " : "") + valid[i];
  return " (valid: " + list + ")";
}

std::vector<std::string> split_dotted(const std::string& key) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    out.push_back(key.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return out;
}

}  // namespace mxlab
