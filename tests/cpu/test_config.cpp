// The configuration contract: defaults, dump -> load round trips, --set overrides, the
// messages for bad input (file, line, key, suggestion), run ids, intervention presets and the
// `mxlab dump-config` command.
#include <gtest/gtest.h>

#include <algorithm>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <fstream>
#include <random>
#include <sstream>
#include <set>
#include <string>
#include <vector>

#include <sys/wait.h>

#include "lab/core/error.h"
#include "lab/config/config_io.h"
#include "lab/config/sweep.h"
#include "tests/cpu/test_util.h"

using namespace mxlab;

namespace {


using mxlab::test::TempDir;
using mxlab::test::read_file;
using mxlab::test::run_command;


// The message of the mxlab::Error thrown by f, or "" (and a test failure) if none.
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an mxlab::Error";
  return "";
}

// A configuration with every field different from its default.
RunConfig every_field_changed() {
  RunConfig c;
  c.name = "changed run: all";  // needs quoting in YAML
  c.seed = 18446744073709551615ull;
  c.steps = 777;
  c.device = "cuda:1";
  c.model.depth = 3;
  c.model.width = 96;
  c.model.hidden_mult = 2;
  c.model.activation = Act::swiglu;
  c.model.layernorm = false;
  c.model.ln_affine = false;
  c.model.ln_eps = 1e-6f;
  c.model.fc2_bias = false;
  c.model.init = InitKind::xavier_normal;
  c.model.init_gain = 0.7071067811865476f;
  c.model.block = BlockKind::attention;
  c.model.heads = 3;
  c.model.norm = NormKind::none;  // layernorm: false names no other norm
  c.model.mxnorm_p = 1;
  c.model.mxnorm_block = 64;
  c.model.causal = true;
  c.teacher.block = BlockKind::attention;
  c.data.seq_len = 16;             // a multiple of block_size (attention)
  c.precision.attn_logits = NumFmt::bf16;  // the flash kernel's (flash_bf16 takes same or bf16)
  c.precision.attn_probs = NumFmt::bf16;
  c.precision.attention = AttnImpl::flash_bf16;
  c.precision.attention_tile_r = 16;
  c.precision.attention_tile_c = 8;
  c.precision.attention_softmax = AttnSoftmax::stabilized;
  c.precision.attention_beta = 4.0f;
  c.precision.attention_eps = 0.0625f;
  c.precision.attention_delta = AttnDelta::hp;
  c.teacher.depth = 2;
  c.teacher.width = 48;
  c.teacher.activation = Act::relu;
  c.teacher.residual = true;
  c.data.batch = 333;
  c.data.label_noise = 0.1f;
  c.data.mx_teacher_targets = true;
  c.loss = LossKind::kl;
  c.kl_temperature = 2.5f;
  c.optimizer.name = OptKind::sgd;
  c.optimizer.lr = 3.3333333e-3f;
  c.optimizer.beta1 = 0.8f;
  c.optimizer.beta2 = 0.95f;
  c.optimizer.eps = 1e-12f;
  c.optimizer.weight_decay = 0.01f;
  c.optimizer.momentum = 0.9f;
  c.schedule.name = SchedKind::cosine;
  c.schedule.warmup = 50;
  c.schedule.lr_min = 1e-5f;
  c.precision.weight = NumFmt::mxfp6_e2m3;
  c.precision.activation = NumFmt::mxfp4_e2m1;
  c.precision.grad = NumFmt::mxfp8_e5m2;
  c.precision.weight_bwd = NumFmt::mxint8;
  c.precision.activation_bwd = NumFmt::fp16;
  c.precision.grad_wgrad = NumFmt::mxfp4_e2m1;
  c.precision.ln_affine = NumFmt::bf16;
  c.precision.elementwise_bf16 = false;
  c.precision.backward = false;
  c.precision.block_size = 16;
  c.precision.scale_rule = ScaleRule::floor_bump;
  c.precision.bump = Bump::always;
  c.precision.rounding = Rounding::stochastic;
  c.precision.elementwise_rounding = Rounding::nearest_away;
  c.precision.diagnostic_format = NumFmt::mxfp6_e3m2;
  c.precision.rotation = {Rotation::random_hadamard, Rotation::none, Rotation::hadamard};  // printed as a mapping
  c.precision.rotation_block = 16;  // divides every rotated K here (d = 96, H = 128, the teacher's 96)
  c.log.log_every = 7;
  c.log.bias_every = 14;
  c.log.spike_factor = 50.5f;
  c.log.divergence_factor = 3.25f;
  c.log.bias_avg_beta = 0.9f;
  c.log.on_nonfinite = OnNonfinite::cont;
  c.log.flush_every = 5;
  c.log.progress = false;
  // log.curvature_every stays 0: the curvature instrument does not cover attention blocks (a
  // config error); DumpThenLoadGivesTheSameStruct changes it on an MLP config of its own.
  c.log.curvature_iters = 7;
  c.log.probe_batch = 64;
  c.log.snapshot_steps = {3, 100};
  c.log.snapshot_every = 200;
  c.log.snapshot_optimizer = true;
  c.precision.rounding_grad = Rounding::nearest_away;  // per-role: printed as a mapping
  c.precision.rounding_grad_wgrad = Rounding::toward_zero;
  c.checkpoint_every = 100;
  c.arms = {{"even", "", {{"rounding", "nearest_even"}}}, {"grad_away", "skip_ln_quant", {{"rounding.grad", "nearest_away"}}}};
  InterventionConfig a;
  a.name = "fp32_early";
  a.at = 300;
  a.apply = "to_fp32";
  a.from = "even";
  InterventionConfig b;
  b.name = "custom";
  b.at = 400;
  b.set = {{"activation", "bf16"}, {"backward", "true"}, {"weight_bwd", "same"}};
  b.from = "grad_away";
  c.interventions = {a, b};
  return c;
}

