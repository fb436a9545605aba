#!/usr/bin/env python3
"""The token network's MX step against the MX emulation library (microxcaling).

The flash study's MXFP8 arms (experiments/paper/flash_study.yaml) do not train the causal token
model. Before that reads as MX arithmetic's instability, the lab's MX step of that network must be
what an implementation it did not write computes. `mxlab dump-step experiments/paper/flash_study.yaml
--run I --trajectory mxfp8_exact --gemm double` writes one step of its `mxfp8_exact` arm (every
linear layer in MXFP8 E4M3, attention's Q K^T and P V in FP32) on a small shape; this script
rebuilds the step in PyTorch from tests/torch/crosscheck.py's token network (built from the
configuration alone) with every GEMM operand that the policy makes MX quantized by microxcaling's
`_quantize_mx` (E4M3, block 32, 8-bit shared exponent from the block maximum = the floor scale,
ties-to-even), along the reduction axis of the GEMM it feeds, as lab/model/README.md ("Roles")
documents it:
  - a linear layer Y = X W^T: X and W along K; dX = dY W: dY and W along the output features;
    dW = dY^T X: dY and X along the tokens;
  - attention's own GEMMs keep Q, K, P, V in FP32 (attn_logits, attn_probs: fp32), but their
    gradient operands take `grad`: dO along dh in dP = dO V^T and along the queries in dV = P^T dO,
    dS along the keys in dQ = dS K and along the queries in dK = dS^T Q.
Every GEMM sums in float64 and rounds once, as mxlab's `--gemm double` does; layernorm, softmax,
GeLU, the loss and the embedding's scatter-add are PyTorch's FP32 (their rounding differs from
mxlab's in the last bits, which can move a rare element across an MX bin upstream).

Asserted, per case: the loss and every parameter gradient within REL (relative 2-norm) of mxlab's,
where the MX quantization error itself is ~1e-2 (printed: the twin without MX); negative control:
the twin without the attention gradients' MX quantization (attention's GEMMs wholly FP32) differs
from mxlab in the Q/K/V projection's gradient by more than 1e-3, so a wrong role would be caught.

Run: /usr/bin/python3 tests/torch/token_mx.py --mxlab build/mxlab (ctest: torch_token_mx). Fails
(does not skip) when torch or microxcaling is missing, unless MXLAB_TORCH_OPTIONAL=1 (torch only).
"""

import argparse
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "analysis"))
from mxlab import yamlcfg  # noqa: E402

sys.path.insert(0, HERE)
from torch_required import require_microxcaling, require_torch  # noqa: E402  (this folder)

require_torch("token_mx")
import torch  # noqa: E402

import crosscheck as cc  # noqa: E402  (this folder: the token network from the configuration)

require_microxcaling("token_mx")
from mx.formats import ElemFormat  # noqa: E402
from mx.mx_ops import _quantize_mx  # noqa: E402

EXPERIMENT = os.path.join(ROOT, "experiments", "paper", "flash_study.yaml")
# (label, --run, --step, --set ...): the study's model at a small depth, width and sequence
CASES = [
    ("depth 1, width 64, 2 x 32 tokens, step 0", 0, 0, ["model.depth=1", "model.width=64", "data.batch=2",
                                                        "data.seq_len=32"]),
    ("depth 2, width 128, 4 x 64 tokens, step 7", 3, 7, ["model.depth=2", "data.batch=4", "data.seq_len=64"]),
]
REL = 2e-6
LINEAR = ("Wqkv", "Wo", "W1", "W2", "unembed")


