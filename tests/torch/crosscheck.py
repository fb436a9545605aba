#!/usr/bin/env python3
"""PyTorch cross-check of mxlab's FP32 forward and backward.

For every block x norm x activation x loss combination (and causal attention, and token data with
its embedding, unembedding and cross-entropy), `mxlab dump-step` writes one FP32 CPU step of a
small network (weights, batch, loss, every parameter gradient; lab/cli/cmd_dump_step.cpp).
This script rebuilds the same network in PyTorch from the resolved configuration alone - the
paper's Eq. 1 MLP block and Eq. 11 attention block, layernorm / RMSNorm / MXNorm as
papers/mxnorm.md defines them (MXNorm's gradient through its appendix-F straight-through
estimator) - loads mxlab's weights and batch, and compares:

  - the teacher's output with mxlab's targets (label noise 0), the student's output and loss,
  - every parameter group's gradient with autograd's,

against autograd in float32 (what the issue asks) and in float64 (the reference both float32
computations are measured against).

Tolerance (derived, not tuned): each quantity is a composition of m reduction stages (sums,
dot products, GEMMs, norms, softmax, the loss) along the longest forward + backward path, the
longest reduction having K_max terms. A float32 sum of K terms is within gamma_K = K u (u = 2^-24)
of the exact one relative to the sum of magnitudes (Higham, Thm 3.1); to first order the errors
of m stages add, so two float32 evaluations differ from the exact value, and from each other, by
at most about 2 m K_max u in the 2-norm relative to the reference value. Required, per group:
||g_mxlab - g_torch32|| <= tol ||g_torch64|| and ||g_mxlab - g_torch64|| <= tol ||g_torch64|| with
tol = 2 m K_max u (printed; about 1e-3 here, where the measured differences are ~1e-6).
Well-conditioned inputs (random init, unit Gaussian data) keep the amplification that the first-
order bound ignores small; a formula or layout bug gives O(1) errors and fails by orders of magnitude.

Run: /usr/bin/python3 tests/torch/crosscheck.py --mxlab build/mxlab  (ctest: torch_crosscheck).
Fails (does not skip) when torch is missing, unless MXLAB_TORCH_OPTIONAL=1.
"""

import argparse
import itertools
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "analysis"))
from mxlab import yamlcfg  # noqa: E402  (the project's YAML-subset reader, no PyYAML)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_required import require_torch  # noqa: E402  (this folder)

require_torch("crosscheck")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

BLOCKS = ["mlp", "attention"]
NORMS = ["layernorm", "rmsnorm", "mxnorm", "none"]
ACTS = ["relu", "gelu", "gelu_tanh", "swiglu", "linear"]
LOSSES = ["mse", "kl"]
# Teacher variants cycled over the combinations: (teacher.block, teacher.residual).
TEACHERS = [("mlp", False), ("mlp", True), ("attention", True), ("attention", False)]

BASE = """\
seed: 5
model: {depth: 2, width: 32, heads: 4, mxnorm_block: 16}
data: {batch: 4, seq_len: 8, label_noise: 0.0}
precision: {weight: fp32, activation: fp32, grad: fp32, ln_affine: none, elementwise: fp32, block_size: 8}
"""

# papers/mxnorm.md appendix F, absmax_scale_factor: RMS / p-mean of block absmaxes.
MXNORM_C = {(16, 1): 0.4814, (16, 2): 0.4688, (32, 1): 0.4261, (32, 2): 0.4185,
            (64, 1): 0.3852, (64, 2): 0.3803}
U = 2.0 ** -24


# ---- the network, from the configuration (never from mxlab's internals) ----

class MXNormSTE(torch.autograd.Function):
    """MXNorm without gain (papers/mxnorm.md eqs. 7-8, appendix F mx_norm): the RMS estimate is
    c * (p-mean of the block absmaxes along the last axis); the backward is RMSNorm's gradient
    with that estimate (appendix E/F rms_norm_grad, the straight-through estimator)."""

    @staticmethod
    def forward(ctx, x, block, p, c, eps):
        m = x.reshape(*x.shape[:-1], -1, block).abs().amax(dim=-1)
        g = m.pow(p).mean(dim=-1, keepdim=True).pow(1.0 / p)
        rms = c * g
        rstd = torch.rsqrt(rms * rms + eps)  # eps as in RMSNorm: 1 / sqrt(ms + eps)
        ctx.save_for_backward(x, rstd)
        return x * rstd

    @staticmethod
    def backward(ctx, grad):
        x, rstd = ctx.saved_tensors
        delta = (grad * x).mean(dim=-1, keepdim=True)
        return rstd * grad - rstd.pow(3) * x * delta, None, None, None, None


