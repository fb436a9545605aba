// Strict YAML <-> RunConfig (see config_io.h). The schema is one table (schema() below): each
// leaf knows its key, how to read a YAML scalar into the struct, how to print the field back
// and its range check. The parser, dump_config, --set, intervention `set:` and the sweep's
// key list all walk that table, so no field can be readable but unprinted, or the reverse.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "lab/core/error.h"
#include "lab/config/config_io.h"
#include "lab/config/names.h"
#include "lab/config/sweep.h"
#include "lab/config/yaml_tree.h"
#include "lab/model/mlp.h"
#include "lab/mx/hadamard.h"

namespace mxlab {

namespace {

const char* const kActNames[] = {"relu", "gelu", "gelu_tanh", "swiglu", "linear"};
static_assert(sizeof(kActNames) / sizeof(kActNames[0]) == static_cast<size_t>(Act::kCount), "one name per Act");

// ---- reading scalars -------------------------------------------------------------------

[[noreturn]] void fail(const YLoc& loc, const std::string& what) { throw Error(loc.str() + ": " + what); }

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

const std::string& need_scalar(const YNode& n, const std::string& key, const char* expected) {
  if (!n.is_scalar()) fail(n.loc, msg(key, ": expected ", expected, ", got ", n.describe()));
  return n.text;
}

bool all_digits(const std::string& t, size_t from) {
  if (from >= t.size()) return false;
  for (size_t i = from; i < t.size(); ++i)
    if (t[i] < '0' || t[i] > '9') return false;
  return true;
}

int parse_int(const YNode& n, const std::string& key) {
  const std::string& t = need_scalar(n, key, "an integer");
  const size_t from = (!t.empty() && (t[0] == '+' || t[0] == '-')) ? 1 : 0;
  if (!all_digits(t, from)) fail(n.loc, msg(key, ": expected an integer, got ", quoted_excerpt(t)));
  errno = 0;
  const long long v = std::strtoll(t.c_str(), nullptr, 10);
  if (errno == ERANGE || v < INT_MIN || v > INT_MAX)
    fail(n.loc, msg(key, ": ", excerpt(t), " is out of range (integers here are 32-bit)"));
  return static_cast<int>(v);
}

uint64_t parse_u64(const YNode& n, const std::string& key) {
  const std::string& t = need_scalar(n, key, "a non-negative integer");
  if (!all_digits(t, (!t.empty() && t[0] == '+') ? 1 : 0))
    fail(n.loc, msg(key, ": expected a non-negative integer, got ", quoted_excerpt(t)));
  errno = 0;
  const unsigned long long v = std::strtoull(t.c_str(), nullptr, 10);
  if (errno == ERANGE) fail(n.loc, msg(key, ": ", excerpt(t), " is out of range (at most 18446744073709551615)"));
  return static_cast<uint64_t>(v);
}

float parse_float(const YNode& n, const std::string& key) {
  const std::string& t = need_scalar(n, key, "a number");
  // Decimal numbers only ([+-]digits[.digits][e[+-]digits]): no hex, inf or nan in a config.
  size_t i = (!t.empty() && (t[0] == '+' || t[0] == '-')) ? 1 : 0;
  size_t mant_digits = 0;
  while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i, ++mant_digits;
  if (i < t.size() && t[i] == '.') {
    ++i;
    while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i, ++mant_digits;
  }
  bool ok = mant_digits > 0;
  if (ok && i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    if (i < t.size() && (t[i] == '+' || t[i] == '-')) ++i;
    ok = all_digits(t.substr(i), 0);
    i = t.size();
  }
  if (!ok || i != t.size()) fail(n.loc, msg(key, ": expected a number, got ", quoted_excerpt(t)));
  const float v = std::strtof(t.c_str(), nullptr);
  if (!std::isfinite(v)) fail(n.loc, msg(key, ": ", excerpt(t), " is out of float range"));
  return v;
}

bool parse_bool(const YNode& n, const std::string& key) {
  const std::string& t = need_scalar(n, key, "true or false");
  if (t == "true" || t == "True" || t == "TRUE") return true;
  if (t == "false" || t == "False" || t == "FALSE") return false;
  fail(n.loc, msg(key, ": expected true or false, got ", quoted_excerpt(t)));
}

// " (did you mean 'x'? valid: a, b, c)" or " (valid: a, b, c)": for enum values, where the
// whole list is short enough to show.
std::string hint_with_list(const std::string& bad, const std::vector<std::string>& names) {
  std::string hint = did_you_mean(bad, names);
  if (hint.rfind(" (did you mean", 0) == 0) return hint.substr(0, hint.size() - 1) + " valid: " + join(names) + ")";
  return hint;
}

// Index of the scalar's text in `names`; an unknown value names the nearest and every valid one.
size_t parse_choice(const YNode& n, const std::string& key, const std::vector<std::string>& names, const char* what) {
  const std::string& t = need_scalar(n, key, what);
  for (size_t i = 0; i < names.size(); ++i)
    if (t == names[i]) return i;
  fail(n.loc, msg(key, ": unknown ", what, " ", quoted_excerpt(t), hint_with_list(t, names)));
}

// Shortest decimal that reads back to the same float, spelt so that YAML 1.1 readers
// (PyYAML) also see a float: a '.' in the mantissa and a signed exponent ("1.0e-05").
std::string fmt_float(float f) {
  constexpr int kMaxDigits = 9;  // enough for any float (FLT_DECIMAL_DIG)
  char buf[40];
  int prec = 1;
  for (; prec < kMaxDigits; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, static_cast<double>(f));
    if (std::strtof(buf, nullptr) == f) break;
  }
  // Write 100 rather than 1e+02 when the digits allow it.
  for (int p = prec; p <= kMaxDigits; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, static_cast<double>(f));
    if (std::string(buf).find("e+") == std::string::npos) break;
  }
  if (std::strtof(buf, nullptr) != f) std::snprintf(buf, sizeof buf, "%.*g", prec, static_cast<double>(f));
  std::string s = buf;
  const size_t e = s.find('e');
  std::string mant = s.substr(0, e);
  const std::string exp = e == std::string::npos ? "" : s.substr(e);
  if (mant.find('.') == std::string::npos) mant += ".0";
  return mant + exp;
}

// ---- the schema table ------------------------------------------------------------------

using Setter = std::function<void(RunConfig&, const YNode&, const std::string& key)>;
using Getter = std::function<std::string(const RunConfig&)>;
using Checker = std::function<std::string(const RunConfig&)>;  // "" = fine, else what is wrong

struct Leaf {
  std::string key;
  Setter set;
  Getter get;
  Checker check;               // may be empty
  bool presentation = false;   // changes no number a run produces: left out of the run id
  // Added after run ids were first published (schema 1): left out of the canonical text (and
  // so of the run id) while it holds its default, so that every earlier run id stays valid and
  // `mxlab run` still finds the finished runs of an existing results directory.
  bool since_v2 = false;
};

struct Item {
  std::string key;
  bool section = false;        // a mapping of leaves (model, precision, ...)
  std::vector<Leaf> leaves;    // a top-level leaf is an Item holding one Leaf of the same key
};

// A field of RunConfig reached through an accessor lambda (RunConfig&) -> T&.
template <typename F>
auto& field_of(F f, const RunConfig& c) {
  return f(const_cast<RunConfig&>(c));  // read only
}

template <typename F>
Leaf int_leaf(std::string key, F f, int min) {
  return {key, [f](RunConfig& c, const YNode& n, const std::string& k) { f(c) = parse_int(n, k); },
          [f](const RunConfig& c) { return std::to_string(field_of(f, c)); },
          [f, min](const RunConfig& c) {
            const int v = field_of(f, c);
            return v >= min ? std::string() : msg("must be ", min == 1 ? "> 0" : msg(">= ", min), ", got ", v);
          }};
}

enum class FRange { positive, nonnegative, unit, above_one };  // > 0, >= 0, [0, 1), > 1

template <typename F>
Leaf float_leaf(std::string key, F f, FRange r) {
  return {key, [f](RunConfig& c, const YNode& n, const std::string& k) { f(c) = parse_float(n, k); },
          [f](const RunConfig& c) { return fmt_float(field_of(f, c)); },
          [f, r](const RunConfig& c) {
            const float v = field_of(f, c);
            switch (r) {
              case FRange::positive: return v > 0.0f ? std::string() : msg("must be > 0, got ", fmt_float(v));
              case FRange::nonnegative: return v >= 0.0f ? std::string() : msg("must be >= 0, got ", fmt_float(v));
              case FRange::unit:
                return (v >= 0.0f && v < 1.0f) ? std::string() : msg("must be in [0, 1), got ", fmt_float(v));
              case FRange::above_one: return v > 1.0f ? std::string() : msg("must be > 1, got ", fmt_float(v));
            }
            return std::string();
          }};
}

// A leaf added after schema 1 (see Leaf::since_v2).
Leaf since_v2(Leaf l) {
  l.since_v2 = true;
  return l;
}

// A list of step numbers (>= 0), e.g. `[100, 4200]`; printed in flow style, sorted as given.
template <typename F>
Leaf step_list_leaf(std::string key, F f) {
  return {key,
          [f](RunConfig& c, const YNode& n, const std::string& k) {
            std::vector<int>& v = f(c);
            v.clear();
            if (n.is_null()) return;
            if (n.is_scalar()) {  // one step without brackets
              v.push_back(parse_int(n, k));
              return;
            }
            if (!n.is_seq()) fail(n.loc, msg(k, ": expected a list of steps (e.g. [100, 4200]), got ", n.describe()));
            for (size_t i = 0; i < n.seq.size(); ++i) v.push_back(parse_int(n.seq[i], msg(k, "[", i, "]")));
          },
          [f](const RunConfig& c) {
            std::string s = "[";
            for (size_t i = 0; i < field_of(f, c).size(); ++i) s += msg(i ? ", " : "", field_of(f, c)[i]);
            return s + "]";
          },
          [f](const RunConfig& c) {
            for (int v : field_of(f, c))
              if (v < 0) return msg("must hold steps >= 0, got ", v);
            return std::string();
          }};
}

template <typename F>
Leaf bool_leaf(std::string key, F f) {
  return {key, [f](RunConfig& c, const YNode& n, const std::string& k) { f(c) = parse_bool(n, k); },
          [f](const RunConfig& c) { return std::string(field_of(f, c) ? "true" : "false"); }, {}};
}

// An enum field whose YAML names are names[i] for the value E(i).
template <typename E, typename F>
Leaf enum_leaf(std::string key, F f, std::vector<std::string> names, const char* what) {
  return {key,
          [f, names, what](RunConfig& c, const YNode& n, const std::string& k) {
            f(c) = static_cast<E>(parse_choice(n, k, names, what));
          },
          [f, names](const RunConfig& c) { return names.at(static_cast<size_t>(field_of(f, c))); }, {}};
}