// Every leaf line "  key: value" of a dump, keyed by dotted name.
std::map<std::string, std::string> dump_leaves(const std::string& dump) {
  std::map<std::string, std::string> out;
  std::istringstream in(dump);
  std::string line, section;
  while (std::getline(in, line)) {
    if (line.rfind("arms", 0) == 0 || line.rfind("interventions", 0) == 0) break;
    const size_t colon = line.find(':');
    const bool nested = line.rfind("  ", 0) == 0;
    const std::string key = line.substr(nested ? 2 : 0, colon - (nested ? 2 : 0));
    const std::string value = colon + 1 < line.size() ? line.substr(colon + 2) : "";
    if (!nested && value.empty()) {
      section = key;
      continue;
    }
    out[nested ? section + "." + key : key] = value;
  }
  return out;
}

}  // namespace

TEST(Config, EmptyFileGivesTheDefaults) {
  const RunConfig c = config_from_yaml_string("", "empty.yaml");
  EXPECT_TRUE(c == RunConfig{});
  EXPECT_EQ(c.model.width, 512);
  EXPECT_EQ(c.precision.weight, NumFmt::mxfp8_e4m3);
  EXPECT_FALSE(c.precision.weight_bwd.has_value());
  EXPECT_NO_THROW(validate_config(RunConfig{}));
  // A comment-only file and empty sections are defaults too.
  EXPECT_TRUE(config_from_yaml_string("# nothing\nmodel:\nprecision:\n", "c.yaml") == RunConfig{});
}

TEST(Config, ReadsEveryKind) {
  const RunConfig c = config_from_yaml_string(
      "name: quick\nseed: 42\nsteps: 200\ndevice: cpu\n"
      "model: {depth: 2, width: 64, activation: relu, layernorm: false}\n"
      "teacher: {activation: linear}\n"
      "optimizer:\n  name: adamw\n  lr: 1e-3\n  weight_decay: .1\n"
      "precision:\n  weight: bf16\n  activation_bwd: mxfp8_e5m2\n  ln_affine: none\n  elementwise: fp32\n"
      "  scale_rule: floor_bump\n  bump: always\n  rounding: stochastic\n"
      "log: {on_nonfinite: continue, progress: False}\n"
      "interventions:\n  - {name: a, at: 100, apply: skip_ln_quant}\n  - {name: b, at: 150, set: {backward: False}}\n",
      "quick.yaml");
  EXPECT_EQ(c.name, "quick");
  EXPECT_EQ(c.seed, 42u);
  EXPECT_EQ(c.steps, 200);
  EXPECT_EQ(c.device, "cpu");
  EXPECT_EQ(c.model.depth, 2);
  EXPECT_EQ(c.model.activation, Act::relu);
  EXPECT_FALSE(c.model.layernorm);
  EXPECT_EQ(c.teacher.activation, Act::linear);
  EXPECT_EQ(c.optimizer.name, OptKind::adamw);
  EXPECT_EQ(c.optimizer.lr, 1e-3f);
  EXPECT_EQ(c.optimizer.weight_decay, 0.1f);
  EXPECT_EQ(c.precision.weight, NumFmt::bf16);
  EXPECT_EQ(c.precision.weight_bwd_fmt(), NumFmt::bf16);  // same = weight
  EXPECT_EQ(c.precision.activation_bwd, NumFmt::mxfp8_e5m2);
  EXPECT_EQ(c.precision.ln_affine, NumFmt::fp32);
  EXPECT_FALSE(c.precision.elementwise_bf16);
  EXPECT_EQ(c.precision.scale_rule, ScaleRule::floor_bump);
  EXPECT_EQ(c.precision.bump, Bump::always);
  EXPECT_EQ(c.precision.rounding, Rounding::stochastic);
  EXPECT_EQ(c.log.on_nonfinite, OnNonfinite::cont);
  EXPECT_FALSE(c.log.progress);
  ASSERT_EQ(c.interventions.size(), 2u);
  EXPECT_EQ(c.interventions[0].apply, "skip_ln_quant");
  EXPECT_EQ(c.interventions[1].set.at("backward"), "false");  // stored canonically
}

