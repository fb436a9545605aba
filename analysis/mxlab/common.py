"""Shared pieces of the figures: colours, the run description in titles, legends outside the
data, the figure style (`default` for looking at runs, `paper` for a paper), saving."""

import contextlib
import os

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from . import AnalysisError
from . import metrics
from . import schema as S
from . import yamlcfg

# The paper draws FP32 in blue and MX in yellow/orange; keep that so figures read alike.
COLOR_FP32 = "tab:blue"
COLOR_MX = "tab:orange"
BRANCH_COLORS = ("tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
                 "tab:cyan", "tab:gray")
BIAS_RATIO_ALARM = 2.0  # the paper (appendix B.2): divergence follows once the average nears 2
DPI = 130


def cfg(run, key, default="?"):
    return yamlcfg.format_value(run.config.get(key, default))


NO_PRESET = "none"  # what the trainer stores as `apply:` of a patch made of `set:` items only


def config_entry(run, section, name):
    """The entry called `name` in the config's `section` list (interventions, arms) as
    (preset or None, {precision field: value}); None if not listed. The trainer stores
    `apply: none` for an entry without a preset: that is no preset."""
    for i in range(1000):
        entry = run.config.get(f"{section}.{i}.name")
        if entry is None:
            return None
        if entry == name:
            apply = run.config.get(f"{section}.{i}.apply")
            apply = None if apply in (None, "", NO_PRESET) else str(apply)
            prefix = f"{section}.{i}.set."
            sets = {k[len(prefix):]: v for k, v in run.config.items() if k.startswith(prefix)}
            return apply, sets
    return None


def _parse_policy(text):
    """The group attribute `policy` (`weight=mxfp8_e4m3 activation=... scale_rule=floor ...`,
    every field of the precision policy the trainer resolved) as {field: value}; {} for none."""
    out = {}
    for token in str(text or "").split():
        key, sep, value = token.partition("=")
        if sep and key:
            out[key] = yamlcfg.scalar(value)
    return out


def policy_fields(run, traj=None):
    """{field: value} of the precision policy `traj` ran (field names of `precision:`): the
    config's `precision`, with the `set:` items of the group's arms/interventions entry over it,
    and over both the group's `policy` attribute (what the trainer resolved, presets included)
    where the file has one. A branch starts from the policy of the arm it forks from. `traj`
    None: the config's `precision` (the base policy)."""
    if traj is not None and traj.kind == "branch" and run.parent(traj) is not None:
        fields = policy_fields(run, run.parent(traj))
    else:
        fields = {k[len("precision."):]: v for k, v in run.config.items()
                  if k.startswith("precision.")}
    if traj is None or traj.is_fp32:
        return fields
    entry = config_entry(run, "interventions" if traj.kind == "branch" else "arms", traj.name)
    if entry is not None:
        fields.update(entry[1])
    fields.update(_parse_policy(traj.attrs.get(S.ATTR_POLICY)))
    return fields


def precision_text(run, traj=None):
    """`MX mxfp8_e4m3 (W/A/G), LN affine mxfp8_e4m3, scale rule floor` - the policy of `traj`
    (an arm or branch, see policy_fields; None: the config's base `precision`) in a line."""
    c = policy_fields(run, traj)
    w, a, g = (c.get(k, "?") for k in ("weight", "activation", "grad"))
    fmts = f"{w} (W/A/G)" if w == a == g else f"W {w} / A {a} / G {g}"
    # The backward GEMMs' own roles, where they do not follow the forward ones (W in dgrad, X in
    # wgrad, dY in wgrad).
    bwd = [f"{label} {c[k]}"
           for k, label, fwd in (("weight_bwd", "Wbwd", w), ("activation_bwd", "Abwd", a),
                                 ("grad_wgrad", "Gwgrad", g))
           if c.get(k, "same") not in ("same", None, fwd)]
    if bwd:
        fmts += " [" + ", ".join(bwd) + "]"
    parts = [fmts]
    if c.get("backward") is False:
        parts.append("forward only")
    if "ln_affine" in c:
        parts.append(f"LN affine {c['ln_affine']}")
    parts.append(f"scale rule {c.get('scale_rule', '?')}")
    return ", ".join(parts)