std::vector<std::string> act_names() { return {std::begin(kActNames), std::end(kActNames)}; }
std::vector<std::string> mx_format_names() {
  std::vector<std::string> v;
  for (int i = 0; i < static_cast<int>(NumFmt::kCount); ++i)
    if (is_mx(static_cast<NumFmt>(i))) v.push_back(name(static_cast<NumFmt>(i)));
  return v;
}
template <typename E>
std::vector<std::string> enum_names() {
  std::vector<std::string> v;
  for (int i = 0; i < static_cast<int>(E::kCount); ++i) v.push_back(name(static_cast<E>(i)));
  return v;
}

// precision.weight_bwd / activation_bwd / grad_wgrad: `same` or a format.
template <typename F>
Leaf bwd_leaf(std::string key, F f) {
  return {key,
          [f](RunConfig& c, const YNode& n, const std::string& k) {
            std::vector<std::string> names = {"same"};
            for (const std::string& s : numfmt_names()) names.push_back(s);
            const size_t i = parse_choice(n, k, names, "format");
            if (i == 0) f(c).reset();
            else f(c) = static_cast<NumFmt>(i - 1);
          },
          [f](const RunConfig& c) {
            const std::optional<NumFmt>& v = field_of(f, c);
            return std::string(v ? name(*v) : "same");
          },
          {}};
}

std::vector<std::string> ln_affine_names() {
  std::vector<std::string> v = {"none", "bf16"};
  for (const std::string& s : mx_format_names()) v.push_back(s);
  return v;
}

// precision.rounding: one mode for every role, or a mapping of roles to modes. The
// first kSpelledRoles are the roles a one-mode `rounding` is spelt out into (set_config_path)
// and that the mapping form always prints; grad_wgrad follows grad unless it is given.
const char* const kRoundingRoles[] = {"weight", "activation", "grad", "ln_affine", "grad_wgrad"};
constexpr PrecisionConfig::Role kRoles[] = {PrecisionConfig::Role::weight, PrecisionConfig::Role::activation,
                                            PrecisionConfig::Role::grad, PrecisionConfig::Role::ln_affine,
                                            PrecisionConfig::Role::grad_wgrad};
constexpr int kRoundingRoleCount = 5;
constexpr int kSpelledRoles = 4;

std::optional<Rounding>& role_override(PrecisionConfig& p, PrecisionConfig::Role r) {
  switch (r) {
    case PrecisionConfig::Role::weight: return p.rounding_weight;
    case PrecisionConfig::Role::activation: return p.rounding_activation;
    case PrecisionConfig::Role::grad: return p.rounding_grad;
    case PrecisionConfig::Role::grad_wgrad: return p.rounding_grad_wgrad;
    case PrecisionConfig::Role::ln_affine: break;
  }
  return p.rounding_ln_affine;
}

std::vector<std::string> rounding_role_names() { return {std::begin(kRoundingRoles), std::end(kRoundingRoles)}; }

// Index of a role name, or -1.
int rounding_role_index(const std::string& role) {
  for (int i = 0; i < kRoundingRoleCount; ++i)
    if (role == kRoundingRoles[i]) return i;
  return -1;
}

Rounding parse_rounding_mode(const YNode& n, const std::string& key) {
  return static_cast<Rounding>(parse_choice(n, key, enum_names<Rounding>(), "rounding mode"));
}

void set_rounding(PrecisionConfig& p, const YNode& n, const std::string& key) {
  if (!n.is_map()) {  // one mode: every role
    p.rounding = parse_rounding_mode(n, key);
    for (PrecisionConfig::Role r : kRoles) role_override(p, r).reset();
    return;
  }
  for (const YEntry& e : n.map) {
    const int i = rounding_role_index(e.key);
    if (i < 0)
      fail(e.key_loc, msg("unknown role ", quoted_excerpt(e.key), " in ", key, hint_with_list(e.key, rounding_role_names())));
    role_override(p, kRoles[i]) = parse_rounding_mode(e.value, key + "." + e.key);
  }
}

// The one mode when every role has it and grad_wgrad follows grad; else the mapping of the
// spelt roles, with grad_wgrad's mode when it has one of its own (as written: it then no longer
// follows a later change of grad's).
std::string rounding_text(const PrecisionConfig& p) {
  if (p.rounding_uniform() && !p.rounding_grad_wgrad) return name(p.rounding_of(PrecisionConfig::Role::weight));
  std::string s = "{";
  for (int i = 0; i < kSpelledRoles; ++i) s += msg(i ? ", " : "", kRoundingRoles[i], ": ", name(p.rounding_of(kRoles[i])));
  if (p.rounding_grad_wgrad) s += msg(", grad_wgrad: ", name(*p.rounding_grad_wgrad));
  return s + "}";
}

// precision.gemm: {fprop: F, dgrad: F, wgrad: F}: one format for both operand roles of a GEMM of
// every linear layer (kGemmRoles[g] are the roles GEMM g sets; apply_gemm).
const char* const kGemmNames[] = {"fprop", "dgrad", "wgrad"};
const char* const kGemmRoles[][2] = {{"weight", "activation"}, {"grad", "weight_bwd"}, {"grad_wgrad", "activation_bwd"}};
constexpr int kGemmCount = 3;

std::vector<std::string> gemm_names() { return {std::begin(kGemmNames), std::end(kGemmNames)}; }

int gemm_index(const std::string& g) {
  for (int i = 0; i < kGemmCount; ++i)
    if (g == kGemmNames[i]) return i;
  return -1;
}

std::string gemm_roles_text(int g) { return msg(kGemmRoles[g][0], " and ", kGemmRoles[g][1]); }

// GEMM g's operand roles := f. A role of another GEMM that follows a role changed here (`same`)
// is pinned to the format it had, so that only GEMM g changes: fprop pins weight_bwd and
// activation_bwd, dgrad pins grad_wgrad. (attn_logits / attn_probs at `same` follow activation,
// and the attention-internal backward GEMMs read grad, as without gemm: lab/model/README.md.)
void apply_gemm(PrecisionConfig& p, int g, NumFmt f) {
  switch (g) {
    case 0:  // fprop: Y = X W^T
      if (!p.weight_bwd) p.weight_bwd = p.weight;
      if (!p.activation_bwd) p.activation_bwd = p.activation;
      p.weight = p.activation = f;
      break;
    case 1:  // dgrad: dX = dY W
      if (!p.grad_wgrad) p.grad_wgrad = p.grad;
      p.grad = f;
      p.weight_bwd = f;
      break;
    default:  // wgrad: dW = dY^T X
      p.grad_wgrad = f;
      p.activation_bwd = f;
      break;
  }
}

NumFmt parse_gemm_format(const YNode& n, const std::string& key) {
  return static_cast<NumFmt>(parse_choice(n, key, numfmt_names(), "format"));
}

// precision.rotation: one mode for the three GEMMs, or a mapping of GEMMs (kGemmNames) to modes
// (the GEMMs it leaves out keep theirs), as precision.rounding is for roles.
const std::vector<std::string> kRotationNames = {"none", "hadamard", "random_hadamard"};

Rotation parse_rotation_mode(const YNode& n, const std::string& key) {
  return static_cast<Rotation>(parse_choice(n, key, kRotationNames, "rotation"));
}

void set_rotation(PrecisionConfig& p, const YNode& n, const std::string& key) {
  if (!n.is_map()) {
    p.rotation.fill(parse_rotation_mode(n, key));
    return;
  }
  for (const YEntry& e : n.map) {
    const int g = gemm_index(e.key);
    if (g < 0) fail(e.key_loc, msg("unknown GEMM '", e.key, "' in ", key, hint_with_list(e.key, gemm_names())));
    p.rotation[static_cast<size_t>(g)] = parse_rotation_mode(e.value, key + "." + e.key);
  }
}

// The one mode when the three GEMMs share it, else the mapping of all three.
std::string rotation_text(const PrecisionConfig& p) {
  const auto& r = p.rotation;
  if (r[0] == r[1] && r[1] == r[2]) return kRotationNames[static_cast<size_t>(r[0])];
  std::string s = "{";
  for (int g = 0; g < kGemmCount; ++g)
    s += msg(g ? ", " : "", kGemmNames[g], ": ", kRotationNames[static_cast<size_t>(r[static_cast<size_t>(g)])]);
  return s + "}";
}

// An int leaf that takes one of `allowed`.
template <typename F>
Leaf choice_int_leaf(std::string key, F f, std::vector<int> allowed) {
  Leaf l = int_leaf(std::move(key), f, 1);
  l.check = [f, allowed](const RunConfig& c) {
    const int v = field_of(f, c);
    std::string list;
    for (int a : allowed) {
      if (a == v) return std::string();
      list += (list.empty() ? "" : ", ") + std::to_string(a);
    }
    return msg("must be one of ", list, ", got ", v);
  };
  return l;
}

// precision.attention_tile: [Br, Bc], each >= 1 (a patch's `set` hands it over as the scalar
// text "[Br, Bc]", which is parsed the same way).
Leaf tile_leaf() {
  return {"attention_tile",
          [](RunConfig& c, const YNode& n0, const std::string& k) {
            const YNode n = n0.is_scalar() && !n0.text.empty() && n0.text.front() == '['
                                ? yaml_option_value(n0.text, n0.loc)
                                : n0;
            if (!n.is_seq() || n.seq.size() != 2)
              fail(n.loc, msg(k, ": expected [Br, Bc], the query rows and keys of a tile (e.g. [128, 64]), got ",
                              n.describe()));
            c.precision.attention_tile_r = parse_int(n.seq[0], k + "[0]");
            c.precision.attention_tile_c = parse_int(n.seq[1], k + "[1]");
          },
          [](const RunConfig& c) { return msg("[", c.precision.attention_tile_r, ", ", c.precision.attention_tile_c, "]"); },
          [](const RunConfig& c) {
            const int r = c.precision.attention_tile_r, b = c.precision.attention_tile_c;
            return r >= 1 && b >= 1 ? std::string() : msg("must hold two sizes >= 1, got [", r, ", ", b, "]");
          }};
}

const std::vector<std::string> kBlockNames = {"mlp", "attention"};

bool valid_device(const std::string& d) {
  return d == "cpu" || d == "auto" || d == "cuda" || (d.rfind("cuda:", 0) == 0 && all_digits(d, 5));
}