def activation(name, h, hidden):
    if name == "relu":
        return F.relu(h)
    if name == "gelu":
        return F.gelu(h)
    if name == "gelu_tanh":
        return F.gelu(h, approximate="tanh")
    if name == "linear":
        return h
    if name == "swiglu":  # h = [u | gate] (Shazeer 2020): u * silu(gate)
        return h[:, :hidden] * F.silu(h[:, hidden:])
    raise ValueError(name)


def norm_then_weight(kind, x, gamma, beta, weight, eps, mx):
    """The norm before a linear layer and the weight that layer uses. MXNorm moves its gain onto
    the weight (MXNormLinear, papers/mxnorm.md 3.7: H = MXNorm(X) (W gamma)^T)."""
    d = x.shape[-1]
    if kind == "none":
        return x, weight
    if kind == "layernorm":
        return F.layer_norm(x, (d,), gamma, beta, eps), weight
    if kind == "rmsnorm":
        y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
        return (y * gamma if gamma is not None else y), weight
    if kind == "mxnorm":
        block, p = mx
        y = MXNormSTE.apply(x, block, p, MXNORM_C[(block, p)], eps)
        return y, (weight * gamma[None, :] if gamma is not None else weight)
    raise ValueError(kind)


def self_attention(y, wqkv, wo, bo, nb, seq, heads, causal=False):
    """Multi-head self-attention over sequences of `seq` tokens (Eq. 11); with `causal` (model.causal)
    query r sees keys t <= r only."""
    d = y.shape[-1]
    dh = d // heads
    q, k, v = (y @ wqkv.T).split(d, dim=-1)

    def split(t):
        return t.reshape(nb, seq, heads, dh).transpose(1, 2)  # [nb, h, S, dh]

    att = (split(q) @ split(k).transpose(-1, -2)) * (1.0 / math.sqrt(dh))
    if causal:
        att = att.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
    o = (torch.softmax(att, dim=-1) @ split(v)).transpose(1, 2).reshape(nb * seq, d)
    o = o @ wo.T
    return o + bo if bo is not None else o


class Net:
    def __init__(self, cfg, params, student):
        m, t, data = cfg["model"], cfg["teacher"], cfg["data"]
        self.p = params
        self.student = student
        self.depth = m["depth"] if not student or True else None
        self.act = m["activation"]
        self.heads = m["heads"]
        self.seq = data["seq_len"]
        self.eps = m["ln_eps"]
        if student:
            self.depth = m["depth"]
            self.block = m["block"]
            self.norm = m["norm"] if m["layernorm"] else "none"
            self.residual = True
        else:
            self.depth = t["depth"] or m["depth"]
            self.block = t["block"]
            self.norm = "none"
            self.residual = t["residual"]
            if t["activation"] != "same":
                self.act = t["activation"]
        self.mx = (m["mxnorm_block"], m["mxnorm_p"])
        self.causal = bool(m.get("causal", False))

    def g(self, k, name):
        return self.p.get(f"layer{k}.{name}")

    def __call__(self, x):
        nb = x.shape[0] // self.seq
        a = x
        for k in range(self.depth):
            z = a
            if self.block == "attention":
                y1, wqkv = norm_then_weight(self.norm, a, self.g(k, "attn_gamma"), self.g(k, "attn_beta"),
                                            self.g(k, "Wqkv"), self.eps, self.mx)
                att = self_attention(y1, wqkv, self.g(k, "Wo"), self.g(k, "bo"), nb, self.seq, self.heads,
                                     self.causal)
                z = a + att if self.residual else att
            y2, w1 = norm_then_weight(self.norm, z, self.g(k, "gamma"), self.g(k, "beta"), self.g(k, "W1"),
                                      self.eps, self.mx)
            w2 = self.g(k, "W2")
            o = activation(self.act, y2 @ w1.T, w2.shape[1]) @ w2.T
            if self.g(k, "b2") is not None:
                o = o + self.g(k, "b2")
            a = z + o if self.residual else o
        return a


def expected_groups(cfg, student):
    """Group names per lab/model/README.md: [attn_gamma, attn_beta, Wqkv, Wo, bo,] gamma, beta, W1, W2, b2."""
    m, t = cfg["model"], cfg["teacher"]
    if student:
        depth, block = m["depth"], m["block"]
        norm = m["norm"] if m["layernorm"] else "none"
        gain = norm != "none" and m["ln_affine"]
        bias_ln = gain and norm == "layernorm"
        fc2 = m["fc2_bias"]
    else:
        depth, block, gain, bias_ln, fc2 = t["depth"] or m["depth"], t["block"], False, False, False
    names = []
    for k in range(depth):
        layer = []
        if block == "attention":
            layer += ["attn_gamma"] * gain + ["attn_beta"] * bias_ln + ["Wqkv", "Wo"] + ["bo"] * fc2
        layer += ["gamma"] * gain + ["beta"] * bias_ln + ["W1", "W2"] + ["b2"] * fc2
        names += [f"layer{k}.{n}" for n in layer]
    if student and tokens(cfg):  # the token network's embedding and unembedding
        names = ["embed"] + names + ["unembed"]
    return names