TEST(Config, DumpThenLoadGivesTheSameStruct) {
  const RunConfig d;
  EXPECT_TRUE(config_from_yaml_string(dump_config(d), "dump.yaml") == d);
  const RunConfig c = every_field_changed();
  ASSERT_NO_THROW(validate_config(c));
  const std::string text = dump_config(c);
  const RunConfig back = config_from_yaml_string(text, "dump.yaml");
  EXPECT_TRUE(back == c) << text;
  EXPECT_EQ(dump_config(back), text);
  // The fixture really changes every field: each printed leaf differs from the default's.
  const auto dl = dump_leaves(dump_config(d)), cl = dump_leaves(text);
  ASSERT_EQ(dl.size(), cl.size());
  // Every key but the lists `arms`, `interventions`, the 5 per-role roundings (inside the
  // `rounding` line), precision.gemm with its 3 GEMMs (no field: it sets roles) and the 3 per-GEMM
  // rotations (inside the `rotation` line) is a leaf line.
  EXPECT_EQ(dl.size(), config_keys().size() - 14);
  // Keys the attention fixture cannot change (a config error there) are changed below on MLP
  // configs of their own.
  const std::set<std::string> mlp_only = {"log.curvature_every", "precision.layernorm", "precision.gelu",
                                          "precision.residual", "precision.bias", "precision.ln_beta_grad",
                                          // token data (no teacher: the fixture's mx_teacher_targets and KL loss)
                                          "data.kind", "data.vocab"};
  for (const auto& [k, v] : dl) {
    if (!mlp_only.count(k)) {
      EXPECT_NE(v, cl.at(k)) << k << " is unchanged in every_field_changed()";
    }
  }
  RunConfig emu;  // the paper's emulator's op fields (MLP blocks only)
  emu.precision.layernorm = LnOps::vector;
  emu.precision.gelu = GeluOps::vector_teacher;
  emu.precision.residual = ResidualPrec::fp32;
  emu.precision.bias = BiasPrec::elementwise;
  emu.precision.ln_beta_grad = false;
  const std::string et = dump_config(emu);
  const auto el = dump_leaves(et);
  for (const char* k : {"precision.layernorm", "precision.gelu", "precision.residual", "precision.bias",
                        "precision.ln_beta_grad"})
    EXPECT_NE(el.at(k), dl.at(k)) << k;
  EXPECT_TRUE(config_from_yaml_string(et, "dump.yaml") == emu);
  RunConfig bad_emu = c;
  bad_emu.precision.layernorm = LnOps::vector;
  EXPECT_THROW(validate_config(bad_emu), Error);  // attention: the emulator's ops are MLP-only
  RunConfig tok;  // token data: next-token cross-entropy
  tok.data.kind = DataKind::tokens;
  tok.data.vocab = 100;
  tok.loss = LossKind::xent;
  const auto tl = dump_leaves(dump_config(tok));
  for (const char* k : {"data.kind", "data.vocab"}) EXPECT_NE(tl.at(k), dl.at(k)) << k;
  EXPECT_TRUE(config_from_yaml_string(dump_config(tok), "dump.yaml") == tok);
  RunConfig curv;
  curv.log.curvature_every = 50;
  const std::string ct = dump_config(curv);
  EXPECT_NE(ct.find("  curvature_every: 50\n"), std::string::npos);
  EXPECT_TRUE(config_from_yaml_string(ct, "dump.yaml") == curv);
  RunConfig bad = c;
  bad.log.curvature_every = 50;
  EXPECT_THROW(validate_config(bad), Error);  // attention: no Hessian-vector products
}

TEST(Config, FloatsRoundTripExactly) {
  std::mt19937 rng(12345);
  std::uniform_int_distribution<uint32_t> bits(0x00800000u, 0x7f7fffffu);  // positive normal floats
  for (int i = 0; i < 100; ++i) {
    RunConfig c;
    uint32_t u = bits(rng);
    std::memcpy(&c.optimizer.lr, &u, sizeof u);
    c.schedule.lr_min = 0.0f;
    u = bits(rng);
    std::memcpy(&c.optimizer.eps, &u, sizeof u);
    const RunConfig back = config_from_yaml_string(dump_config(c), "f.yaml");
    ASSERT_EQ(back.optimizer.lr, c.optimizer.lr) << dump_config(c);
    ASSERT_EQ(back.optimizer.eps, c.optimizer.eps);
  }
  // Printed so that YAML 1.1 readers (PyYAML) see floats, and without needless digits.
  const auto leaves = dump_leaves(dump_config(RunConfig{}));
  EXPECT_EQ(leaves.at("optimizer.lr"), "0.0006");
  EXPECT_EQ(leaves.at("model.ln_eps"), "1.0e-05");
  EXPECT_EQ(leaves.at("log.spike_factor"), "100.0");
  EXPECT_EQ(leaves.at("kl_temperature"), "1.0");
}