std::vector<Item> build_schema() {
  std::vector<Item> s;
  auto top = [&](Leaf l) { s.push_back({l.key, false, {std::move(l)}}); };
  auto section = [&](std::string key, std::vector<Leaf> leaves) { s.push_back({std::move(key), true, std::move(leaves)}); };

  top({"name", [](RunConfig& c, const YNode& n, const std::string& k) { c.name = need_scalar(n, k, "a string"); },
       [](const RunConfig& c) { return yaml_quote(c.name); },
       [](const RunConfig& c) { return c.name.empty() ? std::string("must not be empty") : std::string(); }, true});
  top({"seed", [](RunConfig& c, const YNode& n, const std::string& k) { c.seed = parse_u64(n, k); },
       [](const RunConfig& c) { return std::to_string(c.seed); }, {}});
  top(int_leaf("steps", [](RunConfig& c) -> int& { return c.steps; }, 1));
  top({"device", [](RunConfig& c, const YNode& n, const std::string& k) { c.device = need_scalar(n, k, "a device"); },
       [](const RunConfig& c) { return yaml_quote(c.device); },
       [](const RunConfig& c) {
         return valid_device(c.device) ? std::string() : msg(quoted_excerpt(c.device), " is not a device (use cpu, auto, cuda or cuda:N)");
       },
       true});

  section("model",
          {int_leaf("depth", [](RunConfig& c) -> int& { return c.model.depth; }, 1),
           int_leaf("width", [](RunConfig& c) -> int& { return c.model.width; }, 1),
           int_leaf("hidden_mult", [](RunConfig& c) -> int& { return c.model.hidden_mult; }, 1),
           enum_leaf<Act>("activation", [](RunConfig& c) -> Act& { return c.model.activation; }, act_names(), "activation"),
           bool_leaf("layernorm", [](RunConfig& c) -> bool& { return c.model.layernorm; }),
           bool_leaf("ln_affine", [](RunConfig& c) -> bool& { return c.model.ln_affine; }),
           float_leaf("ln_eps", [](RunConfig& c) -> float& { return c.model.ln_eps; }, FRange::positive),
           bool_leaf("fc2_bias", [](RunConfig& c) -> bool& { return c.model.fc2_bias; }),
           enum_leaf<InitKind>("init", [](RunConfig& c) -> InitKind& { return c.model.init; }, {"pytorch", "xavier_normal"},
                               "init"),
           float_leaf("init_gain", [](RunConfig& c) -> float& { return c.model.init_gain; }, FRange::positive),
           since_v2(enum_leaf<BlockKind>("block", [](RunConfig& c) -> BlockKind& { return c.model.block; }, kBlockNames,
                                         "block")),
           since_v2(int_leaf("heads", [](RunConfig& c) -> int& { return c.model.heads; }, 1)),
           since_v2(enum_leaf<NormKind>("norm", [](RunConfig& c) -> NormKind& { return c.model.norm; },
                                        {"layernorm", "rmsnorm", "mxnorm", "none"}, "norm")),
           since_v2(choice_int_leaf("mxnorm_p", [](RunConfig& c) -> int& { return c.model.mxnorm_p; }, {1, 2})),
           since_v2(choice_int_leaf("mxnorm_block", [](RunConfig& c) -> int& { return c.model.mxnorm_block; },
                                    {16, 32, 64})),
           since_v2(bool_leaf("causal", [](RunConfig& c) -> bool& { return c.model.causal; }))});

  section("teacher",
          {int_leaf("depth", [](RunConfig& c) -> int& { return c.teacher.depth; }, 0),
           int_leaf("width", [](RunConfig& c) -> int& { return c.teacher.width; }, 0),
           {"activation",
            [](RunConfig& c, const YNode& n, const std::string& k) {
              std::vector<std::string> names = {"same"};
              for (const std::string& a : act_names()) names.push_back(a);
              const size_t i = parse_choice(n, k, names, "activation");
              if (i == 0) c.teacher.activation.reset();
              else c.teacher.activation = static_cast<Act>(i - 1);
            },
            [](const RunConfig& c) { return std::string(c.teacher.activation ? act_name(*c.teacher.activation) : "same"); },
            {}},
           bool_leaf("residual", [](RunConfig& c) -> bool& { return c.teacher.residual; }),
           since_v2(enum_leaf<BlockKind>("block", [](RunConfig& c) -> BlockKind& { return c.teacher.block; },
                                         kBlockNames, "block"))});

  section("data", {int_leaf("batch", [](RunConfig& c) -> int& { return c.data.batch; }, 1),
                   float_leaf("label_noise", [](RunConfig& c) -> float& { return c.data.label_noise; }, FRange::nonnegative),
                   since_v2(int_leaf("seq_len", [](RunConfig& c) -> int& { return c.data.seq_len; }, 1)),
                   since_v2(bool_leaf("mx_teacher_targets", [](RunConfig& c) -> bool& { return c.data.mx_teacher_targets; })),
                   since_v2(enum_leaf<DataKind>("kind", [](RunConfig& c) -> DataKind& { return c.data.kind; },
                                                {"gaussian", "tokens"}, "data kind")),
                   since_v2(int_leaf("vocab", [](RunConfig& c) -> int& { return c.data.vocab; }, 2))});

  top(enum_leaf<LossKind>("loss", [](RunConfig& c) -> LossKind& { return c.loss; }, {"mse", "kl", "xent"}, "loss"));
  top(float_leaf("kl_temperature", [](RunConfig& c) -> float& { return c.kl_temperature; }, FRange::positive));

  section("optimizer",
          {enum_leaf<OptKind>("name", [](RunConfig& c) -> OptKind& { return c.optimizer.name; }, {"adam", "adamw", "sgd"},
                              "optimizer"),
           float_leaf("lr", [](RunConfig& c) -> float& { return c.optimizer.lr; }, FRange::positive),
           float_leaf("beta1", [](RunConfig& c) -> float& { return c.optimizer.beta1; }, FRange::unit),
           float_leaf("beta2", [](RunConfig& c) -> float& { return c.optimizer.beta2; }, FRange::unit),
           float_leaf("eps", [](RunConfig& c) -> float& { return c.optimizer.eps; }, FRange::positive),
           float_leaf("weight_decay", [](RunConfig& c) -> float& { return c.optimizer.weight_decay; }, FRange::nonnegative),
           float_leaf("momentum", [](RunConfig& c) -> float& { return c.optimizer.momentum; }, FRange::unit)});

  section("schedule",
          {enum_leaf<SchedKind>("name", [](RunConfig& c) -> SchedKind& { return c.schedule.name; }, {"constant", "cosine"},
                                "schedule"),
           int_leaf("warmup", [](RunConfig& c) -> int& { return c.schedule.warmup; }, 0),
           float_leaf("lr_min", [](RunConfig& c) -> float& { return c.schedule.lr_min; }, FRange::nonnegative)});

  section(
      "precision",
      {enum_leaf<NumFmt>("weight", [](RunConfig& c) -> NumFmt& { return c.precision.weight; }, numfmt_names(), "format"),
       enum_leaf<NumFmt>("activation", [](RunConfig& c) -> NumFmt& { return c.precision.activation; }, numfmt_names(),
                         "format"),
       enum_leaf<NumFmt>("grad", [](RunConfig& c) -> NumFmt& { return c.precision.grad; }, numfmt_names(), "format"),
       bwd_leaf("weight_bwd", [](RunConfig& c) -> std::optional<NumFmt>& { return c.precision.weight_bwd; }),
       bwd_leaf("activation_bwd", [](RunConfig& c) -> std::optional<NumFmt>& { return c.precision.activation_bwd; }),
       since_v2(bwd_leaf("grad_wgrad", [](RunConfig& c) -> std::optional<NumFmt>& { return c.precision.grad_wgrad; })),
       {"ln_affine",
        [](RunConfig& c, const YNode& n, const std::string& k) {
          // `fp32` is accepted as a synonym of `none` (the gains stay in FP32).
          if (n.is_scalar() && n.text == "fp32") {
            c.precision.ln_affine = NumFmt::fp32;
            return;
          }
          const std::string f = ln_affine_names()[parse_choice(n, k, ln_affine_names(), "ln_affine format")];
          c.precision.ln_affine = f == "none" ? NumFmt::fp32 : parse_numfmt(f);
        },
        [](const RunConfig& c) {
          return std::string(c.precision.ln_affine == NumFmt::fp32 ? "none" : name(c.precision.ln_affine));
        },
        {}},
       {"elementwise",
        [](RunConfig& c, const YNode& n, const std::string& k) {
          c.precision.elementwise_bf16 = parse_choice(n, k, {"fp32", "bf16"}, "elementwise format") == 1;
        },
        [](const RunConfig& c) { return std::string(c.precision.elementwise_bf16 ? "bf16" : "fp32"); }, {}},
       bool_leaf("backward", [](RunConfig& c) -> bool& { return c.precision.backward; }),
       int_leaf("block_size", [](RunConfig& c) -> int& { return c.precision.block_size; }, 1),
       enum_leaf<ScaleRule>("scale_rule", [](RunConfig& c) -> ScaleRule& { return c.precision.scale_rule; },
                            enum_names<ScaleRule>(), "scale rule"),
       enum_leaf<Bump>("bump", [](RunConfig& c) -> Bump& { return c.precision.bump; }, enum_names<Bump>(), "bump mode"),
       {"rounding", [](RunConfig& c, const YNode& n, const std::string& k) { set_rounding(c.precision, n, k); },
        [](const RunConfig& c) { return rounding_text(c.precision); }, {}},
       // bf16 vector ops round to nearest only (ties to even, or away as the reference emulator does).
       enum_leaf<Rounding>("elementwise_rounding",
                           [](RunConfig& c) -> Rounding& { return c.precision.elementwise_rounding; },
                           {"nearest_even", "nearest_away"}, "elementwise rounding mode"),
       {"diagnostic_format",
        [](RunConfig& c, const YNode& n, const std::string& k) {
          c.precision.diagnostic_format = parse_numfmt(mx_format_names()[parse_choice(n, k, mx_format_names(), "MX format")]);
        },
        [](const RunConfig& c) { return std::string(name(c.precision.diagnostic_format)); }, {}},
       since_v2(bwd_leaf("attn_logits", [](RunConfig& c) -> std::optional<NumFmt>& { return c.precision.attn_logits; })),
       since_v2(bwd_leaf("attn_probs", [](RunConfig& c) -> std::optional<NumFmt>& { return c.precision.attn_probs; })),
       // The paper's emulator (microxcaling) op by op (lab/model/README.md, "The paper's emulator").
       since_v2(enum_leaf<LnOps>("layernorm", [](RunConfig& c) -> LnOps& { return c.precision.layernorm; },
                                 {"fused", "vector"}, "layernorm ops")),
       since_v2(enum_leaf<GeluOps>("gelu", [](RunConfig& c) -> GeluOps& { return c.precision.gelu; },
                                   {"fused", "vector", "vector_teacher"}, "gelu ops")),
       since_v2(enum_leaf<ResidualPrec>("residual", [](RunConfig& c) -> ResidualPrec& { return c.precision.residual; },
                                        {"elementwise", "fp32"}, "residual precision")),
       since_v2(enum_leaf<BiasPrec>("bias", [](RunConfig& c) -> BiasPrec& { return c.precision.bias; },
                                    {"fp32", "elementwise"}, "bias precision")),
       since_v2(bool_leaf("ln_beta_grad", [](RunConfig& c) -> bool& { return c.precision.ln_beta_grad; })),
       // Block Hadamard rotation of the GEMM operands along K (lab/mx/README.md, "Block Hadamard rotation").
       since_v2({"rotation", [](RunConfig& c, const YNode& n, const std::string& k) { set_rotation(c.precision, n, k); },
                 [](const RunConfig& c) { return rotation_text(c.precision); }, {}}),
       since_v2({"rotation_block",
                 [](RunConfig& c, const YNode& n, const std::string& k) { c.precision.rotation_block = parse_int(n, k); },
                 [](const RunConfig& c) { return std::to_string(c.precision.rotation_block); },
                 [](const RunConfig& c) {
                   const int v = c.precision.rotation_block;
                   return is_rotation_block(v) ? std::string()
                                               : msg("must be a power of two from ", kMinRotationBlock, " to ",
                                                     kMaxRotationBlock, " (the Hadamard block), got ", v);
                 }}),
       // Attention numerics (lab/model/README.md, "Flash attention in bf16").
       since_v2(enum_leaf<AttnImpl>("attention", [](RunConfig& c) -> AttnImpl& { return c.precision.attention; },
                                    {"exact", "flash_bf16"}, "attention implementation")),
       since_v2(tile_leaf()),
       since_v2(enum_leaf<AttnSoftmax>("attention_softmax",
                                       [](RunConfig& c) -> AttnSoftmax& { return c.precision.attention_softmax; },
                                       {"standard", "stabilized"}, "attention softmax")),
       since_v2(float_leaf("attention_beta", [](RunConfig& c) -> float& { return c.precision.attention_beta; },
                           FRange::above_one)),
       since_v2(float_leaf("attention_eps", [](RunConfig& c) -> float& { return c.precision.attention_eps; },
                           FRange::positive)),
       since_v2(enum_leaf<AttnDelta>("attention_delta", [](RunConfig& c) -> AttnDelta& { return c.precision.attention_delta; },
                                     {"lp", "hp"}, "attention delta"))});

  section("log",
          {int_leaf("log_every", [](RunConfig& c) -> int& { return c.log.log_every; }, 1),
           int_leaf("bias_every", [](RunConfig& c) -> int& { return c.log.bias_every; }, 0),
           float_leaf("spike_factor", [](RunConfig& c) -> float& { return c.log.spike_factor; }, FRange::above_one),
           float_leaf("divergence_factor", [](RunConfig& c) -> float& { return c.log.divergence_factor; }, FRange::above_one),
           float_leaf("bias_avg_beta", [](RunConfig& c) -> float& { return c.log.bias_avg_beta; }, FRange::unit),
           enum_leaf<OnNonfinite>("on_nonfinite", [](RunConfig& c) -> OnNonfinite& { return c.log.on_nonfinite; },
                                  {"stop", "continue"}, "on_nonfinite action"),
           int_leaf("flush_every", [](RunConfig& c) -> int& { return c.log.flush_every; }, 1),
           bool_leaf("progress", [](RunConfig& c) -> bool& { return c.log.progress; }),
           since_v2(int_leaf("curvature_every", [](RunConfig& c) -> int& { return c.log.curvature_every; }, 0)),
           since_v2(int_leaf("curvature_iters", [](RunConfig& c) -> int& { return c.log.curvature_iters; }, 1)),
           since_v2(int_leaf("probe_batch", [](RunConfig& c) -> int& { return c.log.probe_batch; }, 0)),
           since_v2(step_list_leaf("snapshot_steps", [](RunConfig& c) -> std::vector<int>& { return c.log.snapshot_steps; })),
           since_v2(int_leaf("snapshot_every", [](RunConfig& c) -> int& { return c.log.snapshot_every; }, 0)),
           since_v2(bool_leaf("snapshot_optimizer", [](RunConfig& c) -> bool& { return c.log.snapshot_optimizer; }))});
  // HDF5 flush period and the progress line change how a run reports, never what it computes.
  // (Curvature and snapshots change no training number either, but they change what the file
  // holds: a run asked for with them is a different run, with its own id.)
  for (Leaf& l : s.back().leaves)
    if (l.key == "flush_every" || l.key == "progress") l.presentation = true;

  top(int_leaf("checkpoint_every", [](RunConfig& c) -> int& { return c.checkpoint_every; }, 0));
  s.push_back({"arms", false, {}});           // lists: parsed and printed by their own code below
  s.push_back({"interventions", false, {}});
  return s;
}