PATCH_CHARS = 48  # legend/title room for a patch's text
GEMM_ROLES = ("weight", "activation", "grad")  # a patch setting all three to one format: W/A/G=


def config_patch(run, section, name):
    """What the config's `section` list (interventions, arms) applies for the entry called
    `name`: its preset and its `set:` items, `to_fp32, activation=bf16`; "" for neither; None
    if not listed."""
    entry = config_entry(run, section, name)
    if entry is None:
        return None
    apply, sets = entry
    sets = dict(sets)
    roles = [sets.get(k) for k in GEMM_ROLES]
    merged = []
    if roles[0] is not None and roles.count(roles[0]) == len(roles):  # one format for W, A, G
        merged = [f"W/A/G={yamlcfg.format_value(roles[0])}"]
        for k in GEMM_ROLES:
            del sets[k]
    parts = ([apply] if apply else []) + merged + [f"{k}={yamlcfg.format_value(v)}"
                                                   for k, v in sorted(sets.items())]
    return ", ".join(parts)


def patch_text(run, traj):
    """A group's patch in a line: from the config entry of that name (arms or interventions),
    else the group's `patch` attribute; "" for none."""
    section = "interventions" if traj.kind == "branch" else "arms"
    text = config_patch(run, section, traj.name)
    if text is None:
        text = " ".join(str(traj.attrs.get(S.ATTR_PATCH, "")).split())
        text = "" if text in ("{}", "") else text
    return text if len(text) <= PATCH_CHARS else text[:PATCH_CHARS - 1] + "\u2026"


def single_mx(run):
    """A file before arms, or one whose only arm is `mx` with no patch: figures say "MX" as
    they always did."""
    if run.arms != [S.TRAJ_MX]:
        return False
    return patch_text(run, run.trajectories[S.TRAJ_MX]) == ""


def arm_label(run, traj):
    """`MX` for the one arm of a file before arms, else `arm NAME (patch)`."""
    if single_mx(run) and traj.name == S.TRAJ_MX:
        return "MX"
    patch = patch_text(run, traj)
    return f"arm {traj.name}" + (f" ({patch})" if patch else "")


def select_arms(found, wanted, what):
    """`found` (arm names, in order) kept to those in `wanted` (None: all); a name not found
    is an AnalysisError that says `what` was searched and lists what there is."""
    if not wanted:
        return list(found)
    unknown = [a for a in wanted if a not in found]
    if unknown:
        raise AnalysisError(f"--arm {', '.join(unknown)}: no {what}; there are: "
                            f"{', '.join(found) or 'none'}")
    return [a for a in found if a in wanted]


def model_text(run):
    return (f"L={cfg(run, 'model.depth')} d={cfg(run, 'model.width')} "
            f"{cfg(run, 'model.activation')} B={cfg(run, 'data.batch')} "
            f"lr={cfg(run, 'optimizer.lr')} {cfg(run, 'optimizer.name')}")


def run_title(run, traj=None):
    """Run id, status, model and precision in two lines: the precision of `traj` (the arm a
    figure draws), else of the file's one arm, else the base policy, said so, that its arms
    patch."""
    status = f"status: {run.status}"
    if run.truncated or run.status == S.STATUS_RUNNING:
        last = max((int(g.step[-1]) for g in run.groups() if g.n), default=0)
        status += f" - unfinished file, logged up to step {last}"
    if traj is None and len(run.arms) == 1:
        traj = run.trajectories[run.arms[0]]
    precision = precision_text(run, traj)
    if traj is None:
        precision = f"base policy {precision} (each arm patches it)"
    return (f"run {run.run_id}  [{status}]\n{model_text(run)}  |  {precision}"
            f"  |  {cfg(run, 'steps')} steps")


def finite(x, y):
    """Points where y is finite (bias rows are NaN where the shadow pass did not run)."""
    x, y = np.asarray(x), np.asarray(y, dtype=np.float64)
    keep = np.isfinite(y)
    return x[keep], y[keep]


def loss_curve(traj):
    """(steps, loss) of every step when loss_all is there, else of the logged rows."""
    if traj.loss_all.size:
        return np.arange(traj.loss_all.size) + metrics.step_offset(traj), traj.loss_all
    return traj.step, traj.loss