def tokens(cfg):
    return cfg["data"].get("kind", "gaussian") == "tokens"


def load(dirpath, prefix, names, dtype):
    found = sorted(f[len(prefix) + 1:-4] for f in os.listdir(dirpath) if f.startswith(prefix + "."))
    if found != sorted(names):
        raise AssertionError(f"{prefix} groups: mxlab wrote {found}, the config implies {sorted(names)}")
    return {n: torch.tensor(np.load(os.path.join(dirpath, f"{prefix}.{n}.npy")), dtype=dtype) for n in names}


def loss_fn(cfg, out, target):
    if cfg["loss"] == "xent":  # next-token cross-entropy, the targets are token ids
        return F.cross_entropy(out, target.long())
    if cfg["loss"] == "mse":
        return ((out - target) ** 2).mean()
    temp = cfg["kl_temperature"]
    logp = torch.log_softmax(target / temp, dim=-1)
    logq = torch.log_softmax(out / temp, dim=-1)
    return (logp.exp() * (logp - logq)).sum(dim=-1).mean()


def twin(dirpath, cfg, dtype):
    """Loss, output, teacher output and gradients of the PyTorch network in `dtype`."""
    snames, tnames = expected_groups(cfg, True), expected_groups(cfg, False)
    sp = load(dirpath, "student", snames, dtype)
    tp = load(dirpath, "teacher", tnames, dtype)
    for v in sp.values():
        v.requires_grad_(True)
    d = cfg["model"]["width"]
    if tokens(cfg):  # ids in, the embedding, the blocks, the unembedding; no teacher runs
        ids = torch.tensor(np.load(os.path.join(dirpath, "x.npy"))).reshape(-1).long()
        target = torch.tensor(np.load(os.path.join(dirpath, "target.npy"))).reshape(-1)
        teacher_out = torch.zeros(1, dtype=dtype)
        out = Net(cfg, sp, True)(sp["embed"][ids]) @ sp["unembed"].T
        loss = loss_fn(cfg, out, target)
        loss.backward()
        grads = {n: sp[n].grad.detach().double().numpy() for n in snames}
        return float(loss), out.detach().double().numpy(), teacher_out.double().numpy(), grads
    x = torch.tensor(np.load(os.path.join(dirpath, "x.npy")), dtype=dtype).reshape(-1, d)
    target = torch.tensor(np.load(os.path.join(dirpath, "target.npy")), dtype=dtype).reshape(-1, d)
    with torch.no_grad():
        teacher_out = Net(cfg, tp, False)(x)
    out = Net(cfg, sp, True)(x)
    loss = loss_fn(cfg, out, target)
    loss.backward()
    grads = {n: sp[n].grad.detach().double().numpy() for n in snames}
    return float(loss), out.detach().double().numpy(), teacher_out.double().numpy(), grads


def tolerance(cfg):
    """tol = 2 m K_max u (module docstring): m reduction stages on the longest path."""
    m, data = cfg["model"], cfg["data"]
    d, L = m["width"], m["depth"]
    hidden = (2 * m["hidden_mult"] * d + 1) // 3 if m["activation"] == "swiglu" else m["hidden_mult"] * d
    h1 = 2 * hidden if m["activation"] == "swiglu" else hidden
    tokens = data["batch"] * data["seq_len"]
    k_max = max(d, 3 * d, h1, tokens, data["seq_len"], data.get("vocab", 0) if data.get("kind") == "tokens" else 0)
    per_block = 7 + (13 if m["block"] == "attention" else 0)  # norm(2)+2 GEMMs fwd, 3 bwd; attention 7 + 6
    teacher = 2 * (m["depth"]) * (2 + (5 if cfg["teacher"]["block"] == "attention" else 0))
    stages = L * per_block + teacher + 2 + 4  # + loss (forward sum, gradient), + the unembedding GEMMs
    return 2.0 * stages * k_max * U


def rel(a, b, ref):
    n = np.linalg.norm(ref)
    return np.linalg.norm(np.asarray(a, np.float64) - np.asarray(b, np.float64)) / (n if n > 0 else 1.0)