const std::vector<Item>& schema() {
  static const std::vector<Item> s = build_schema();
  return s;
}

const Item* find_item(const std::string& key) {
  for (const Item& it : schema())
    if (it.key == key) return &it;
  return nullptr;
}

const Leaf* find_leaf(const Item& item, const std::string& key) {
  for (const Leaf& l : item.leaves)
    if (l.key == key) return &l;
  return nullptr;
}

std::vector<std::string> item_keys() {
  std::vector<std::string> v;
  for (const Item& it : schema()) v.push_back(it.key);
  return v;
}

std::vector<std::string> leaf_keys(const Item& item) {
  std::vector<std::string> v;
  for (const Leaf& l : item.leaves) v.push_back(l.key);
  return v;
}

const Item& precision_item() { return *find_item("precision"); }

// The keys a precision mapping takes: its leaves and `gemm` (for hints).
std::vector<std::string> precision_keys() {
  std::vector<std::string> v = leaf_keys(precision_item());
  v.emplace_back("gemm");
  return v;
}

// ---- interventions ---------------------------------------------------------------------

const char* const kPresets[] = {"to_fp32",          "skip_ln_quant",    "bump_exponent", "bump_exponent_always",
                                "forward_only",     "bf16_activations", "bf16_weights",  "bf16_fwd_activations",
                                "to_fp32_keep_gamma_q", "snap_gamma", "reset_adam_v", "paper_emulator",
                                "flash_bf16",       "stabilized_softmax", "delta_hp"};
const char* const kInterventionKeys[] = {"name", "at", "apply", "set", "from", "steps"};
const char* const kArmKeys[] = {"name", "apply", "set"};

// Apply one precision field given as a YAML scalar (errors: at value.loc, naming `label`).
void set_precision_field(PrecisionConfig& p, const std::string& key, const YNode& value, const std::string& label) {
  if (key.rfind("rounding.", 0) == 0) {  // one role's rounding
    const std::string role = key.substr(9);
    const int i = rounding_role_index(role);
    if (i < 0)
      fail(value.loc, msg("unknown role ", quoted_excerpt(role), " in ", label, hint_with_list(role, rounding_role_names())));
    role_override(p, kRoles[i]) = parse_rounding_mode(value, label);
    return;
  }
  if (key.rfind("rotation.", 0) == 0) {  // one GEMM's rotation
    const std::string g = key.substr(9);
    const int i = gemm_index(g);
    if (i < 0) fail(value.loc, msg("unknown GEMM '", g, "' in ", label, hint_with_list(g, gemm_names())));
    p.rotation[static_cast<size_t>(i)] = parse_rotation_mode(value, label);
    return;
  }
  if (key.rfind("gemm.", 0) == 0) {  // one GEMM's operand roles (apply_gemm)
    const std::string g = key.substr(5);
    const int i = gemm_index(g);
    if (i < 0) fail(value.loc, msg("unknown GEMM '", g, "' in ", label, hint_with_list(g, gemm_names())));
    apply_gemm(p, i, parse_gemm_format(value, label));
    return;
  }
  const Leaf* leaf = find_leaf(precision_item(), key);
  if (!leaf) fail(value.loc, msg("unknown precision field ", quoted_excerpt(key), " in set", hint_with_list(key, precision_keys())));
  RunConfig tmp;
  tmp.precision = p;
  leaf->set(tmp, value, label);
  p = tmp.precision;
}

std::string precision_field_text(const PrecisionConfig& p, const std::string& key) {
  if (key.rfind("rounding.", 0) == 0) return name(p.rounding_of(kRoles[rounding_role_index(key.substr(9))]));
  if (key.rfind("rotation.", 0) == 0)
    return kRotationNames[static_cast<size_t>(p.rotation[static_cast<size_t>(gemm_index(key.substr(9)))])];
  if (key.rfind("gemm.", 0) == 0) {  // the format apply_gemm gave the GEMM's operands
    const int g = gemm_index(key.substr(5));
    return name(g == 0 ? p.weight : g == 1 ? p.grad : p.grad_wgrad_fmt());
  }
  RunConfig tmp;
  tmp.precision = p;
  return find_leaf(precision_item(), key)->get(tmp);
}

// ---- parsing a tree --------------------------------------------------------------------

struct Parser {
  std::string origin;
  std::map<std::string, YLoc> where;  // dotted key -> where its value came from
  RunConfig cfg;

  std::optional<YLoc> find(const std::string& key) const {
    auto it = where.find(key);
    if (it == where.end()) return std::nullopt;
    return it->second;
  }

  void parse(const YNode& root) {
    if (root.is_null()) return;  // an empty file: all defaults
    if (!root.is_map())
      fail(root.loc, msg("expected a mapping of configuration keys (e.g. `steps: 1000`) at the top level, got ",
                         root.describe()));
    for (const YEntry& e : root.map) {
      const Item* item = find_item(e.key);
      if (!item) {
        std::vector<std::string> valid = item_keys();
        for (const char* k : {"extends", "base", "sweep"}) valid.emplace_back(k);  // read by lab/config/sweep.cpp
        fail(e.key_loc, msg("unknown key ", quoted_excerpt(e.key), " at the top level", did_you_mean(e.key, valid)));
      }
      if (item->key == "interventions") {
        parse_interventions(e.value);
      } else if (item->key == "arms") {
        parse_arms(e.value);
      } else if (!item->section) {
        set_leaf(item->leaves[0], e.value, e.key);
      } else {
        if (e.value.is_null()) continue;  // `model:` with nothing under it
        if (!e.value.is_map())
          fail(e.value.loc, msg(e.key, ": expected a mapping of fields (e.g. ", e.key, ": {", item->leaves[0].key,
                                ": ...}), got ", e.value.describe()));
        const YEntry* gemm = nullptr;
        for (const YEntry& f : e.value.map) {
          if (item->key == "precision" && f.key == "gemm") {
            gemm = &f;  // applied after the role keys, which it must not meet
            continue;
          }
          const Leaf* leaf = find_leaf(*item, f.key);
          if (!leaf)
            fail(f.key_loc, msg("unknown key ", quoted_excerpt(f.key), " in ", e.key,
                                did_you_mean(f.key, item->key == "precision" ? precision_keys() : leaf_keys(*item))));
          set_leaf(*leaf, f.value, e.key + "." + f.key);
        }
        if (gemm) parse_gemm(gemm->value);
      }
    }
  }

  // precision.gemm: each GEMM's format onto its operand roles (apply_gemm). A role key that a
  // gemm entry sets, given in the same precision mapping, is refused: which of the two would
  // hold, and whether the other GEMMs' `same` roles follow it, would be a guess.
  void parse_gemm(const YNode& value) {
    const std::string key = "precision.gemm";
    where[key] = value.loc;
    if (value.is_null()) return;
    if (!value.is_map())
      fail(value.loc, msg(key, ": expected a mapping of GEMMs to formats (e.g. {wgrad: bf16}; GEMMs: ",
                          join(gemm_names()), "), got ", value.describe()));
    std::vector<std::pair<int, NumFmt>> todo;
    for (const YEntry& g : value.map) {
      const int i = gemm_index(g.key);
      if (i < 0) fail(g.key_loc, msg("unknown GEMM '", g.key, "' in ", key, hint_with_list(g.key, gemm_names())));
      const std::string dotted = key + "." + g.key;
      const NumFmt f = parse_gemm_format(g.value, dotted);
      for (const char* role : kGemmRoles[i])
        if (const std::optional<YLoc> at = find(std::string("precision.") + role))
          fail(g.value.loc, msg(dotted, " sets ", gemm_roles_text(i), ", and precision.", role,
                                " is also given (", at->str(), "): keep one of the two"));
      where[dotted] = g.value.loc;
      todo.emplace_back(i, f);
    }
    for (const auto& [i, f] : todo) apply_gemm(cfg.precision, i, f);
  }

