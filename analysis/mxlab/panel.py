"""`panel RUN.h5`: one run in the layout of the paper's figures 3 and 5.

(a) loss FP32 vs MX (log), (b) bias ratio ||g~ - g||/||g|| with its running average and the
alarm level 2, (c) gradient cosine, (d) LayerNorm gamma last-bin / clamped fraction per
layer, (e) activation last-bin fraction (LN output into W1, phi output into W2).
"""

import numpy as np
from matplotlib.ticker import PercentFormatter

from . import common as C
from . import metrics
from . import schema as S
from . import yamlcfg

LAYER_CMAP = "viridis"
ACT_TENSORS = (("ln_out", "LN output (into W1)", "tab:blue"),
               ("act_out", "\u03c6 output (into W2)", "tab:red"))
LOG_Y_RANGE = 50.0  # switch the bias-ratio axis to log when max/min exceeds this


def _divergence_lines(axes, summaries):
    """Dotted vertical line at each trajectory's divergence step, on every panel; the
    first axes' legend gets one entry per line. `summaries`: [(summary, colour, label)]."""
    for summary, color, label in summaries:
        step = summary.get(S.SUM_DIVERGENCE, S.NO_STEP)
        if step is not None and int(step) != S.NO_STEP:
            for i, ax in enumerate(axes):
                ax.axvline(int(step), color=color, linestyle=":", linewidth=1.5,
                           label=f"{label} divergence step {int(step)}" if i == 0 else None)


def _quant_note(traj, dataset, run, role=None):
    """Whether the tensor was really MX-quantized (the dataset's `quantized` attribute), in
    which format: `role` is a field of the trajectory's own policy (e.g. ln_affine)."""
    q = traj.quantized(dataset)
    if q is None:
        return ""
    fields = C.policy_fields(run, traj)
    if q:
        return f"\n(quantized, {yamlcfg.format_value(fields.get(role, '?'))})" if role else ""
    return ("\n(diagnostic: not quantized; stats as "
            f"{yamlcfg.format_value(fields.get('diagnostic_format', '?'))})")


def _no_data(ax, text):
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.4",
            wrap=True)


