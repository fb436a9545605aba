// A YAML document as a small tree that remembers where every node came from (file and
// 1-based line, or the `--set` option that supplied it). Experiments are assembled from
// several sources (a file, the files it `extends:`, command-line overrides, sweep values)
// before the strict config parser sees them; carrying the origin on each node lets every
// error name the exact place to fix. yaml-cpp only reads the text (0.7 and 0.8 both work).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mxlab {

// Where a node came from.
struct YLoc {
  std::string origin;  // a file path, or e.g. "--set model.width=256"
  int line = 0;        // 1-based; 0 = no line (an option, or the file as a whole)
  std::string str() const;  // "FILE:LINE" or "ORIGIN"
};

struct YEntry;

struct YNode {
  enum class Kind : uint8_t { null = 0, scalar, map, seq };
  Kind kind = Kind::null;
  std::string text;            // scalar text, quotes removed
  std::vector<YEntry> map;     // mapping entries in order of appearance (no duplicate keys)
  std::vector<YNode> seq;
  YLoc loc;

  bool is_null() const { return kind == Kind::null; }
  bool is_scalar() const { return kind == Kind::scalar; }
  bool is_map() const { return kind == Kind::map; }
  bool is_seq() const { return kind == Kind::seq; }
  // The entry for `key` in a mapping, or null.
  const YEntry* find(const std::string& key) const;
  YEntry* find(const std::string& key);
  // For messages: "'abc'", "a mapping", "a list" or "nothing".
  std::string describe() const;
  // The node as one line of flow-style YAML (scalars as written, quoted when needed).
  std::string flow() const;

  static YNode scalar(std::string text, YLoc loc);
};

struct YEntry {
  std::string key;
  YLoc key_loc;
  YNode value;
};

// Parse YAML text. Syntax errors, duplicate keys and non-scalar keys throw mxlab::Error
// "ORIGIN:LINE: ..." (yaml-cpp itself keeps both copies of a duplicated key), and so do a quoted
// string with no closing quote (which yaml-cpp accepts) and a tab in the indentation (said as
// such). Aliases are copied, so the tree has no shared nodes; a document that would expand to
// more than 100000 keys and values, or to 16 MiB more scalar text than it holds (nested aliases,
// "billion laughs"), is refused before it can exhaust memory.
YNode yaml_parse(const std::string& text, const std::string& origin);
// Read and parse an experiment file; a missing, unreadable or empty (comment-only) file throws
// mxlab::Error naming the path.
YNode yaml_load_file(const std::string& path);

// Deep merge: mappings merge key by key (`over` wins, new keys are appended in order);
// anything else in `over` replaces what `base` holds.
void yaml_merge(YNode& base, const YNode& over);

// Set the node at a dotted path (components of `path`), creating mappings on the way (a
// non-mapping in the way is replaced: the strict parser then reports the type mismatch).
void yaml_set_path(YNode& root, const std::vector<std::string>& path, const YNode& value, const YLoc& key_loc);

// The value of a `--set KEY=VALUE` option as a node: text starting with '[' or '{' is parsed
// as flow YAML (lists, mappings); anything else is taken verbatim as one scalar, so that
// e.g. `name=a: b` or `device=cuda:1` need no quoting.
YNode yaml_option_value(const std::string& text, const YLoc& loc);

// Quote a string for YAML when a plain scalar would not read back as the same string.
std::string yaml_quote(const std::string& s);

// Levenshtein distance, and the hint for a misspelt name: " (did you mean 'x'?)" when some
// valid name is close, else " (valid: a, b, c)".
int edit_distance(const std::string& a, const std::string& b);
std::string did_you_mean(const std::string& bad, const std::vector<std::string>& valid);

// Split "a.b.c" at the dots (empty components are kept, so callers can reject them).
std::vector<std::string> split_dotted(const std::string& key);

}  // namespace mxlab