  void set_leaf(const Leaf& leaf, const YNode& value, const std::string& dotted) {
    leaf.set(cfg, value, dotted);
    where[dotted] = value.loc;
  }

  // A preset, or several joined by '+' (applied left to right, e.g. snap_gamma+to_fp32).
  static std::string parse_preset(const YNode& value, const std::string& key) {
    std::vector<std::string> names = {"none"};
    for (const char* p : kPresets) names.emplace_back(p);
    const std::string text = need_scalar(value, key, "a preset name");
    if (text.find('+') == std::string::npos) {
      const size_t k = parse_choice(value, key, names, "preset");
      return k == 0 ? "" : names[k];
    }
    for (const std::string& part : preset_parts(text))
      if (part == "none" || std::find(names.begin(), names.end(), part) == names.end())
        fail(value.loc, msg(key, ": unknown preset ", quoted_excerpt(part), " in ", quoted_excerpt(text), hint_with_list(part, intervention_presets())));
    return text;
  }

  // A patch's `set:` mapping of precision fields. Each value is validated now and stored as
  // canonical text (so equal patches print and hash equally). `rounding: {grad: M}` is stored
  // as the field `rounding.grad` (a role's rounding alone).
  static void parse_patch_set(const YNode& value, const std::string& key, std::map<std::string, std::string>& set) {
    if (value.is_null()) return;
    if (!value.is_map())
      fail(value.loc, msg(key, ": expected a mapping of precision fields (e.g. {activation: bf16}), got ",
                          value.describe()));
    for (const YEntry& f : value.map) {
      if (f.key == "gemm") {  // stored as the fields gemm.<GEMM>, applied by apply_intervention
        if (f.value.is_null()) continue;
        if (!f.value.is_map())
          fail(f.value.loc, msg(key, ".gemm: expected a mapping of GEMMs to formats (e.g. {wgrad: bf16}), got ",
                                f.value.describe()));
        for (const YEntry& g : f.value.map) {
          PrecisionConfig scratch;
          const std::string field = "gemm." + g.key;
          set_precision_field(scratch, field, g.value, key + "." + field);
          set[field] = precision_field_text(scratch, field);
        }
        continue;
      }
      if ((f.key == "rounding" || f.key == "rotation") && f.value.is_map()) {  // stored per role / per GEMM
        for (const YEntry& r : f.value.map) {
          PrecisionConfig scratch;
          const std::string field = f.key + "." + r.key;
          set_precision_field(scratch, field, r.value, key + "." + field);
          set[field] = precision_field_text(scratch, field);
        }
        continue;
      }
      if (!find_leaf(precision_item(), f.key) && f.key.rfind("rounding.", 0) != 0 && f.key.rfind("gemm.", 0) != 0 &&
          f.key.rfind("rotation.", 0) != 0)
        fail(f.key_loc, msg("unknown precision field ", quoted_excerpt(f.key), " in ", key,
                            hint_with_list(f.key, precision_keys())));
      PrecisionConfig scratch;
      set_precision_field(scratch, f.key, f.value, key + "." + f.key);
      set[f.key] = precision_field_text(scratch, f.key);
    }
  }

  void parse_arms(const YNode& list) {
    cfg.arms.clear();
    if (list.is_null()) return;
    if (!list.is_seq())
      fail(list.loc, msg("arms: expected a list of {name, apply, set} entries, got ", list.describe()));
    const std::vector<std::string> keys(std::begin(kArmKeys), std::end(kArmKeys));
    for (size_t i = 0; i < list.seq.size(); ++i) {
      const YNode& n = list.seq[i];
      const std::string label = msg("arms[", i, "]");
      if (!n.is_map())
        fail(n.loc, msg(label, ": expected a mapping like {name: nearest_even, set: {rounding: nearest_even}}, got ",
                        n.describe()));
      ArmConfig arm;
      where[label] = n.loc;
      for (const YEntry& e : n.map) {
        const std::string key = label + "." + e.key;
        if (e.key == "name") arm.name = need_scalar(e.value, key, "a name");
        else if (e.key == "apply") arm.apply = parse_preset(e.value, key);
        else if (e.key == "set") parse_patch_set(e.value, key, arm.set);
        else fail(e.key_loc, msg("unknown key ", quoted_excerpt(e.key), " in ", label, did_you_mean(e.key, keys)));
        where[key] = e.value.loc;
      }
      if (!n.find("name")) fail(n.loc, msg(label, ": missing 'name' (it names the arm's group trajectories/<name>)"));
      cfg.arms.push_back(std::move(arm));
    }
  }

  void parse_interventions(const YNode& list) {
    cfg.interventions.clear();
    if (list.is_null()) return;
    if (!list.is_seq())
      fail(list.loc, msg("interventions: expected a list of {name, at, apply, set} entries, got ", list.describe()));
    const std::vector<std::string> keys(std::begin(kInterventionKeys), std::end(kInterventionKeys));
    for (size_t i = 0; i < list.seq.size(); ++i) {
      const YNode& n = list.seq[i];
      const std::string label = msg("interventions[", i, "]");
      if (!n.is_map())
        fail(n.loc, msg(label, ": expected a mapping like {name: fp32_early, at: 4500, apply: to_fp32}, got ",
                        n.describe()));
      InterventionConfig iv;
      where[label] = n.loc;
      for (const YEntry& e : n.map) {
        const std::string key = label + "." + e.key;
        if (e.key == "name") {
          iv.name = need_scalar(e.value, key, "a name");
        } else if (e.key == "at") {
          iv.at = parse_int(e.value, key);
        } else if (e.key == "apply") {
          iv.apply = parse_preset(e.value, key);
        } else if (e.key == "set") {
          parse_patch_set(e.value, key, iv.set);
        } else if (e.key == "from") {
          iv.from = need_scalar(e.value, key, "an arm name or fp32");
        } else if (e.key == "steps") {
          iv.steps = parse_int(e.value, key);
        } else {
          fail(e.key_loc, msg("unknown key ", quoted_excerpt(e.key), " in ", label, did_you_mean(e.key, keys)));
        }
        where[key] = e.value.loc;
      }
      if (!n.find("name")) fail(n.loc, msg(label, ": missing 'name' (it labels the branch in the output)"));
      if (!n.find("at")) fail(n.loc, msg(label, ": missing 'at' (the step the patch applies from)"));
      cfg.interventions.push_back(std::move(iv));
    }
  }
};

// Roles that are MX under this policy.
std::vector<std::string> mx_roles(const PrecisionConfig& p) {
  std::vector<std::string> roles;
  if (is_mx(p.weight)) roles.push_back("weight");
  if (is_mx(p.activation)) roles.push_back("activation");
  if (is_mx(p.grad)) roles.push_back("grad");
  if (is_mx(p.weight_bwd_fmt())) roles.push_back("weight_bwd");
  if (is_mx(p.activation_bwd_fmt())) roles.push_back("activation_bwd");
  if (p.grad_wgrad && is_mx(*p.grad_wgrad)) roles.push_back("grad_wgrad");  // `same`: listed as grad
  if (is_mx(p.ln_affine)) roles.push_back("ln_affine");
  return roles;
}

// Why the attention or norm settings of `cfg` cannot run under policy `p`, or "" (the model
// checks the same shapes again, lab/model/mlp.cpp; here they get a file and line).
// The emulator's op compositions (precision.layernorm, gelu, residual, bias, ln_beta_grad) exist
// for the paper's network: MLP blocks, layernorm or no norm.
std::string emulator_ops_problem(const RunConfig& cfg, const PrecisionConfig& p, std::string* key) {
  const bool any = p.layernorm != LnOps::fused || p.gelu != GeluOps::fused || p.residual != ResidualPrec::elementwise ||
                   p.bias != BiasPrec::fp32 || !p.ln_beta_grad;
  if (!any) return "";
  const char* which = p.layernorm != LnOps::fused ? "precision.layernorm"
                      : p.gelu != GeluOps::fused  ? "precision.gelu"
                      : p.residual != ResidualPrec::elementwise ? "precision.residual"
                      : p.bias != BiasPrec::fp32 ? "precision.bias"
                                                 : "precision.ln_beta_grad";
  if (cfg.model.block == BlockKind::attention || cfg.teacher.block == BlockKind::attention) {
    *key = "model.block";
    return msg(which, ": the emulator's op compositions are implemented for MLP blocks only: use model.block: mlp "
               "and teacher.block: mlp, or leave ", which, " at its default");
  }
  const NormKind norm = cfg.model.effective_norm();
  if (norm == NormKind::rmsnorm || norm == NormKind::mxnorm) {
    *key = "model.norm";
    return msg(which, ": the emulator's op compositions are implemented for layernorm (or no norm), not model.norm: ",
               norm == NormKind::rmsnorm ? "rmsnorm" : "mxnorm", ": use model.norm: layernorm or leave ", which,
               " at its default");
  }
  if (p.residual == ResidualPrec::fp32 && norm == NormKind::layernorm && p.layernorm != LnOps::vector) {
    *key = "precision.residual";
    return "precision.residual: fp32 needs precision.layernorm: vector (that layernorm rounds its FP32 input as it "
           "reads it; the fused one expects a rounded input)";
  }
  return "";
}

// Why the attention numerics of policy `p` cannot run on `cfg`'s model, or "" (lab/model/README.md,
// "Flash attention in bf16").
std::string attention_problem(const RunConfig& cfg, const PrecisionConfig& p, std::string* key) {
  if (!p.flash()) {
    *key = "precision.attention";
    if (p.attention_softmax != AttnSoftmax::standard)
      return "precision.attention_softmax: stabilized changes the flash kernel's online softmax: it needs "
             "precision.attention: flash_bf16 (under exact attention it would change nothing)";
    if (p.attention_delta != AttnDelta::lp)
      return "precision.attention_delta: hp chooses the O of the flash kernel's backward delta: it needs "
             "precision.attention: flash_bf16 (under exact attention it would change nothing)";
    return "";
  }
  *key = "precision.attention";
  if (cfg.model.block != BlockKind::attention)
    return "precision.attention: flash_bf16 computes the attention sub-block: it needs model.block: attention";
  for (const auto& [role, f] : {std::pair<const char*, const std::optional<NumFmt>&>{"attn_logits", p.attn_logits},
                                {"attn_probs", p.attn_probs}})
    if (f && *f != NumFmt::bf16)
      return msg("precision.", role, ": ", name(*f), " names a format for an attention GEMM operand, but under "
                 "precision.attention: flash_bf16 the flash kernel holds Q, K, P-bar and V in bf16: leave ", role,
                 " at same (or bf16)");
  return "";
}