def build(run, arm=None):
    """The panel of one MX arm (`arm`: its name; None = `mx`, or the first arm) beside FP32."""
    mx = run.arm(arm)
    fig = C.new_figure(15, 8.8)
    gs = fig.add_gridspec(2, 6)
    ax_loss = fig.add_subplot(gs[0, 0:3])
    ax_bias = fig.add_subplot(gs[0, 3:6], sharex=ax_loss)
    ax_cos = fig.add_subplot(gs[1, 0:2], sharex=ax_loss)
    ax_gamma = fig.add_subplot(gs[1, 2:4], sharex=ax_loss)
    ax_act = fig.add_subplot(gs[1, 4:6], sharex=ax_loss)
    axes = [ax_loss, ax_bias, ax_cos, ax_gamma, ax_act]
    title = C.run_title(run, mx)
    if not C.single_mx(run):
        title += f"\nMX panels: {C.arm_label(run, mx)}   (arms in this file: {', '.join(run.arms)})"
    fig.suptitle(title, fontsize=11)

    fp32 = run.fp32
    mx_label = "MX" if C.single_mx(run) else f"MX arm {mx.name}"
    summaries = [(metrics.summarize(t, run.config), color, label)
                 for t, color, label in ((mx, C.COLOR_MX, mx_label), (fp32, C.COLOR_FP32, "FP32"))
                 if t is not None]

    # (a) loss
    for traj, color, label in ((fp32, C.COLOR_FP32, "FP32"),
                               (mx, C.COLOR_MX, f"MX ({C.policy_fields(run, mx).get('weight', '?')})"
                                if C.single_mx(run) else C.arm_label(run, mx))):
        if traj is None:
            continue
        x, y = C.loss_curve(traj)
        ax_loss.plot(x, y, color=color, linewidth=0.8, label=label)
        bad = C.mark_nonfinite(ax_loss, traj, color)
        if bad is not None:
            ax_loss.plot([], [], marker="x", color=color, linestyle="none",
                         label=f"{label}: first NaN/Inf loss at step {bad}")
    ax_loss.set_yscale("log")
    ax_loss.set_ylabel("training loss (MSE, every step)")
    ax_loss.set_title("(a) loss, FP32 vs MX", loc="left")
    _divergence_lines([ax_loss], summaries)
    C.legend_outside(ax_loss, below=True, ncol=2)

    # (b) bias ratio and (c) cosine: MX only (shadow pass at the MX weights)
    if mx.get(S.DS_BIAS_RATIO) is not None:
        x, y = C.finite(mx.step, mx.get(S.DS_BIAS_RATIO))
        ax_bias.plot(x, y, color=C.COLOR_MX, linewidth=0.6, alpha=0.45,
                     label="shadow: MX vs FP32 gradient at the MX weights")
        if mx.get(S.DS_BIAS_RATIO_AVG) is not None:
            xa, ya = C.finite(mx.step, mx.get(S.DS_BIAS_RATIO_AVG))
            ax_bias.plot(xa, ya, color="black", linewidth=1.6, label="running average")
        if mx.get("cross_ratio") is not None:
            xc, yc = C.finite(mx.step, mx.get("cross_ratio"))
            ax_bias.plot(xc, yc, color="0.55", linewidth=0.6, alpha=0.6,
                         label="cross: vs the FP32 trajectory's gradient")
        ax_bias.axhline(C.BIAS_RATIO_ALARM, color="tab:red", linestyle="--", linewidth=1.2,
                        label=f"{C.BIAS_RATIO_ALARM:g}: divergence tends to follow (paper app. B)")
        positive = y[y > 0]
        if positive.size and positive.max() / positive.min() > LOG_Y_RANGE:
            ax_bias.set_yscale("log")
        else:  # the alarm line in view
            drawn = [positive] + ([yc[yc > 0]] if mx.get("cross_ratio") is not None else [])
            top = max([float(d.max()) for d in drawn if d.size] + [C.BIAS_RATIO_ALARM])
            ax_bias.set_ylim(0, 1.1 * top)
        C.legend_outside(ax_bias, below=True, ncol=2)

        xs, ys = C.finite(mx.step, mx.get(S.DS_COSINE))
        ax_cos.plot(xs, ys, color=C.COLOR_MX, linewidth=0.9, label="shadow")
        if mx.get("cross_cosine") is not None:
            xc, yc = C.finite(mx.step, mx.get("cross_cosine"))
            ax_cos.plot(xc, yc, color="0.55", linewidth=0.6, alpha=0.6, label="cross")
        ax_cos.axhline(0.0, color="0.3", linewidth=0.6)
        ax_cos.set_ylim(min(-0.05, float(np.min(ys, initial=0.0)) - 0.05), 1.05)
        C.legend_outside(ax_cos, below=True, ncol=2)
    else:
        _no_data(ax_bias, "no bias_ratio in this file")
        _no_data(ax_cos, "no cosine in this file")
    ax_bias.set_ylabel("\u2016g\u0303 \u2212 \u1e21\u2016 / \u2016\u1e21\u2016  (lower bound on \u2016\u03b6\u2016)")
    ax_bias.set_title("(b) gradient bias ratio (MX)", loc="left")
    ax_cos.set_ylabel("cos(g\u0303, \u1e21)")
    ax_cos.set_title("(c) cosine, MX vs FP32 gradient", loc="left")

    # (d) LayerNorm gamma in the last bin, per layer
    lb, cl = S.lastbin_name("gamma"), S.lastbin_name("gamma", S.SUFFIX_CLAMPED)
    if mx.get(lb) is not None and mx.get(lb).size:
        values = mx.get(lb)
        layers = values.shape[1]
        cmap = _cmap(layers)
        for k in range(layers):
            ax_gamma.plot(mx.step, values[:, k], color=cmap[k], linewidth=1.0, label=f"layer {k}")
            if mx.get(cl) is not None:
                ax_gamma.plot(mx.step, mx.get(cl)[:, k], color=cmap[k], linewidth=0.8,
                              linestyle="--")
        ax_gamma.plot([], [], color="0.3", linestyle="-", label="in last bin")
        ax_gamma.plot([], [], color="0.3", linestyle="--", label="clamped (overflowed)")
        C.legend_outside(ax_gamma, below=True, fontsize=7, ncol=3)
        ax_gamma.set_ylim(0, 1.05)
        ax_gamma.set_yticks(np.linspace(0, 1, 6))
        ax_gamma.set_title("(d) LN \u03b3 in the last quantization bin" +
                           _quant_note(mx, lb, run, "ln_affine"),
                           loc="left", fontsize=10)
    else:
        _no_data(ax_gamma, "no LayerNorm \u03b3 in this run\n(model.layernorm or ln_affine off)")
        ax_gamma.set_title("(d) LN \u03b3 in the last quantization bin", loc="left", fontsize=10)
    ax_gamma.yaxis.set_major_formatter(PercentFormatter(xmax=1))
    ax_gamma.set_ylabel("fraction of \u03b3 elements")

    # (e) activations in the last bin: mean over layers (thick), each layer (thin)
    drew = False
    for tensor, label, color in ACT_TENSORS:
        values = mx.get(S.lastbin_name(tensor))
        if values is None or not values.size:
            continue
        drew = True
        for k in range(values.shape[1]):
            ax_act.plot(mx.step, values[:, k], color=color, linewidth=0.5, alpha=0.35)
        ax_act.plot(mx.step, np.nanmean(values, axis=1), color=color, linewidth=1.6,
                    label=f"{label}{_quant_note(mx, S.lastbin_name(tensor), run).replace(chr(10), ' ')}")
    if drew:
        ax_act.plot([], [], color="0.4", linewidth=0.5, label="thin: each layer; thick: mean")
        ax_act.set_ylim(bottom=0)
        C.legend_outside(ax_act, below=True, fontsize=7, ncol=2)
    else:
        _no_data(ax_act, "no activation last-bin data")
    ax_act.yaxis.set_major_formatter(PercentFormatter(xmax=1, decimals=1))
    ax_act.set_ylabel("fraction of elements in last bin")
    ax_act.set_title("(e) activations in the last quantization bin", loc="left", fontsize=10)

    for ax in axes:
        ax.grid(True, alpha=0.25)
    for ax in axes[2:]:
        ax.set_xlabel("step")
    ax_loss.set_xlabel("step")
    ax_bias.set_xlabel("step")
    _divergence_lines(axes[1:], summaries)
    return fig


def _cmap(n):
    from matplotlib import colormaps
    cmap = colormaps[LAYER_CMAP]
    return [cmap(0.85 * k / max(n - 1, 1)) for k in range(n)]
