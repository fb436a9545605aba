"""Command line: `python3 -m mxlab <panel|interventions|grid|curves|summary|warn|survival|report> ...`
(or `analysis/mxlab-plot ...`). Errors in the input print one line and exit 2. A command over
a directory keeps going past a file it cannot read (summary gives it an `unreadable` row, the
figures and reports leave it out with a note), writes its output and then exits 2 with one
line naming the unreadable file(s)."""

import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only; never open a window (CI and ssh sessions have no display)

from . import AnalysisError  # noqa: E402
from . import common as C  # noqa: E402
from . import schema as S  # noqa: E402
from . import sweep  # noqa: E402

PROG = "mxlab-plot"


def _default_out(path, kind):
    stem = os.path.splitext(os.path.basename(os.path.normpath(path)))[0]
    return f"{stem}-{kind}.png"


def _load_dir(args):
    """Every run file of args.dir, loaded once (sweep.Loaded); the unreadable ones are kept on
    args for main's closing line."""
    loaded = sweep.load_all(S.find_runs(args.dir))
    args.unreadable, args.files = sweep.unreadable(loaded), len(loaded)
    return loaded


def _cmd_panel(args):
    from . import panel
    run = S.load_run(args.run)
    out = args.out or _default_out(args.run, "panel")
    return C.save(panel.build(run, arm=args.arm), out, args.pdf)


def _cmd_interventions(args):
    from . import interventions
    run = S.load_run(args.run)
    out = args.out or _default_out(args.run, "interventions")
    return C.save(interventions.build(run, xlim=args.xlim, arms=args.arm), out, args.pdf)


def _cmd_grid(args):
    from . import grid
    out = args.out or _default_out(args.dir[0], f"grid-{args.metric}")
    fig = grid.build(_load_dir(args), args.x, args.y, args.metric,
                     where=args.where, agg=args.agg, arms=args.arm)
    return C.save(fig, out, args.pdf)


def _cmd_curves(args):
    from . import curves
    out = args.out or _default_out(args.dir[0], "curves")
    fig = curves.build(_load_dir(args), row=args.row, color=args.color or
                       ["model.depth", "model.width"], where=args.where)
    return C.save(fig, out, args.pdf)


def _cmd_summary(args):
    from . import summary
    rows, columns = summary.collect(_load_dir(args))
    text = summary.to_csv(rows, columns) if args.csv else summary.to_text(rows, columns)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
        return [args.out]
    sys.stdout.write(text)
    return []


def _cmd_warn(args):
    from . import warn
    signals = [s.strip() for s in args.signals.split(",") if s.strip()] if args.signals else None
    return warn.run_command(_load_dir(args), out=args.out, csv_path=args.csv, pdf=args.pdf,
                            signals=signals, fp32=args.fp32, branches=not args.no_branches,
                            max_fpr=args.max_fpr, where=args.where)


def _cmd_survival(args):
    from . import survival
    out = args.out or _default_out(args.dir[0], "survival")
    return survival.run_command(_load_dir(args), args.by, out=out, csv_path=args.csv,
                                pdf=args.pdf, band=args.band, where=args.where,
                                fp32=not args.no_fp32, branches=not args.no_branches)


def _cmd_report(args):
    from . import report
    loaded = sweep.load_all(S.find_runs([args.dir]))
    args.unreadable, args.files = sweep.unreadable(loaded), len(loaded)
    return report.run_command(args.dir, loaded, out=args.out, by=args.by, binary=args.mxlab,
                              max_runs=args.max_runs, use_binary=not args.no_mxlab)