// Why data.kind, the loss and the data keys do not go together, or "".
std::string data_problem(const RunConfig& cfg, std::string* key) {
  const bool tokens = cfg.data.kind == DataKind::tokens;
  if (tokens && cfg.loss != LossKind::xent) {
    *key = "loss";
    return "data.kind: tokens trains on the next token: it needs loss: xent";
  }
  if (!tokens && cfg.loss == LossKind::xent) {
    *key = "loss";
    return "loss: xent is the next-token cross-entropy: it needs data.kind: tokens (use mse or kl for the teacher's "
           "targets)";
  }
  if (tokens && cfg.data.mx_teacher_targets) {
    *key = "data.mx_teacher_targets";
    return "data.mx_teacher_targets: token data has no teacher: drop it or use data.kind: gaussian";
  }
  if (tokens && cfg.log.curvature_every > 0) {
    *key = "log.curvature_every";
    return "log.curvature_every: the curvature instrument has no embedding or cross-entropy (data.kind: tokens): set "
           "log.curvature_every: 0";
  }
  return "";
}

std::string model_problem(const RunConfig& cfg, const PrecisionConfig& p, std::string* key) {
  const ModelConfig& m = cfg.model;
  const bool student_attn = m.block == BlockKind::attention;
  if ((student_attn || cfg.teacher.block == BlockKind::attention) && m.width % m.heads != 0) {
    *key = "model.heads";
    return msg("model.heads = ", m.heads, " does not divide model.width = ", m.width,
               " (each head takes width / heads features): pick a divisor of ", m.width);
  }
  // The P V GEMM and the backward GEMMs of attention quantize blocks along the sequence; the
  // statistics count them even under an FP32 role, so this holds whatever the formats.
  if (student_attn && p.block_size > 0 && cfg.data.seq_len % p.block_size != 0) {
    *key = "data.seq_len";
    return msg("data.seq_len = ", cfg.data.seq_len, " is not a multiple of precision.block_size = ", p.block_size,
               ", which model.block: attention needs (MX blocks of the attention GEMMs run along the sequence): use "
               "data.seq_len = ", (cfg.data.seq_len / p.block_size + 1) * p.block_size,
               " or a block_size that divides it");
  }
  if (std::string prob = data_problem(cfg, key); !prob.empty()) return prob;
  if (m.causal && !student_attn) {
    *key = "model.causal";
    return "model.causal: true masks the attention sub-block: it needs model.block: attention";
  }
  if (!m.layernorm && (m.norm == NormKind::rmsnorm || m.norm == NormKind::mxnorm)) {
    *key = "model.norm";
    return msg("model.norm: ", m.norm == NormKind::rmsnorm ? "rmsnorm" : "mxnorm",
               " contradicts model.layernorm: false (which removes the norm): drop `layernorm: false`, or write "
               "`norm: none` for no norm");
  }
  if (m.effective_norm() == NormKind::mxnorm) {
    if (m.width % m.mxnorm_block != 0) {
      *key = "model.mxnorm_block";
      return msg("model.width = ", m.width, " is not a multiple of model.mxnorm_block = ", m.mxnorm_block,
                 " (MXNorm's blocks run along the width)");
    }
    if (is_mx(p.activation) && p.block_size != m.mxnorm_block) {
      *key = "model.mxnorm_block";
      return msg("model.mxnorm_block = ", m.mxnorm_block, " differs from precision.block_size = ", p.block_size,
                 ": MXNorm reuses the block absmaxes of the MX cast of its output, so the blocks must be the same; "
                 "set both to one of 16, 32, 64");
    }
  }
  // precision.rotation: the reduction length of every GEMM it rotates, a multiple of the block (the
  // passes check the same, lab/model/mlp.h rotation_problem); the teacher's forward GEMMs too when
  // the MX targets run it under this policy.
  if (p.rotates(Gemm::fprop) || p.rotates(Gemm::dgrad) || p.rotates(Gemm::wgrad)) {
    std::string problem;
    try {
      problem = rotation_problem(NetShape::student(m, cfg.data.seq_len), cfg.tokens(), p, true);
      if (problem.empty() && cfg.data.mx_teacher_targets)
        problem = rotation_problem(NetShape::teacher(m, cfg.teacher, cfg.data.seq_len), cfg.tokens(), p, false);
    } catch (const Error& e) {
      problem = e.what();
    }
    if (!problem.empty()) {
      *key = "precision.rotation";
      return problem;
    }
  }
  if (std::string prob = attention_problem(cfg, p, key); !prob.empty()) return prob;
  return emulator_ops_problem(cfg, p, key);
}

// Why (width, policy) is impossible, or "".
std::string shape_problem(int width, const PrecisionConfig& p) {
  const std::vector<std::string> roles = mx_roles(p);
  if (roles.empty() || p.block_size <= 0 || width % p.block_size == 0) return "";
  const int k = p.block_size;
  const int below = width / k * k, above = below + k;
  return msg("model.width = ", width, " is not a multiple of precision.block_size = ", k, ", which the MX role",
             roles.size() > 1 ? "s " : " ", join(roles), " need", roles.size() > 1 ? "" : "s",
             " (MX blocks run along the width): use model.width = ", below > 0 ? msg(below, " or ") : std::string(), above,
             ", or a block_size that divides ", width);
}

// `find(key)` says where a dotted key was given, if it was; `origin` stands for the rest.
using Finder = std::function<std::optional<YLoc>(const std::string&)>;

// Range checks of the precision fields and the shape check, for a patched policy.
void check_patched_policy(const RunConfig& cfg, const PrecisionConfig& patched, const std::string& who,
                          const YLoc& where) {
  RunConfig tmp = cfg;
  tmp.precision = patched;
  for (const Leaf& leaf : precision_item().leaves) {
    if (!leaf.check) continue;
    const std::string problem = leaf.check(tmp);
    if (!problem.empty()) fail(where, msg(who, ": precision.", leaf.key, " ", problem));
  }
  const std::string problem = shape_problem(cfg.model.width, patched);
  if (!problem.empty()) fail(where, msg(who, ": ", problem));
  std::string key;
  const std::string model_prob = model_problem(cfg, patched, &key);
  if (!model_prob.empty()) fail(where, msg(who, ": ", model_prob));
}

void validate_impl(const RunConfig& cfg, const Finder& find, const std::string& origin) {
  auto locate = [&](const std::string& key) { return find(key).value_or(YLoc{origin, 0}); };
  for (const Item& item : schema())
    for (const Leaf& leaf : item.leaves) {
      if (!leaf.check) continue;
      const std::string dotted = item.section ? item.key + "." + leaf.key : leaf.key;
      const std::string problem = leaf.check(cfg);
      if (!problem.empty()) fail(locate(dotted), dotted + " " + problem);
    }
  if (cfg.schedule.lr_min > cfg.optimizer.lr)
    fail(locate("schedule.lr_min"), msg("schedule.lr_min = ", fmt_float(cfg.schedule.lr_min),
                                        " is above optimizer.lr = ", fmt_float(cfg.optimizer.lr),
                                        ": the cosine floor must not exceed the peak learning rate"));
  {
    const std::string problem = shape_problem(cfg.model.width, cfg.precision);
    if (!problem.empty()) {
      fail(find("model.width").value_or(locate("precision.block_size")), problem);
    }
  }
  if (cfg.log.curvature_every > 0 && !curvature_supported(cfg.model))
    fail(locate("log.curvature_every"),
         msg("log.curvature_every: the curvature instrument's Hessian-vector products cover the MLP block with "
             "layernorm or no norm (lab/model/README.md, \"Stability instruments\"), not this model.block / "
             "model.norm: set log.curvature_every: 0"));
  for (int st : cfg.log.snapshot_steps)
    if (st > cfg.steps)
      fail(locate("log.snapshot_steps"), msg("log.snapshot_steps holds step ", st, ", after the run's last (steps = ",
                                             cfg.steps, "): snapshots are taken at the start of a step, or at `steps` "
                                             "for the final state"));
  {
    std::string key;
    const std::string problem = model_problem(cfg, cfg.precision, &key);
    if (!problem.empty()) fail(find(key).value_or(locate("precision.block_size")), problem);
  }
  // Arms: plain unique names (they name groups; not the reserved `fp32`, lab/config/names.h),
  // patches that apply and give a possible shape.
  std::map<std::string, std::string> taken;  // name -> "arms[i]" / "interventions[i]"
  for (size_t i = 0; i < cfg.arms.size(); ++i) {
    const ArmConfig& arm = cfg.arms[i];
    const std::string label = msg("arms[", i, "]");
    auto at_key = [&](const char* k) { return find(label + "." + k).value_or(locate(label)); };
    if (const std::string p = arm_name_problem(arm.name); !p.empty())
      fail(at_key("name"), msg(label, ".name ", quoted_name(arm.name), " ", p));
    if (auto it = taken.find(arm.name); it != taken.end())
      fail(at_key("name"), msg("duplicate arm name '", arm.name, "' (also ", it->second, "): arm names must be unique"));
    taken[arm.name] = label;
    PrecisionConfig patched;
    try {
      patched = apply_intervention(cfg.precision, {arm.name, 0, arm.apply, arm.set});
    } catch (const Error& e) {
      fail(locate(label), e.what());
    }
    check_patched_policy(cfg, patched, msg("arm '", arm.name, "'"), at_key("set"));
  }
  const std::vector<ResolvedArm> arms = resolved_arms(cfg);
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < cfg.interventions.size(); ++i) {
    const InterventionConfig& iv = cfg.interventions[i];
    const std::string label = msg("interventions[", i, "]");
    auto at_key = [&](const char* k) { return find(label + "." + k).value_or(locate(label)); };
    if (const std::string p = branch_name_problem(iv.name); !p.empty())
      fail(at_key("name"), msg(label, ".name ", quoted_name(iv.name), " ", p));
    if (const std::string p = plain_name_problem(iv.from); !p.empty())
      fail(at_key("from"), msg(label, ".from ", quoted_name(iv.from), " ", p));
    if (auto it = seen.find(iv.name); it != seen.end()) {
      const std::optional<YLoc> first = find(msg("interventions[", it->second, "].name"));
      fail(at_key("name"), msg("duplicate intervention name '", iv.name, "' (also interventions[", it->second, "]",
                               first && first->line > 0 ? msg(" at line ", first->line) : std::string(),
                               "): names label the output branches and must be unique"));
    }
    seen[iv.name] = i;
    if (iv.at < 1 || iv.at >= cfg.steps)
      fail(at_key("at"), msg("intervention '", iv.name, "': at = ", iv.at, " is outside [1, steps) = [1, ", cfg.steps,
                             "): a branch needs at least one step before and one after it"));
    if (iv.steps < 0 || (iv.steps > 0 && iv.steps > cfg.steps - iv.at))
      fail(at_key("steps"), msg("intervention '", iv.name, "': steps = ", iv.steps, " is outside [1, steps - at] = [1, ",
                                cfg.steps - iv.at, "]: give the number of steps the branch trains from `at`, or ",
                                "leave `steps` out to train it to the run's end"));
    const bool from_fp32 = iv.from == kFp32Name;
    // From the FP32 trajectory, `precision` unpatched is already a change (the MX recipe).
    if (iv.apply.empty() && iv.set.empty() && !from_fp32)
      fail(locate(label), msg("intervention '", iv.name, "' changes nothing: give `apply: PRESET` and/or `set: {...}`"));
    if (from_fp32 && snaps_gamma(iv))
      fail(at_key("apply"), msg("intervention '", iv.name, "' forks from fp32 and applies snap_gamma, which snaps ",
                                "gamma and beta to an arm's quantized values: the FP32 trajectory has none; drop ",
                                "snap_gamma or fork from an arm"));
    if (auto it = taken.find(iv.name); it != taken.end())
      fail(at_key("name"), msg("intervention name '", iv.name, "' is also the name of ", it->second,
                               ": arms and branches share one namespace of trajectory names"));
    const auto from = std::find_if(arms.begin(), arms.end(), [&](const ResolvedArm& a) { return a.name == iv.from; });
    if (from == arms.end() && !from_fp32) {
      std::vector<std::string> names;
      for (const ResolvedArm& a : arms) names.push_back(a.name);
      fail(at_key("from"), msg("intervention '", iv.name, "' forks from arm '", iv.from, "', which this experiment ",
                               "does not have (arms: ", join(names), "): set `from:` to one of them, or to ",
                               kFp32Name, " (the FP32 trajectory)"));
    }
    PrecisionConfig patched;
    try {
      patched = branch_policy(cfg, iv);
    } catch (const Error& e) {
      fail(locate(label), e.what());
    }
    check_patched_policy(cfg, patched, msg("intervention '", iv.name, "'"), at_key("set"));
  }
}