TEST(Config, OverridesApplyWithTheSameValidation) {
  const std::string file = "steps: 100\nmodel:\n  width: 64\n";
  const RunConfig c = config_from_yaml_string(
      file, "o.yaml",
      {"model.width=128", "precision.weight=bf16", "name=a: b", "device=cuda:2", "seed=7", "teacher={width: 32}",
       "interventions=[{name: x, at: 10, apply: forward_only}]"});
  EXPECT_EQ(c.model.width, 128);
  EXPECT_EQ(c.steps, 100);
  EXPECT_EQ(c.precision.weight, NumFmt::bf16);
  EXPECT_EQ(c.name, "a: b");
  EXPECT_EQ(c.device, "cuda:2");
  EXPECT_EQ(c.seed, 7u);
  EXPECT_EQ(c.teacher.width, 32);
  ASSERT_EQ(c.interventions.size(), 1u);
  EXPECT_EQ(c.interventions[0].apply, "forward_only");
  // Later options win.
  EXPECT_EQ(config_from_yaml_string(file, "o.yaml", {"steps=5", "steps=6"}).steps, 6);

  std::string e = error_of([&] { config_from_yaml_string(file, "o.yaml", {"model.widht=3"}); });
  EXPECT_NE(e.find("--set model.widht=3"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'model.width'"), std::string::npos) << e;
  e = error_of([&] { config_from_yaml_string(file, "o.yaml", {"model.width=abc"}); });
  EXPECT_NE(e.find("--set model.width=abc: model.width: expected an integer, got 'abc'"), std::string::npos) << e;
  e = error_of([&] { config_from_yaml_string(file, "o.yaml", {"model.width"}); });
  EXPECT_NE(e.find("expected KEY=VALUE"), std::string::npos) << e;
  e = error_of([&] { config_from_yaml_string(file, "o.yaml", {"model.width=100"}); });
  EXPECT_NE(e.find("--set model.width=100: model.width = 100 is not a multiple"), std::string::npos) << e;
  e = error_of([&] { config_from_yaml_string(file, "o.yaml", {"model={widht: 3}"}); });
  EXPECT_NE(e.find("unknown key 'widht' in model (did you mean 'width'?)"), std::string::npos) << e;
}

// Each bad input must produce a message naming the file, the line (where there is one) and
// the key or value at fault with its fix.
TEST(Config, BadInputsGiveOneLineMessagesWithFileLineAndHint) {
  struct Case {
    const char* what;
    const char* yaml;
    std::vector<std::string> expect;  // substrings of the message
  };
  const std::vector<Case> cases = {
      {"unknown top-level key", "steps: 10\nprecison:\n  weight: bf16\n",
       {"bad.yaml:2:", "unknown key 'precison'", "did you mean 'precision'?"}},
      {"typo in a nested key", "model:\n  depth: 2\n  widht: 64\n",
       {"bad.yaml:3:", "unknown key 'widht' in model", "did you mean 'width'?"}},
      {"wrong type", "model:\n  width: abc\n", {"bad.yaml:2:", "model.width: expected an integer, got 'abc'"}},
      {"float where an integer is due", "steps: 1.5e3\n", {"bad.yaml:1:", "steps: expected an integer"}},
      {"negative width", "model:\n  width: -64\n", {"bad.yaml:2:", "model.width must be > 0, got -64"}},
      {"lr = 0", "optimizer: {lr: 0}\n", {"bad.yaml:1:", "optimizer.lr must be > 0"}},
      {"beta = 1", "optimizer:\n  beta2: 1.0\n", {"bad.yaml:2:", "optimizer.beta2 must be in [0, 1)"}},
      {"not a number", "data: {label_noise: .nan}\n", {"bad.yaml:1:", "data.label_noise: expected a number"}},
      {"unknown format", "precision:\n  grad: mxfp8_e4m2\n",
       {"bad.yaml:2:", "precision.grad: unknown format 'mxfp8_e4m2'", "did you mean 'mxfp8_e4m3'?",
        "valid: fp32, bf16, fp16, mxfp8_e4m3, mxfp8_e5m2, mxfp6_e3m2, mxfp6_e2m3, mxfp4_e2m1, mxint8"}},
      {"bad scale rule", "precision: {scale_rule: round_up}\n",
       {"bad.yaml:1:", "unknown scale rule 'round_up'", "floor, rceil, ceil, even, floor_bump"}},
      {"elementwise rounding outside nearest_*", "precision:\n  elementwise_rounding: toward_zero\n",
       {"bad.yaml:2:", "valid: nearest_even, nearest_away"}},
      {"not a bool", "precision:\n  backward: yes\n", {"bad.yaml:2:", "precision.backward: expected true or false"}},
      {"bad device", "device: gpu0\n", {"bad.yaml:1:", "'gpu0' is not a device", "cuda:N"}},
      {"width not a multiple of the block size", "steps: 5\nmodel:\n  width: 100\n",
       {"bad.yaml:3:", "model.width = 100 is not a multiple of precision.block_size = 32", "96 or 128"}},
      {"block size not dividing the width", "precision:\n  block_size: 48\n",
       {"bad.yaml:2:", "model.width = 512 is not a multiple of precision.block_size = 48"}},
      {"lr_min above lr", "optimizer: {lr: 1e-3}\nschedule: {name: cosine, lr_min: 1e-2}\n",
       {"bad.yaml:2:", "schedule.lr_min", "above optimizer.lr"}},
      {"section given a scalar", "model: 5\n", {"bad.yaml:1:", "model: expected a mapping"}},
      {"top level not a mapping", "- steps\n- 10\n", {"bad.yaml:1:", "expected a mapping of configuration keys"}},
      {"YAML syntax error", "steps: 10\nmodel:\n  width: 64\n    depth: 2\n", {"bad.yaml:4:", "YAML syntax error"}},
      {"duplicate key", "steps: 10\nseed: 1\nsteps: 20\n", {"bad.yaml:3:", "duplicate key 'steps'", "line 1"}},
      {"duplicate intervention name",
       "interventions:\n  - {name: a, at: 10, apply: to_fp32}\n  - {name: a, at: 20, apply: forward_only}\n",
       {"bad.yaml:3:", "duplicate intervention name 'a'", "line 2"}},
      {"unknown preset", "interventions:\n  - name: a\n    at: 10\n    apply: to_fp16\n",
       {"bad.yaml:4:", "unknown preset 'to_fp16'", "did you mean 'to_fp32'?", "bf16_fwd_activations"}},
      {"unknown set field", "interventions:\n  - name: a\n    at: 10\n    set: {activaton: bf16}\n",
       {"bad.yaml:4:", "unknown precision field 'activaton'", "did you mean 'activation'?", "diagnostic_format"}},
      {"bad set value", "interventions:\n  - name: a\n    at: 10\n    set:\n      weight: bf17\n",
       {"bad.yaml:5:", "unknown format 'bf17'", "did you mean 'bf16'?"}},
      {"at out of range", "steps: 100\ninterventions:\n  - name: late\n    at: 100\n    apply: to_fp32\n",
       {"bad.yaml:4:", "at = 100 is outside [1, steps) = [1, 100)"}},
      {"at = 0", "interventions: [{name: early, at: 0, apply: to_fp32}]\n", {"bad.yaml:1:", "at = 0 is outside"}},
      {"intervention that changes nothing", "interventions:\n  - {name: a, at: 10}\n",
       {"bad.yaml:2:", "changes nothing"}},
      {"intervention missing at", "interventions:\n  - {name: a, apply: to_fp32}\n", {"bad.yaml:2:", "missing 'at'"}},
      {"unknown intervention key", "interventions:\n  - name: a\n    at: 10\n    aply: to_fp32\n",
       {"bad.yaml:4:", "unknown key 'aply' in interventions[0]", "did you mean 'apply'?"}},
      {"intervention making an impossible shape", "interventions:\n  - name: a\n    at: 10\n    set: {block_size: 48}\n",
       {"bad.yaml:4:", "intervention 'a'", "not a multiple of precision.block_size = 48"}},
      {"bad intervention name", "interventions:\n  - {name: a/b, at: 10, apply: to_fp32}\n",
       {"bad.yaml:2:", "interventions[0].name 'a/b' holds the character '/'"}},
      {"norm contradicting layernorm: false", "model:\n  layernorm: false\n  norm: rmsnorm\n",
       {"bad.yaml:3:", "model.norm: rmsnorm contradicts model.layernorm: false", "norm: none"}},
      {"heads not dividing the width", "model: {block: attention, width: 64, heads: 3}\n",
       {"bad.yaml:1:", "model.heads = 3 does not divide model.width = 64"}},
      {"teacher attention with bad heads", "model: {width: 64, heads: 5}\nteacher: {block: attention}\n",
       {"bad.yaml:1:", "model.heads = 5 does not divide"}},
      {"sequence not a multiple of the block", "model: {block: attention, width: 64, heads: 2}\ndata:\n  seq_len: 12\n",
       {"bad.yaml:3:", "data.seq_len = 12 is not a multiple of precision.block_size = 32", "data.seq_len = 32"}},
      {"mxnorm blocks unlike the cast's", "model: {norm: mxnorm, mxnorm_block: 16}\n",
       {"bad.yaml:1:", "model.mxnorm_block = 16 differs from precision.block_size = 32"}},
      {"mxnorm power", "model:\n  mxnorm_p: 3\n", {"bad.yaml:2:", "model.mxnorm_p must be one of 1, 2, got 3"}},
      {"unknown norm", "model: {norm: batchnorm}\n", {"bad.yaml:1:", "unknown norm 'batchnorm'", "rmsnorm"}},
      {"intervention breaking attention's blocks",
       "model: {block: attention, width: 64, heads: 2}\ndata: {seq_len: 32}\n"
       "interventions:\n  - name: a\n    at: 10\n    set: {block_size: 64}\n",
       {"bad.yaml:6:", "intervention 'a'", "data.seq_len = 32 is not a multiple of precision.block_size = 64"}},
  };
  ASSERT_GE(cases.size(), 12u);
  for (const Case& c : cases) {
    const std::string e = error_of([&] { config_from_yaml_string(c.yaml, "bad.yaml"); });
    EXPECT_EQ(e.find('\n'), std::string::npos) << c.what << ": not one line: " << e;
    for (const std::string& s : c.expect) EXPECT_NE(e.find(s), std::string::npos) << c.what << ": '" << s << "' not in: " << e;
  }
}

TEST(Config, FilesAreNamedInMessages) {
  TempDir dir;
  const std::string missing = (dir.path / "nope.yaml").string();
  std::string e = error_of([&] { load_config(missing); });
  EXPECT_NE(e.find(missing), std::string::npos) << e;
  EXPECT_NE(e.find("cannot read"), std::string::npos) << e;
  const std::string p = dir.write("exp.yaml", "steps: 10\nmodel:\n  widht: 64\n");
  e = error_of([&] { load_config(p); });
  EXPECT_NE(e.find(p + ":3: unknown key 'widht' in model (did you mean 'width'?)"), std::string::npos) << e;
  const std::string ok = dir.write("ok.yaml", "steps: 10\n");
  EXPECT_EQ(load_config(ok, {"model.width=64"}).model.width, 64);
}

// Run ids published before keys were added (results/, earlier run directories) stay the ids of
// those runs: new keys at their defaults are left out of the hashed text. The ids below were
// printed by `mxlab dump-config FILE --id` at 0ad91cd, before any such key existed.
TEST(Config, RunIdsOfSchemaOneConfigsAreStable) {
  const std::string src = MXLAB_SOURCE_DIR;
  EXPECT_EQ(config_hash(RunConfig{}), "2f848def76bf");
  EXPECT_EQ(config_hash(load_config(src + "/experiments/quickstart.yaml")), "df348d1f4b0d");
  // fig4_interventions.yaml has since been given the student's fc2 bias; its published
  // configuration is the same file without it.
  EXPECT_EQ(config_hash(load_config(src + "/experiments/paper/fig4_interventions.yaml", {"model.fc2_bias=false"})),
            "e30552693b92");
  EXPECT_EQ(config_hash(load_config(src + "/experiments/paper/repro_base.yaml")),
            config_hash(load_config(src + "/experiments/paper/fig4_baseline.yaml", {"model.fc2_bias=false"})));
  // The printed configuration still shows every key (dump-config), only the hash input omits.
  EXPECT_NE(dump_config(RunConfig{}), canonical_config_text(RunConfig{}));
}

TEST(Config, RunIdIgnoresPresentationFieldsOnly) {
  const RunConfig base;
  const std::string id = config_hash(base);
  EXPECT_EQ(id.size(), 12u);
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(config_hash(RunConfig{}), id);  // deterministic
  RunConfig p = base;
  p.name = "other";
  p.device = "cpu";
  p.log.progress = false;
  p.log.flush_every = 1;
  EXPECT_EQ(config_hash(p), id);
  const std::vector<std::function<void(RunConfig&)>> changes = {
      [](RunConfig& c) { c.seed = 1; },
      [](RunConfig& c) { c.optimizer.lr = std::nextafter(c.optimizer.lr, 1.0f); },  // one ulp away
      [](RunConfig& c) { c.precision.weight_bwd = NumFmt::mxfp8_e4m3; },  // explicit, though equal to `same` now
      [](RunConfig& c) { c.log.log_every = 20; },
      [](RunConfig& c) { c.interventions.push_back({"x", 10, "to_fp32", {}}); },
      [](RunConfig& c) { c.model.norm = NormKind::rmsnorm; },  // keys added after schema 1, off their defaults
      [](RunConfig& c) { c.data.seq_len = 2; },
      [](RunConfig& c) { c.precision.attn_probs = NumFmt::bf16; },
      [](RunConfig& c) { c.precision.grad_wgrad = NumFmt::bf16; },
      [](RunConfig& c) { c.precision.grad_wgrad = NumFmt::mxfp8_e4m3; },  // explicit, though equal to grad
      [](RunConfig& c) { c.precision.rounding_grad_wgrad = Rounding::nearest_even; },  // likewise
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    RunConfig c = base;
    changes[i](c);
    EXPECT_NE(config_hash(c), id) << "change " << i;
  }
  EXPECT_EQ(canonical_config_text(base).find("device"), std::string::npos);
  EXPECT_EQ(canonical_config_text(base).find("name: run"), std::string::npos);
}

namespace {

// The names of the PrecisionConfig fields that differ (bwd roles compared as resolved formats,
// which is what the backends see).
std::vector<std::string> changed_fields(const PrecisionConfig& a, const PrecisionConfig& b) {
  std::vector<std::string> d;
  if (a.weight != b.weight) d.push_back("weight");
  if (a.activation != b.activation) d.push_back("activation");
  if (a.grad != b.grad) d.push_back("grad");
  if (a.weight_bwd_fmt() != b.weight_bwd_fmt()) d.push_back("weight_bwd");
  if (a.activation_bwd_fmt() != b.activation_bwd_fmt()) d.push_back("activation_bwd");
  if (a.grad_wgrad_fmt() != b.grad_wgrad_fmt()) d.push_back("grad_wgrad");
  if (a.ln_affine != b.ln_affine) d.push_back("ln_affine");
  if (a.elementwise_bf16 != b.elementwise_bf16) d.push_back("elementwise");
  if (a.backward != b.backward) d.push_back("backward");
  if (a.block_size != b.block_size) d.push_back("block_size");
  if (a.scale_rule != b.scale_rule) d.push_back("scale_rule");
  if (a.bump != b.bump) d.push_back("bump");
  if (a.rounding != b.rounding) d.push_back("rounding");
  if (a.elementwise_rounding != b.elementwise_rounding) d.push_back("elementwise_rounding");
  if (a.diagnostic_format != b.diagnostic_format) d.push_back("diagnostic_format");
  if (a.attn_logits_fmt() != b.attn_logits_fmt()) d.push_back("attn_logits");
  if (a.attn_probs_fmt() != b.attn_probs_fmt()) d.push_back("attn_probs");
  if (a.layernorm != b.layernorm) d.push_back("layernorm");
  if (a.gelu != b.gelu) d.push_back("gelu");
  if (a.residual != b.residual) d.push_back("residual");
  if (a.bias != b.bias) d.push_back("bias");
  if (a.ln_beta_grad != b.ln_beta_grad) d.push_back("ln_beta_grad");
  if (a.attention != b.attention) d.push_back("attention");
  if (a.attention_tile_r != b.attention_tile_r || a.attention_tile_c != b.attention_tile_c)
    d.push_back("attention_tile");
  if (a.attention_softmax != b.attention_softmax) d.push_back("attention_softmax");
  if (a.attention_beta != b.attention_beta) d.push_back("attention_beta");
  if (a.attention_eps != b.attention_eps) d.push_back("attention_eps");
  if (a.attention_delta != b.attention_delta) d.push_back("attention_delta");
  return d;
}

PrecisionConfig apply(const PrecisionConfig& p, const std::string& preset,
                      std::map<std::string, std::string> set = {}) {
  InterventionConfig iv;
  iv.name = "t";
  iv.at = 1;
  iv.apply = preset;
  iv.set = std::move(set);
  return apply_intervention(p, iv);
}

}  // namespace

TEST(Interventions, EachPresetChangesExactlyTheFieldsItNames) {
  // A base where every field a preset sets differs from the preset's value.
  PrecisionConfig base;
  base.weight = NumFmt::mxfp6_e2m3;
  base.activation = NumFmt::mxfp4_e2m1;
  base.grad = NumFmt::mxfp8_e5m2;
  base.grad_wgrad = NumFmt::mxfp6_e3m2;  // given: to_fp32 must set it, nothing else may
  base.ln_affine = NumFmt::mxint8;
  base.bump = Bump::always;  // bump_exponent must set clamp
  struct Expect {
    const char* preset;
    std::vector<std::string> changed;
  };
  const std::vector<Expect> table = {
      {"to_fp32",
       {"weight", "activation", "grad", "weight_bwd", "activation_bwd", "grad_wgrad", "ln_affine", "elementwise",
        "attn_logits", "attn_probs"}},
      {"skip_ln_quant", {"ln_affine"}},
      {"bump_exponent", {"scale_rule", "bump"}},
      {"forward_only", {"backward"}},
      // The attention roles at `same` follow `activation` (explicit ones stay: checked below).
      {"bf16_activations", {"activation", "activation_bwd", "attn_logits", "attn_probs"}},
      {"bf16_weights", {"weight", "weight_bwd"}},
      {"bf16_fwd_activations", {"activation", "attn_logits", "attn_probs"}},
      // to_fp32 with gamma/beta quantized as before; snap_gamma changes state only.
      {"to_fp32_keep_gamma_q",
       {"weight", "activation", "grad", "weight_bwd", "activation_bwd", "grad_wgrad", "elementwise", "attn_logits",
        "attn_probs"}},
      {"snap_gamma", {}},
      {"reset_adam_v", {}},
      // The paper's emulator: its arithmetic, not its formats (base.rounding is nearest_even).
      {"paper_emulator",
       {"ln_affine", "bump", "rounding", "elementwise_rounding", "layernorm", "gelu", "residual", "bias",
        "ln_beta_grad"}},
      // The flash kernel in bf16, with the stabilized softmax or delta from the FP32 O.
      {"flash_bf16", {"attention"}},
      {"stabilized_softmax", {"attention", "attention_softmax"}},
      {"delta_hp", {"attention", "attention_delta"}},
  };
  for (const Expect& e : table) EXPECT_EQ(changed_fields(base, apply(base, e.preset)), e.changed) << e.preset;
  PrecisionConfig clamp_base = base;
  clamp_base.bump = Bump::clamp;
  EXPECT_EQ(changed_fields(clamp_base, apply(clamp_base, "bump_exponent_always")),
            (std::vector<std::string>{"scale_rule", "bump"}));
  // Every preset is covered by the two checks above.
  EXPECT_EQ(table.size() + 1, intervention_presets().size());

  // The values each preset sets.
  const PrecisionConfig f = apply(base, "to_fp32");
  EXPECT_EQ(f.weight_bwd_fmt(), NumFmt::fp32);
  EXPECT_EQ(f.activation_bwd_fmt(), NumFmt::fp32);
  EXPECT_EQ(f.ln_affine, NumFmt::fp32);
  EXPECT_FALSE(f.elementwise_bf16);
  EXPECT_TRUE(apply(PrecisionConfig{}, "to_fp32") == PrecisionConfig::fp32());
  EXPECT_EQ(apply(base, "bump_exponent").scale_rule, ScaleRule::floor_bump);
  EXPECT_EQ(apply(base, "bump_exponent").bump, Bump::clamp);
  EXPECT_EQ(apply(clamp_base, "bump_exponent_always").bump, Bump::always);
  EXPECT_EQ(apply(base, "bf16_activations").activation_bwd_fmt(), NumFmt::bf16);
  EXPECT_EQ(apply(base, "bf16_weights").weight_bwd_fmt(), NumFmt::bf16);
  // bf16_fwd_activations keeps the backward activation format `same` resolved to before.
  const PrecisionConfig fa = apply(base, "bf16_fwd_activations");
  EXPECT_EQ(fa.activation, NumFmt::bf16);
  EXPECT_EQ(fa.activation_bwd_fmt(), NumFmt::mxfp4_e2m1);
  PrecisionConfig explicit_bwd = base;
  explicit_bwd.activation_bwd = NumFmt::mxfp6_e3m2;
  EXPECT_EQ(apply(explicit_bwd, "bf16_fwd_activations").activation_bwd_fmt(), NumFmt::mxfp6_e3m2);
  PrecisionConfig explicit_attn = base;
  explicit_attn.attn_logits = NumFmt::mxfp8_e5m2;
  EXPECT_EQ(apply(explicit_attn, "bf16_activations").attn_logits_fmt(), NumFmt::mxfp8_e5m2);
  EXPECT_EQ(apply(explicit_attn, "bf16_activations").attn_probs_fmt(), NumFmt::bf16);
  EXPECT_EQ(apply(explicit_attn, "to_fp32").attn_logits_fmt(), NumFmt::fp32);
  // to_fp32 of a flash policy: exact attention, standard softmax, delta from O; the flash kernel's
  // parameters (read only under flash_bf16) stay.
  PrecisionConfig flash = apply(base, "stabilized_softmax+delta_hp");
  flash.attention_tile_r = 32;
  flash.attention_beta = 8.0f;
  EXPECT_EQ(changed_fields(flash, apply(flash, "to_fp32")),
            (std::vector<std::string>{"weight", "activation", "grad", "weight_bwd", "activation_bwd", "grad_wgrad",
                                      "ln_affine", "elementwise", "attn_logits", "attn_probs", "attention",
                                      "attention_softmax", "attention_delta"}));
  EXPECT_EQ(apply(flash, "to_fp32").attention_tile_r, 32);
  EXPECT_EQ(apply(flash, "to_fp32").attention_beta, 8.0f);
}

TEST(Interventions, SetAppliesAfterThePreset) {
  const PrecisionConfig base;
  const PrecisionConfig p = apply(base, "to_fp32", {{"backward", "false"}, {"grad", "bf16"}});
  EXPECT_EQ(changed_fields(apply(base, "to_fp32"), p), (std::vector<std::string>{"grad", "backward"}));
  // `same` makes a backward role follow its forward role again.
  PrecisionConfig b = base;
  b.weight_bwd = NumFmt::mxfp8_e5m2;
  const PrecisionConfig s = apply(b, "", {{"weight_bwd", "same"}, {"weight", "bf16"}});
  EXPECT_FALSE(s.weight_bwd.has_value());
  EXPECT_EQ(s.weight_bwd_fmt(), NumFmt::bf16);
  // Runtime errors name the intervention and list the valid choices.
  std::string e = error_of([&] { apply(base, "to_fp64"); });
  EXPECT_NE(e.find("intervention 't': unknown preset 'to_fp64'"), std::string::npos) << e;
  EXPECT_NE(e.find("skip_ln_quant"), std::string::npos) << e;
  e = error_of([&] { apply(base, "", {{"scale", "floor"}}); });
  EXPECT_NE(e.find("unknown precision field 'scale'"), std::string::npos) << e;
  EXPECT_NE(e.find("scale_rule"), std::string::npos) << e;
}

TEST(Interventions, PatchIsDescribedAsOneLineYaml) {
  InterventionConfig iv;
  iv.name = "x";
  iv.at = 5;
  iv.apply = "to_fp32";
  EXPECT_EQ(describe_patch(iv), "{apply: to_fp32}");
  iv.set = {{"backward", "false"}, {"activation", "bf16"}};
  EXPECT_EQ(describe_patch(iv), "{apply: to_fp32, set: {activation: bf16, backward: false}}");
  iv.apply.clear();
  EXPECT_EQ(describe_patch(iv), "{set: {activation: bf16, backward: false}}");
  // The description is a set of precision fields the loader accepts back.
  const RunConfig c = config_from_yaml_string(
      "interventions:\n  - name: x\n    at: 5\n    " + std::string("set: {activation: bf16, backward: false}\n"), "p.yaml");
  EXPECT_TRUE(c.interventions[0] == iv);
}

TEST(Interventions, Fp32PolicyIsAllFp32) {
  const PrecisionConfig p = PrecisionConfig::fp32();
  for (NumFmt f : {p.weight, p.activation, p.grad, p.weight_bwd_fmt(), p.activation_bwd_fmt(), p.grad_wgrad_fmt(),
                   p.ln_affine, p.attn_logits_fmt(), p.attn_probs_fmt()})
    EXPECT_EQ(f, NumFmt::fp32);
  EXPECT_FALSE(p.elementwise_bf16);
}

// experiments/defaults.yaml is a copy of `mxlab dump-config`: this fails when it drifts.
// Regenerate with: build/mxlab dump-config > experiments/defaults.yaml
TEST(Config, DefaultsFileMatchesTheCode) {
  const std::string path = std::string(MXLAB_SOURCE_DIR) + "/experiments/defaults.yaml";
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  EXPECT_EQ(read_file(path), dump_config(RunConfig{})) << "regenerate: mxlab dump-config > experiments/defaults.yaml";
}

// Every ```yaml block of experiments/README.md is a valid experiment (the docs cannot rot);
// the block listing every key must be exactly the defaults.
TEST(Config, ReadmeExamplesParse) {
  const std::string path = std::string(MXLAB_SOURCE_DIR) + "/experiments/README.md";
  std::istringstream in(read_file(path));
  std::vector<std::string> blocks;
  std::string line, cur;
  bool inside = false;
  while (std::getline(in, line)) {
    if (!inside && line == "```yaml") {
      inside = true;
      cur.clear();
    } else if (inside && line == "```") {
      inside = false;
      blocks.push_back(cur);
    } else if (inside) {
      cur += line + "\n";
    }
  }
  ASSERT_GE(blocks.size(), 4u) << path;
  for (size_t i = 0; i < blocks.size(); ++i) {
    try {
      const auto runs = expand_experiment_string(blocks[i], msg("README block ", i), {},
                                                 std::string(MXLAB_SOURCE_DIR) + "/experiments");
      EXPECT_FALSE(runs.empty());
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
    }
  }
  EXPECT_TRUE(config_from_yaml_string(blocks[0], "README block 0") == RunConfig{});
  // The sweep example's count and first runs, as the text states.
  const auto sweep_block = std::find_if(blocks.begin(), blocks.end(),
                                        [](const std::string& b) { return b.find("name: width_by_format") == 0; });
  ASSERT_NE(sweep_block, blocks.end());
  const auto sweep = expand_experiment_string(*sweep_block, "README sweep block");
  ASSERT_EQ(sweep.size(), 36u);
  EXPECT_EQ(sweep[1].cfg.seed, 1u);
  EXPECT_EQ(sweep[1].cfg.model.width, 256);
}

TEST(Config, DumpConfigCommand) {
  const std::string bin = MXLAB_BINARY;
  auto [rc, out] = run_command(bin + " dump-config");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, dump_config(RunConfig{}));

  TempDir dir;
  const std::string p = dir.write("exp.yaml", "steps: 300\nmodel: {width: 64}\n");
  std::tie(rc, out) = run_command(bin + " dump-config " + p + " --set model.depth=2 --set precision.weight=bf16");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, dump_config(load_config(p, {"model.depth=2", "precision.weight=bf16"})));
  EXPECT_NE(out.find("  depth: 2\n  width: 64\n"), std::string::npos) << out;

  std::tie(rc, out) = run_command(bin + " dump-config " + p + " --id");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, config_hash(load_config(p)) + "\n");

  std::tie(rc, out) = run_command(bin + " dump-config " + p + " --set model.widht=3");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("did you mean 'model.width'?"), std::string::npos) << out;
  EXPECT_EQ(out.find("steps:"), std::string::npos) << "no partial output on error: " << out;
}