class Twin:
    """The token network's MX step: `mx` quantizes the linear layers' operands, `attn_grad_mx` the
    gradient operands of attention's own GEMMs."""

    def __init__(self, mx=True, attn_grad_mx=True):
        self.mx, self.attn_grad_mx = mx, attn_grad_mx
        twin = self

        def q(t, axis, on=True):
            if not (twin.mx and on):
                return t
            return _quantize_mx(t, 8, ElemFormat.fp8_e4m3, shared_exp_method="max", axes=[axis], block_size=32,
                                round="even")

        def mm(a, b):  # float64 sums, rounded once
            return (a.double() @ b.double()).float()

        class Linear(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, w):
                ctx.save_for_backward(x, w)
                return mm(q(x, -1), q(w, -1).T)

            @staticmethod
            def backward(ctx, g):
                x, w = ctx.saved_tensors
                return mm(q(g, -1), q(w, 0)), mm(q(g, 0).T, q(x, 0))

        class Logits(torch.autograd.Function):  # S = Q K^T
            @staticmethod
            def forward(ctx, qq, k):
                ctx.save_for_backward(qq, k)
                return mm(qq, k.transpose(-1, -2))

            @staticmethod
            def backward(ctx, g):
                qq, k = ctx.saved_tensors
                on = twin.attn_grad_mx
                return mm(q(g, -1, on), k), mm(q(g, -2, on).transpose(-1, -2), qq)

        class Probs(torch.autograd.Function):  # O = P V
            @staticmethod
            def forward(ctx, p, v):
                ctx.save_for_backward(p, v)
                return mm(p, v)

            @staticmethod
            def backward(ctx, g):
                p, v = ctx.saved_tensors
                on = twin.attn_grad_mx
                return mm(q(g, -1, on), v.transpose(-1, -2)), mm(p.transpose(-1, -2), q(g, -2, on))

        self.linear, self.logits, self.probs = Linear.apply, Logits.apply, Probs.apply

    def attention(self, y, wqkv, wo, bo, nb, seq, heads):
        d = y.shape[-1]
        dh = d // heads
        qq, k, v = self.linear(y, wqkv).split(d, dim=-1)

        def split(t):
            return t.reshape(nb, seq, heads, dh).transpose(1, 2)

        att = self.logits(split(qq), split(k)) * (1.0 / math.sqrt(dh))
        att = att.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
        o = self.probs(torch.softmax(att, dim=-1), split(v)).transpose(1, 2).reshape(nb * seq, d)
        o = self.linear(o, wo)
        return o + bo if bo is not None else o

    def step(self, cfg, dirpath):
        """(loss, {group: gradient}) of the student on dump-step's batch."""
        names = cc.expected_groups(cfg, True)
        p = cc.load(dirpath, "student", names, torch.float32)
        for v in p.values():
            v.requires_grad_(True)
        net = cc.Net(cfg, p, True)
        if net.block != "attention" or not net.causal or net.norm != "layernorm" or not cc.tokens(cfg):
            raise AssertionError("token_mx: the case is not the study's causal token network with layernorm")
        ids = torch.tensor(np.load(os.path.join(dirpath, "x.npy"))).reshape(-1).long()
        target = torch.tensor(np.load(os.path.join(dirpath, "target.npy"))).reshape(-1)
        a = p["embed"][ids]
        nb = a.shape[0] // net.seq
        for k in range(net.depth):
            y1, wqkv = cc.norm_then_weight(net.norm, a, net.g(k, "attn_gamma"), net.g(k, "attn_beta"),
                                           net.g(k, "Wqkv"), net.eps, net.mx)
            z = a + self.attention(y1, wqkv, net.g(k, "Wo"), net.g(k, "bo"), nb, net.seq, net.heads)
            y2, w1 = cc.norm_then_weight(net.norm, z, net.g(k, "gamma"), net.g(k, "beta"), net.g(k, "W1"),
                                         net.eps, net.mx)
            o = self.linear(cc.activation(net.act, self.linear(y2, w1), 0), net.g(k, "W2"))
            if net.g(k, "b2") is not None:
                o = o + net.g(k, "b2")
            a = z + o
        loss = cc.loss_fn(cfg, self.linear(a, p["unembed"]), target)
        loss.backward()
        return float(loss), {n: p[n].grad.double().numpy() for n in names}


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def check_case(mxlab, workdir, label, run, step, sets):
    out = os.path.join(workdir, f"run{run}_step{step}")
    cmd = [mxlab, "dump-step", EXPERIMENT, "--run", str(run), "--step", str(step), "--out", out,
           "--trajectory", "mxfp8_exact", "--gemm", "double"]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    with open(os.path.join(out, "config.yaml")) as f:
        cfg = yamlcfg.parse(f.read())
    names = cc.expected_groups(cfg, True)
    lab_loss = float(np.load(os.path.join(out, "loss.npy")))
    lab = {n: np.load(os.path.join(out, f"grad.{n}.npy")).astype(np.float64) for n in names}
    loss, grads = Twin().step(cfg, out)
    _, plain = Twin(mx=False).step(cfg, out)
    _, no_attn = Twin(attn_grad_mx=False).step(cfg, out)
    print(f"\n{label} (flash_study.yaml run {run}, mxfp8_exact): loss mxlab {lab_loss:.9g}, twin {loss:.9g}")
    print(f"  {'group':20s} {'rel. diff.':>11s} {'equal':>7s} {'twin without MX':>16s} {'no attn. grad MX':>17s}")
    failures = []
    if abs(loss - lab_loss) > REL * abs(lab_loss):
        failures.append(f"loss {lab_loss} vs {loss}")
    for n in names:
        g = grads[n].reshape(lab[n].shape)
        r = rel(lab[n], g)
        print(f"  {n:20s} {r:11.2e} {np.mean(lab[n] == g):7.3f} {rel(lab[n], plain[n].reshape(lab[n].shape)):16.2e} "
              f"{rel(lab[n], no_attn[n].reshape(lab[n].shape)):17.2e}")
        if not r <= REL:
            failures.append(f"{n}: relative difference {r:.2e} > {REL}")
    # the negative control: attention's gradient operands are MX in mxlab, so leaving them out shows
    qkv = [n for n in names if n.endswith("Wqkv")]
    worst = max(rel(lab[n], no_attn[n].reshape(lab[n].shape)) for n in qkv)
    if not worst > 1e-3:
        failures.append(f"negative control: without the attention gradients' MX the Wqkv gradients differ by "
                        f"only {worst:.2e}")
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mxlab", required=True, help="the mxlab binary")
    a = ap.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as work:
        for label, run, step, sets in CASES:
            failures += [f"{label}: {f}" for f in check_case(a.mxlab, work, label, run, step, sets)]
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print(f"\ntoken_mx: the token network's MX step equals the microxcaling twin within {REL} in the loss and "
          f"every gradient ({len(CASES)} cases)")


if __name__ == "__main__":
    main()