// ---- printing --------------------------------------------------------------------------

// Whether the canonical text (the run id's input) leaves leaf `l` out.
bool omitted(const Leaf& l, const RunConfig& cfg, bool canonical) {
  if (!canonical) return false;
  if (l.presentation) return true;
  static const RunConfig defaults;
  return l.since_v2 && l.get(cfg) == l.get(defaults);
}

std::string dump_impl(const RunConfig& cfg, bool canonical) {
  std::string out;
  auto set_text = [](const std::map<std::string, std::string>& set) {
    std::string t = "{";
    for (const auto& [k, v] : set) t += (t.size() > 1 ? ", " : "") + k + ": " + YNode::scalar(v, {}).flow();
    return t + "}";
  };
  for (const Item& item : schema()) {
    if (item.key == "arms") {
      // Added after schema 1: an empty list is left out of the canonical text (run ids).
      if (cfg.arms.empty()) {
        if (!canonical) out += "arms: []\n";
        continue;
      }
      out += "arms:\n";
      for (const ArmConfig& a : cfg.arms) {
        out += "  - name: " + yaml_quote(a.name) + "\n";
        out += "    apply: " + (a.apply.empty() ? std::string("none") : a.apply) + "\n";
        out += "    set: " + set_text(a.set) + "\n";
      }
      continue;
    }
    if (item.key == "interventions") {
      if (cfg.interventions.empty()) {
        out += "interventions: []\n";
        continue;
      }
      out += "interventions:\n";
      for (const InterventionConfig& iv : cfg.interventions) {
        out += "  - name: " + yaml_quote(iv.name) + "\n";
        out += "    at: " + std::to_string(iv.at) + "\n";
        out += "    apply: " + (iv.apply.empty() ? std::string("none") : iv.apply) + "\n";
        out += "    set: " + set_text(iv.set) + "\n";
        if (!canonical || iv.from != kDefaultArmName) out += "    from: " + yaml_quote(iv.from) + "\n";
        // Added later: left out at its default (the run's end), so that the text of every
        // configuration without it (and its run id) is what it was before.
        if (iv.steps != 0) out += "    steps: " + std::to_string(iv.steps) + "\n";
      }
      continue;
    }
    if (!item.section) {
      const Leaf& l = item.leaves[0];
      if (!omitted(l, cfg, canonical)) out += l.key + ": " + l.get(cfg) + "\n";
      continue;
    }
    std::string body;
    for (const Leaf& l : item.leaves)
      if (!omitted(l, cfg, canonical)) body += "  " + l.key + ": " + l.get(cfg) + "\n";
    // A section whose every leaf is left out (one added after schema 1, at its defaults)
    // leaves no header either: the canonical text is then exactly the schema-1 text.
    if (!body.empty() || !canonical) out += item.key + ":\n" + body;
  }
  return out;
}

}  // namespace

// ---- public API ------------------------------------------------------------------------

const char* act_name(Act a) {
  if (a == Act::gelu_vector) return "gelu_vector";  // a pass's substitute, never configured
  return kActNames[static_cast<int>(a)];
}

std::vector<std::string> intervention_presets() { return {std::begin(kPresets), std::end(kPresets)}; }

PrecisionConfig branch_policy(const RunConfig& cfg, const InterventionConfig& iv) {
  if (iv.from == kFp32Name) return apply_intervention(cfg.precision, iv);
  for (const ResolvedArm& a : resolved_arms(cfg))
    if (a.name == iv.from) return apply_intervention(a.policy, iv);
  throw Error(msg("intervention '", iv.name, "' forks from '", iv.from, "', which is neither an arm nor ", kFp32Name));
}

std::vector<ResolvedArm> resolved_arms(const RunConfig& cfg) {
  if (cfg.arms.empty()) return {{kDefaultArmName, cfg.precision}};
  std::vector<ResolvedArm> v;
  for (const ArmConfig& a : cfg.arms) v.push_back({a.name, apply_intervention(cfg.precision, {a.name, 0, a.apply, a.set})});
  return v;
}

// The emulator's op fields, only where they differ from the defaults (so that the description of
// every policy without them is what it was before they existed).
static std::string emulator_ops_text(const PrecisionConfig& p) {
  std::string s;
  if (p.layernorm != LnOps::fused) s += " layernorm=vector";
  if (p.gelu != GeluOps::fused) s += p.gelu == GeluOps::vector ? " gelu=vector" : " gelu=vector_teacher";
  if (p.residual != ResidualPrec::elementwise) s += " residual=fp32";
  if (p.bias != BiasPrec::fp32) s += " bias=elementwise";
  if (!p.ln_beta_grad) s += " ln_beta_grad=false";
  return s;
}

// precision.rotation and its block, only where a GEMM's rotation is not none (likewise).
static std::string rotation_policy_text(const PrecisionConfig& p) {
  if (p.rotation[0] == Rotation::none && p.rotation[1] == Rotation::none && p.rotation[2] == Rotation::none) return "";
  std::string r = rotation_text(p);  // one word, or "{fprop: M, dgrad: M, wgrad: M}" written without spaces
  r.erase(std::remove(r.begin(), r.end(), ' '), r.end());
  return msg(" rotation=", r, " rotation_block=", p.rotation_block);
}

// The attention numerics, only under flash_bf16 (the description of every exact policy is what it
// was before they existed).
static std::string attention_text(const PrecisionConfig& p) {
  if (!p.flash()) return "";
  std::string s = msg(" attention=flash_bf16 attention_tile=", p.attention_tile_r, "x", p.attention_tile_c);
  if (p.attention_softmax == AttnSoftmax::stabilized)
    s += msg(" attention_softmax=stabilized attention_beta=", fmt_float(p.attention_beta),
             " attention_eps=", fmt_float(p.attention_eps));
  if (p.attention_delta == AttnDelta::hp) s += " attention_delta=hp";
  return s;
}

std::string describe_policy(const PrecisionConfig& p) {
  using R = PrecisionConfig::Role;
  const bool own_wgrad_mode = p.rounding_of(R::grad_wgrad) != p.rounding_of(R::grad);
  const std::string rounding =
      p.rounding_uniform() ? std::string(name(p.rounding_of(R::weight)))
                           : msg("weight:", name(p.rounding_of(R::weight)), ",activation:", name(p.rounding_of(R::activation)),
                                 ",grad:", name(p.rounding_of(R::grad)), ",ln_affine:", name(p.rounding_of(R::ln_affine)),
                                 own_wgrad_mode ? msg(",grad_wgrad:", name(p.rounding_of(R::grad_wgrad))) : std::string());
  return msg("weight=", name(p.weight), " activation=", name(p.activation), " grad=", name(p.grad),
             " weight_bwd=", name(p.weight_bwd_fmt()), " activation_bwd=", name(p.activation_bwd_fmt()),
             " grad_wgrad=", name(p.grad_wgrad_fmt()),
             " ln_affine=", p.ln_affine == NumFmt::fp32 ? "none" : name(p.ln_affine),
             " elementwise=", p.elementwise_bf16 ? "bf16" : "fp32", " backward=", p.backward ? "true" : "false",
             " block_size=", p.block_size, " scale_rule=", name(p.scale_rule), " bump=", name(p.bump),
             " rounding=", rounding, " elementwise_rounding=", name(p.elementwise_rounding), emulator_ops_text(p),
             rotation_policy_text(p), attention_text(p));
}

std::string describe_patch(const ArmConfig& arm) { return describe_patch(InterventionConfig{arm.name, 0, arm.apply, arm.set}); }

void set_config_path(YNode& root, const std::vector<std::string>& path, const YNode& value, const YLoc& loc) {
  // precision.rounding.<role> under a one-mode `rounding: M`: spell M out per role first, so
  // that the other roles keep M rather than falling back to the default.
  if (path.size() == 3 && path[0] == "precision" && path[1] == "rounding" && root.is_map())
    if (YEntry* prec = root.find("precision"); prec && prec->value.is_map())
      if (YEntry* r = prec->value.find("rounding"); r && r->value.is_scalar()) {
        YNode m;
        m.kind = YNode::Kind::map;
        m.loc = r->value.loc;
        for (int i = 0; i < kSpelledRoles; ++i) m.map.push_back({kRoundingRoles[i], r->value.loc, r->value});
        r->value = m;
      }
  // precision.rotation.<GEMM> under a one-mode `rotation: M`: the same, per GEMM.
  if (path.size() == 3 && path[0] == "precision" && path[1] == "rotation" && root.is_map())
    if (YEntry* prec = root.find("precision"); prec && prec->value.is_map())
      if (YEntry* r = prec->value.find("rotation"); r && r->value.is_scalar()) {
        YNode m;
        m.kind = YNode::Kind::map;
        m.loc = r->value.loc;
        for (const char* g : kGemmNames) m.map.push_back({g, r->value.loc, r->value});
        r->value = m;
      }
  yaml_set_path(root, path, value, loc);
}

bool curvature_supported(const ModelConfig& m) {
  return m.block == BlockKind::mlp && (m.effective_norm() == NormKind::layernorm || m.effective_norm() == NormKind::none);
}

std::vector<std::string> preset_parts(const std::string& apply) {
  std::vector<std::string> parts;
  if (apply.empty()) return parts;
  size_t start = 0;
  for (;;) {
    const size_t plus = apply.find('+', start);
    parts.push_back(apply.substr(start, plus == std::string::npos ? std::string::npos : plus - start));
    if (plus == std::string::npos) break;
    start = plus + 1;
  }
  return parts;
}

bool has_preset(const InterventionConfig& iv, const std::string& preset) {
  const std::vector<std::string> parts = preset_parts(iv.apply);
  return std::find(parts.begin(), parts.end(), preset) != parts.end();
}