def make_parser():
    p = argparse.ArgumentParser(prog=PROG, description="Figures and tables from mxlab run files "
                                "(HDF5, lab/train/SCHEMA.md).")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def style_opt(sp):
        sp.add_argument("--style", default="default", choices=C.STYLES,
                        help="default: large figures titled with the runs; paper: at most "
                        f"{C.PAPER_WIDTH:g} in wide, text <= {C.PAPER_FONT:g} pt, no figure "
                        "title, a vector PDF beside the PNG")

    def figure_opts(sp, what):
        sp.add_argument("-o", "--out", help=f"output PNG (default: ./<name>-{what}.png)")
        sp.add_argument("--pdf", action="store_true", help="also write a PDF next to the PNG")
        style_opt(sp)

    sp = sub.add_parser("panel", help="loss, bias ratio, cosine, last-bin fractions of one run "
                        "(paper figures 3 and 5)")
    sp.add_argument("run", metavar="RUN.h5")
    sp.add_argument("--arm", metavar="NAME", help="the MX arm to draw (default: mx, or the "
                    "file's first arm)")
    figure_opts(sp, "panel")
    sp.set_defaults(func=_cmd_panel)

    sp = sub.add_parser("interventions", help="baseline, FP32 and every branch's loss, one "
                        "subplot per intervention step (paper figure 4)")
    sp.add_argument("run", metavar="RUN.h5")
    sp.add_argument("--xlim", default="auto", help="auto (from a little before each "
                    "intervention), full, or A:B steps")
    sp.add_argument("--arm", action="append", metavar="NAME", help="only branches forking "
                    "from this arm (repeatable; default: every arm, one row each)")
    figure_opts(sp, "interventions")
    sp.set_defaults(func=_cmd_interventions)

    sp = sub.add_parser("grid", help="heatmap of a metric over two swept config keys, FP32 and "
                        "each MX arm side by side (paper figures 6 and 9)")
    sp.add_argument("dir", nargs="+", metavar="DIR", help="sweep output directory (or run files)")
    sp.add_argument("--x", default="model.width", help="config key on the x axis (dotted)")
    sp.add_argument("--y", default="model.depth", help="config key on the y axis (dotted)")
    sp.add_argument("--metric", default="final_loss",
                    choices=("final_loss", "divergence_step", "spike_count", "spike_score",
                             "min_loss", "diverged"))
    sp.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                    help="keep only runs whose config has this value (repeatable)")
    sp.add_argument("--agg", default=None, choices=("mean", "median", "min", "max", "sum"),
                    help="how runs sharing a cell (seeds, other swept keys) combine "
                    "(default: mean; min for divergence_step)")
    sp.add_argument("--arm", action="append", metavar="NAME", help="only this MX arm "
                    "(repeatable; default: one heatmap per arm found)")
    figure_opts(sp, "grid")
    sp.set_defaults(func=_cmd_grid)

    sp = sub.add_parser("curves", help="loss curves of a sweep: FP32 and each MX recipe (arm) in "
                        "columns, a key in rows, colour by model size (paper figures 2 and 6)")
    sp.add_argument("dir", nargs="+", metavar="DIR", help="sweep output directory (or run files)")
    sp.add_argument("--row", help="config key whose values make the rows (e.g. optimizer.lr)")
    sp.add_argument("--color", action="append", metavar="KEY",
                    help="config key(s) that pick the colour (repeatable; default "
                    "model.depth and model.width)")
    sp.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                    help="keep only runs whose config has this value (repeatable)")
    figure_opts(sp, "curves")
    sp.set_defaults(func=_cmd_curves)

    sp = sub.add_parser("warn", help="early warning: per signal, ROC over alarm thresholds "
                        "(diverging vs stable trajectories), AUC, lead time")
    sp.add_argument("dir", nargs="+", metavar="DIR", help="directory of run files (or files)")
    sp.add_argument("-o", "--out", help="write the figure (PNG): ROC per signal and lead times")
    sp.add_argument("--pdf", action="store_true", help="also write a PDF next to the PNG")
    style_opt(sp)
    sp.add_argument("--csv", metavar="OUT.csv", help="one row per signal x direction x threshold")
    sp.add_argument("--signals", metavar="A,B", help="only these signals (default: all; names "
                    "in analysis/README.md)")
    sp.add_argument("--fp32", action="store_true", help="include the FP32 trajectories "
                    "(default: arms and branches only)")
    sp.add_argument("--no-branches", action="store_true", help="leave out the branches")
    sp.add_argument("--max-fpr", type=float, metavar="F", help="best threshold: the largest "
                    "hit rate with false-alarm rate <= F (default: largest TPR - FPR)")
    sp.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                    help="keep only runs whose config has this value (repeatable)")
    sp.set_defaults(func=_cmd_warn)

    sp = sub.add_parser("survival", help="Kaplan-Meier curves of steps to divergence per group, "
                        "95 %% bands, pairwise log-rank p-values")
    sp.add_argument("dir", nargs="+", metavar="DIR", help="directory of run files (or files)")
    sp.add_argument("--by", required=True, metavar="KEY[,KEY]", help="group by these keys: "
                    "'arm' (the trajectory's group name: fp32, an arm, a branch) and/or dotted "
                    "config keys, e.g. --by arm,optimizer.lr")
    sp.add_argument("--band", default="loglog", choices=("loglog", "plain"),
                    help="95 %% band from Greenwood's variance: on log(-log S) (default) or on S")
    sp.add_argument("--csv", metavar="OUT.csv", help="the KM table: group, step, at_risk, "
                    "events, survival, lower, upper")
    sp.add_argument("--no-fp32", action="store_true", help="leave out the FP32 trajectories")
    sp.add_argument("--no-branches", action="store_true", help="leave out the branches")
    sp.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                    help="keep only runs whose config has this value (repeatable)")
    figure_opts(sp, "survival")
    sp.set_defaults(func=_cmd_survival)

    sp = sub.add_parser("summary", help="one row per trajectory (FP32, each arm) and branch: "
                        "status, divergence, spikes, losses, bias, last-bin")
    sp.add_argument("dir", nargs="+", metavar="DIR", help="directory of run files (or files)")
    sp.add_argument("--csv", action="store_true", help="CSV instead of an aligned table")
    sp.add_argument("-o", "--out", help="write to this file instead of stdout")
    sp.set_defaults(func=_cmd_summary)

    sp = sub.add_parser("report", help="one self-contained HTML page for a results directory: the "
                        "summary tables and the standard figures embedded (DIR/report.html)")
    sp.add_argument("dir", metavar="DIR", help="results directory (the run files of `mxlab run --out DIR`)")
    sp.add_argument("-o", "--out", help="the HTML file (default: DIR/report.html)")
    sp.add_argument("--by", default="arm", metavar="KEY[,KEY]", help="group the per-group tables and the "
                    "Kaplan-Meier figure by these keys (default: arm; e.g. arm,optimizer.lr)")
    which = sp.add_mutually_exclusive_group()
    which.add_argument("--mxlab", metavar="PATH", help="the mxlab program for the tables of `mxlab summarize` "
                       "(default: $MXLAB_BINARY, `mxlab` on PATH, build/mxlab of the checkout; without one, "
                       "the Python summary)")
    which.add_argument("--no-mxlab", action="store_true", help="the Python summary table even where an "
                       "mxlab program is found")
    sp.add_argument("--max-runs", type=int, default=8, metavar="N", help="draw the panel (and the "
                    "interventions) of the first N runs (default 8)")
    sp.set_defaults(func=_cmd_report)
    return p


def _unreadable_text(args):
    """`k of n run files could not be read (...)`: the first one's reason, and how many more."""
    bad = args.unreadable
    what = "their rows say 'unreadable'" if args.command == "summary" else "left out"
    text = f"{len(bad)} of {args.files} run files could not be read ({what}): {bad[0].error}"
    return text + (f"; and {len(bad) - 1} more" if len(bad) > 1 else "")


def main(argv=None):
    args = make_parser().parse_args(argv)
    args.unreadable, args.files = [], 0
    try:
        with C.using_style(getattr(args, "style", "default")):
            written = args.func(args)
    except AnalysisError as e:
        more = f" [{_unreadable_text(args)}]" if args.unreadable else ""
        print(f"{PROG} {args.command}: error: {e}{more}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    if args.unreadable:
        print(f"{PROG} {args.command}: error: {_unreadable_text(args)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