def check_one(mxlab, workdir, sets):
    subprocess.run([mxlab, "dump-step", os.path.join(workdir, "base.yaml"), "--out", workdir] +
                   [a for s in sets for a in ("--set", s)], check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(workdir, "config.yaml"), encoding="utf-8") as f:
        cfg = yamlcfg.parse(f.read())
    ref_loss = float(np.load(os.path.join(workdir, "loss.npy"))[0])
    width = cfg["data"]["vocab"] if tokens(cfg) else cfg["model"]["width"]
    ref_out = np.load(os.path.join(workdir, "out.npy")).reshape(-1, width)
    l32, o32, t32, g32 = twin(workdir, cfg, torch.float32)
    l64, o64, t64, g64 = twin(workdir, cfg, torch.float64)
    tol = tolerance(cfg)
    rows = [("loss", rel(ref_loss, l32, l64), rel(ref_loss, l64, l64)),
            ("output", rel(ref_out, o32, o64), rel(ref_out, o64, o64))]
    if not tokens(cfg):  # token data has no teacher
        target = np.load(os.path.join(workdir, "target.npy")).reshape(-1, cfg["model"]["width"])
        rows.append(("teacher", rel(target, t32, t64), rel(target, t64, t64)))
    for name in g64:
        ref = np.load(os.path.join(workdir, f"grad.{name}.npy"))
        if not (np.all(np.isfinite(ref)) and np.linalg.norm(g64[name]) > 0):
            raise AssertionError(f"{name}: gradient not finite or zero (proves nothing)")
        rows.append((f"d {name}", rel(ref, g32[name], g64[name]), rel(ref, g64[name], g64[name])))
    return tol, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mxlab", required=True, help="path to the mxlab binary")
    ap.add_argument("--verbose", action="store_true", help="print every group of every combination")
    args = ap.parse_args()
    torch.set_num_threads(1)  # deterministic and light on a shared machine
    start = time.time()
    failures, worst = [], (0.0, "")
    combos = list(itertools.product(BLOCKS, NORMS, ACTS, LOSSES))
    # model.causal and token data (data.kind: tokens, loss: xent), after the product: (sets, label).
    extra = [(["model.block=attention", "model.causal=true", "teacher.block=attention", "teacher.residual=true"],
              "attention causal, teacher attention causal"),
             (["data.kind=tokens", "data.vocab=24", "loss=xent", "model.activation=relu"], "tokens mlp"),
             (["data.kind=tokens", "data.vocab=24", "loss=xent", "model.block=attention", "model.causal=true",
               "model.norm=rmsnorm"], "tokens attention causal rmsnorm")]
    with tempfile.TemporaryDirectory(prefix="mxlab_torch_") as tmp:
        with open(os.path.join(tmp, "base.yaml"), "w", encoding="utf-8") as f:
            f.write(BASE)
        cases = []
        for i, (block, norm, act, loss) in enumerate(combos):
            tblock, tres = TEACHERS[i % len(TEACHERS)]
            sets = [f"model.block={block}", f"model.norm={norm}", f"model.activation={act}", f"loss={loss}",
                    f"teacher.block={tblock}", f"teacher.residual={'true' if tres else 'false'}",
                    f"model.ln_affine={'false' if i % 3 == 2 else 'true'}",
                    f"model.fc2_bias={'false' if i % 5 == 4 else 'true'}",
                    f"model.mxnorm_p={1 if i % 4 == 1 else 2}", f"kl_temperature={0.5 if i % 2 else 1.0}"]
            cases.append((sets, " ".join(s.split("=")[1] for s in sets[:4]) +
                          f" teacher={tblock}/{'res' if tres else 'plain'}"))
        cases += extra
        for i, (sets, label) in enumerate(cases):
            work = os.path.join(tmp, f"c{i}")
            os.makedirs(work)
            os.link(os.path.join(tmp, "base.yaml"), os.path.join(work, "base.yaml"))
            try:
                tol, rows = check_one(args.mxlab, work, sets)
            except Exception as e:  # noqa: BLE001 - report every combination, then fail
                failures.append(f"{label}: {e}")
                print(f"FAIL {label}: {e}")
                continue
            bad = [r for r in rows if not (r[1] <= tol and r[2] <= tol)]
            top = max(max(r[1], r[2]) for r in rows)
            if top > worst[0]:
                worst = (top, label)
            print(f"{'ok  ' if not bad else 'FAIL'} {label:55s} max rel diff {top:.2e} (tol {tol:.1e})")
            for name, r32, r64 in (rows if args.verbose else bad):
                print(f"       {name:22s} vs torch32 {r32:.2e}  vs torch64 {r64:.2e}")
            if bad:
                failures.append(f"{label}: {', '.join(r[0] for r in bad)} outside {tol:.1e}")
    print(f"crosscheck: {len(combos) + len(extra)} combinations, {len(failures)} failed, largest relative difference "
          f"{worst[0]:.2e} ({worst[1]}), {time.time() - start:.1f} s")
    if failures:
        print("\n".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