namespace {

void apply_preset(PrecisionConfig& p, const std::string& a, const InterventionConfig& iv) {
  if (a == "to_fp32" || a == "to_fp32_keep_gamma_q") {
    const NumFmt ln_affine = p.ln_affine;
    p.make_fp32();
    // keep_gamma_q: the norm's affine weights stay as the forward pass used them (no
    // change of the function through gamma at the switch).
    if (a == "to_fp32_keep_gamma_q") p.ln_affine = ln_affine;
  } else if (a == "snap_gamma" || a == "reset_adam_v") {
    // A change of state, not of policy, when the branch starts (Trainer::start_branches):
    // snap_gamma sets the stored gamma and beta to their quantized values (also in
    // eval_snapshot); reset_adam_v recalibrates Adam's v on the branch's first gradient.
  } else if (a == "skip_ln_quant") {
    p.ln_affine = NumFmt::fp32;
  } else if (a == "bump_exponent" || a == "bump_exponent_always") {
    p.scale_rule = ScaleRule::floor_bump;
    p.bump = a == "bump_exponent" ? Bump::clamp : Bump::always;
  } else if (a == "forward_only") {
    p.backward = false;
  } else if (a == "bf16_activations") {
    p.activation = NumFmt::bf16;
    p.activation_bwd = NumFmt::bf16;
  } else if (a == "bf16_weights") {
    p.weight = NumFmt::bf16;
    p.weight_bwd = NumFmt::bf16;
  } else if (a == "bf16_fwd_activations") {
    p.activation_bwd = p.activation_bwd_fmt();  // materialise `same` before `activation` changes
    p.activation = NumFmt::bf16;
  } else if (a == "paper_emulator") {
    // The arithmetic of the paper's emulator as its released code composes it (lab/model/README.md,
    // "The paper's emulator"); formats, block size and `backward` stay as configured.
    p.scale_rule = ScaleRule::floor;
    p.bump = Bump::clamp;
    p.rounding = Rounding::nearest_away;
    p.rounding_weight.reset();
    p.rounding_activation.reset();
    p.rounding_grad.reset();
    p.rounding_ln_affine.reset();
    p.elementwise_bf16 = true;
    p.elementwise_rounding = Rounding::nearest_away;
    p.ln_affine = NumFmt::bf16;
    p.layernorm = LnOps::vector;
    p.gelu = GeluOps::vector_teacher;
    p.residual = ResidualPrec::fp32;
    p.bias = BiasPrec::elementwise;
    p.ln_beta_grad = false;
  } else if (a == "flash_bf16" || a == "stabilized_softmax" || a == "delta_hp") {
    // The flash kernel in bf16 (lab/model/README.md, "Flash attention in bf16"); with the paper's
    // stabilized softmax (its Algorithm 3), or with delta from the FP32 O (its Section 3.2 test).
    p.attention = AttnImpl::flash_bf16;
    if (a == "stabilized_softmax") p.attention_softmax = AttnSoftmax::stabilized;
    if (a == "delta_hp") p.attention_delta = AttnDelta::hp;
  } else {
    throw Error(msg("intervention '", iv.name, "': unknown preset '", a, "'", hint_with_list(a, intervention_presets())));
  }
}

}  // namespace

PrecisionConfig apply_intervention(const PrecisionConfig& base, const InterventionConfig& iv) {
  PrecisionConfig p = base;
  for (const std::string& a : preset_parts(iv.apply)) apply_preset(p, a, iv);
  // gemm.<GEMM> fields first, on the policy the presets left (their pins read it), then the
  // other fields; a role a gemm field sets may not be set beside it.
  for (int g = 0; g < kGemmCount; ++g) {
    const std::string gkey = std::string("gemm.") + kGemmNames[g];
    if (!iv.set.count(gkey)) continue;
    for (const char* role : kGemmRoles[g])
      if (iv.set.count(role))
        throw Error(msg("patch '", iv.name, "': set gives ", gkey, " (which sets ", gemm_roles_text(g), ") and ", role,
                        ": keep one of the two"));
  }
  const YLoc loc{msg("intervention '", iv.name, "'"), 0};
  for (const auto& [key, value] : iv.set)
    if (key.rfind("gemm.", 0) == 0) set_precision_field(p, key, YNode::scalar(value, loc), "set." + key);
  for (const auto& [key, value] : iv.set)
    if (key.rfind("gemm.", 0) != 0) set_precision_field(p, key, YNode::scalar(value, loc), "set." + key);
  return p;
}

std::string describe_patch(const InterventionConfig& iv) {
  std::string s = "{";
  if (!iv.apply.empty()) s += "apply: " + iv.apply;
  if (!iv.set.empty()) {
    s += std::string(s.size() > 1 ? ", " : "") + "set: {";
    bool first = true;
    for (const auto& [k, v] : iv.set) {
      s += (first ? "" : ", ") + k + ": " + YNode::scalar(v, {}).flow();
      first = false;
    }
    s += "}";
  }
  return s + "}";
}

std::vector<std::string> config_keys() {
  std::vector<std::string> v;
  for (const Item& item : schema()) {
    if (!item.section) {
      v.push_back(item.key);
      continue;
    }
    for (const Leaf& l : item.leaves) v.push_back(item.key + "." + l.key);
  }
  for (const char* role : kRoundingRoles) v.push_back(std::string("precision.rounding.") + role);
  v.emplace_back("precision.gemm");
  for (const char* g : kGemmNames) v.push_back(std::string("precision.gemm.") + g);
  for (const char* g : kGemmNames) v.push_back(std::string("precision.rotation.") + g);
  return v;
}

void apply_overrides(YNode& root, const std::vector<std::string>& overrides) {
  for (const std::string& o : overrides) {
    const YLoc loc{"--set " + excerpt(o), 0};
    const size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0)
      throw Error(msg(loc.str(), ": expected KEY=VALUE with a dotted key (e.g. --set model.width=256)"));
    const std::string key = o.substr(0, eq);
    const std::vector<std::string> path = split_dotted(key);
    for (const std::string& p : path)
      if (p.empty()) throw Error(msg(loc.str(), ": ", quoted_excerpt(key), " is not a dotted key (e.g. model.width)"));
    // Check the key here, where the whole dotted name can be suggested.
    const Item* item = find_item(path[0]);
    const std::vector<std::string> keys = config_keys();
    const bool known = (item && ((!item->section && path.size() == 1) ||
                                 (item->section && (path.size() == 1 || (path.size() == 2 && find_leaf(*item, path[1])))))) ||
                       std::find(keys.begin(), keys.end(), key) != keys.end();
    if (!known) throw Error(msg(loc.str(), ": unknown key ", quoted_excerpt(key), did_you_mean(key, keys)));
    if (root.is_null()) {
      root.kind = YNode::Kind::map;
      root.loc = loc;
    }
    if (!root.is_map()) return;  // the parser reports the malformed file itself
    set_config_path(root, path, yaml_option_value(o.substr(eq + 1), loc), loc);
  }
}

RunConfig config_from_tree(const YNode& root, const std::string& origin) {
  Parser p;
  p.origin = origin;
  p.parse(root);
  validate_impl(p.cfg, [&](const std::string& key) { return p.find(key); }, origin);
  return p.cfg;
}

namespace {
RunConfig the_only_run(std::vector<ExpandedRun> runs, const std::string& origin) {
  if (runs.size() != 1)
    throw Error(msg(origin, ": this experiment is a sweep of ", runs.size(),
                    " runs, not one configuration: list them with `mxlab plan ", origin, "` and run them with `mxlab run ",
                    origin, "` (in code: expand_experiment)"));
  return std::move(runs[0].cfg);
}
}  // namespace

RunConfig config_from_yaml_string(const std::string& text, const std::string& origin_name,
                                  const std::vector<std::string>& overrides) {
  return the_only_run(expand_experiment_string(text, origin_name, overrides), origin_name);
}

RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  return the_only_run(expand_experiment(path, overrides), path);
}

void validate_config(const RunConfig& cfg) {
  validate_impl(cfg, [](const std::string&) { return std::optional<YLoc>(); }, "config");
}

std::string dump_config(const RunConfig& cfg) { return dump_impl(cfg, false); }

std::string canonical_config_text(const RunConfig& cfg) { return dump_impl(cfg, true); }

std::string config_hash(const RunConfig& cfg) {
  // FNV-1a, 64 bit (offset basis and prime from the published parameters).
  constexpr uint64_t kFnvOffset = 14695981039346656037ull;
  constexpr uint64_t kFnvPrime = 1099511628211ull;
  uint64_t h = kFnvOffset;
  for (unsigned char c : canonical_config_text(cfg)) {
    h ^= c;
    h *= kFnvPrime;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%012llx", static_cast<unsigned long long>(h >> 16));  // top 48 bits
  return buf;
}

// ---- equality --------------------------------------------------------------------------

bool operator==(const DataConfig& a, const DataConfig& b) {
  return a.batch == b.batch && a.label_noise == b.label_noise && a.seq_len == b.seq_len &&
         a.mx_teacher_targets == b.mx_teacher_targets && a.kind == b.kind && a.vocab == b.vocab;
}
bool operator==(const OptimizerConfig& a, const OptimizerConfig& b) {
  return a.name == b.name && a.lr == b.lr && a.beta1 == b.beta1 && a.beta2 == b.beta2 && a.eps == b.eps &&
         a.weight_decay == b.weight_decay && a.momentum == b.momentum;
}
bool operator==(const ScheduleConfig& a, const ScheduleConfig& b) {
  return a.name == b.name && a.warmup == b.warmup && a.lr_min == b.lr_min;
}
bool operator==(const LogConfig& a, const LogConfig& b) {
  return a.log_every == b.log_every && a.bias_every == b.bias_every && a.spike_factor == b.spike_factor &&
         a.divergence_factor == b.divergence_factor && a.bias_avg_beta == b.bias_avg_beta &&
         a.on_nonfinite == b.on_nonfinite && a.flush_every == b.flush_every && a.progress == b.progress &&
         a.curvature_every == b.curvature_every && a.curvature_iters == b.curvature_iters &&
         a.probe_batch == b.probe_batch && a.snapshot_steps == b.snapshot_steps &&
         a.snapshot_every == b.snapshot_every && a.snapshot_optimizer == b.snapshot_optimizer;
}
bool operator==(const InterventionConfig& a, const InterventionConfig& b) {
  return a.name == b.name && a.at == b.at && a.apply == b.apply && a.set == b.set && a.from == b.from &&
         a.steps == b.steps;
}
bool operator==(const ArmConfig& a, const ArmConfig& b) {
  return a.name == b.name && a.apply == b.apply && a.set == b.set;
}
bool operator==(const RunConfig& a, const RunConfig& b) {
  return a.name == b.name && a.seed == b.seed && a.steps == b.steps && a.device == b.device && a.model == b.model &&
         a.teacher == b.teacher && a.data == b.data && a.loss == b.loss && a.kl_temperature == b.kl_temperature &&
         a.optimizer == b.optimizer && a.schedule == b.schedule && a.precision == b.precision && a.log == b.log &&
         a.checkpoint_every == b.checkpoint_every && a.arms == b.arms && a.interventions == b.interventions;
}

}  // namespace mxlab