def mark_nonfinite(ax, traj, color):
    """An x at the top edge where the loss first became NaN/Inf (log axes cannot show it)."""
    steps, loss = loss_curve(traj)
    bad = np.nonzero(~np.isfinite(loss))[0]
    if bad.size:
        ax.plot([steps[bad[0]]], [1.0], marker="x", color=color, markersize=9, mew=2,
                transform=ax.get_xaxis_transform(), clip_on=False, linestyle="none")
        return int(steps[bad[0]])
    return None


# Figure styles. `default`: large diagnostic figures whose titles name the runs. `paper`: at
# most a two-column paper's text width, every text at most PAPER_FONT points, no figure title
# (a paper's caption says what the figure is), a vector PDF beside the PNG (which is drawn at
# PAPER_DPI).
STYLES = ("default", "paper")
PAPER_WIDTH = 7.0   # inches
PAPER_FONT = 8.0    # points, the largest text of a paper figure
PAPER_DPI = 300
PAPER_RC = {"font.size": PAPER_FONT, "axes.titlesize": PAPER_FONT, "axes.labelsize": PAPER_FONT,
            "xtick.labelsize": PAPER_FONT - 1, "ytick.labelsize": PAPER_FONT - 1,
            "legend.fontsize": PAPER_FONT - 1, "lines.linewidth": 1.0, "axes.linewidth": 0.6,
            "pdf.fonttype": 42, "svg.fonttype": "none"}  # text stays text in the vector files
_style = ["default"]


def style():
    """The style figures are drawn in now: "default" or "paper"."""
    return _style[0]


@contextlib.contextmanager
def using_style(name):
    """Draw and save figures in style `name` (STYLES) inside the block."""
    if name not in STYLES:
        raise AnalysisError(f"--style {name}: unknown; use one of {', '.join(STYLES)}")
    before = _style[0]
    _style[0] = name
    try:
        with matplotlib.rc_context(PAPER_RC if name == "paper" else {}):
            yield
    finally:
        _style[0] = before


def legend_outside(ax, handles=None, below=False, **kwargs):
    """The axes' legend beside its axes (right; `below`: under the x-axis label), never over the
    data: constrained layout makes room for it."""
    kwargs.setdefault("fontsize", 8)
    if style() == "paper":  # narrow panels: one column of entries
        kwargs.update(fontsize=PAPER_FONT - 1, ncol=1 if below else kwargs.get("ncol", 1))
    if handles is not None:
        kwargs["handles"] = handles
    if below:
        return ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), borderaxespad=0.0,
                         frameon=False, **kwargs)
    return ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                     frameon=False, **kwargs)


def new_figure(width, height):
    """A figure of `width` x `height` inches; in the paper style at most PAPER_WIDTH wide, its
    height scaled by the square root of the width's factor (the text shrinks less than the
    figure: it keeps the room it needs)."""
    if style() == "paper" and width > PAPER_WIDTH:
        width, height = PAPER_WIDTH, height * (PAPER_WIDTH / width) ** 0.5
    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _paper_finish(fig):
    """Paper style: no figure title, no text above PAPER_FONT points."""
    if getattr(fig, "_suptitle", None) is not None:
        fig._suptitle.set_visible(False)
    from matplotlib.text import Text
    for text in fig.findobj(Text):
        if text.get_fontsize() > PAPER_FONT:
            text.set_fontsize(PAPER_FONT)


def save(fig, out, pdf=False):
    """Write `out` (PNG) and, with pdf (always in the paper style), the same figure as a PDF
    beside it."""
    directory = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(directory):
        raise AnalysisError(f"{out}: directory {directory} does not exist")
    paper = style() == "paper"
    if paper:
        _paper_finish(fig)
        pdf = True
    fig.savefig(out, dpi=PAPER_DPI if paper else DPI)
    written = [out]
    if pdf and os.path.splitext(out)[1].lower() != ".pdf":
        pdf_path = os.path.splitext(out)[0] + ".pdf"
        fig.savefig(pdf_path)
        written.append(pdf_path)
    return written