namespace mxlab {
namespace {

// The model writes its FP32 policy directly (lab/model/model_config.cpp); the `to_fp32` preset
// of the configuration must give the same policy, field for field, so that a branch switched
// to FP32 runs the FP32 trajectory's arithmetic.
TEST(Presets, TheModelsFp32PolicyIsTheToFp32Preset) {
  InterventionConfig iv;
  iv.apply = "to_fp32";
  const PrecisionConfig preset = apply_intervention(PrecisionConfig{}, iv);
  EXPECT_TRUE(PrecisionConfig::fp32() == preset);
  EXPECT_EQ(describe_policy(PrecisionConfig::fp32()), describe_policy(preset));
  // ... also from a recipe that sets every emulator composition and rounding override.
  InterventionConfig emu;
  emu.apply = "paper_emulator";
  PrecisionConfig recipe = apply_intervention(PrecisionConfig{}, emu);
  recipe.rounding_grad_wgrad = Rounding::nearest_even;
  const PrecisionConfig switched = apply_intervention(recipe, iv);
  EXPECT_EQ(switched.weight, NumFmt::fp32);
  EXPECT_EQ(switched.layernorm, PrecisionConfig::fp32().layernorm);
  EXPECT_EQ(switched.gelu, PrecisionConfig::fp32().gelu);
  EXPECT_EQ(switched.residual, PrecisionConfig::fp32().residual);
  EXPECT_EQ(switched.bias, PrecisionConfig::fp32().bias);
  EXPECT_EQ(switched.ln_beta_grad, PrecisionConfig::fp32().ln_beta_grad);
  EXPECT_EQ(switched.elementwise_bf16, PrecisionConfig::fp32().elementwise_bf16);
}

}  // namespace
}  // namespace mxlab
