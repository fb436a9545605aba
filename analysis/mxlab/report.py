"""`report DIR`: one self-contained HTML page for a results directory (DIR/report.html, or -o):
the summary tables and the standard figures, the figures embedded as PNG data URIs, no external
asset, script or style sheet, nothing that needs a server.

Tables: with the `mxlab` program (--mxlab PATH, else $MXLAB_BINARY, else `mxlab` on PATH, else
build/mxlab of the checkout this module sits in), the tables of `mxlab summarize DIR --csv` (one
row per trajectory and branch, the excursion events included), of `--by KEY --branches --csv`
(per group: k/n with a Wilson interval, Kaplan-Meier) and of `--compare-csv` (every pair of
groups: Fisher, log-rank, McNemar); without it, the Python summary (`summary DIR`, the same rows
without the events) and a note saying how to get the rest. Figures: the loss curves (`curves`),
Kaplan-Meier curves by the same keys (`survival --by`), and for the first --max-runs runs the
panel (`panel`) and, where the run has branches, the interventions (`interventions`). A figure
that cannot be drawn for this directory becomes a note in the page, not an error.
"""

import base64
import csv
import html
import io
import os
import re
import shutil
import subprocess
import tempfile

from . import AnalysisError, __version__
from . import common as C
from . import summary
from . import survival
from . import sweep

FIG_DPI = 80  # small enough that a page of a dozen figures stays a few MB, sharp on a screen
TIMEOUT_S = 600


def find_binary(explicit=None):
    """The `mxlab` program to ask for the tables, or None."""
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise AnalysisError(f"--mxlab {explicit}: no such executable (build it: cmake --build build "
                                "--target mxlab)")
        return explicit
    env = os.environ.get("MXLAB_BINARY")
    if env and os.path.isfile(env) and os.access(env, os.X_OK):
        return env
    on_path = shutil.which("mxlab")
    if on_path:
        return on_path
    here = os.path.dirname(os.path.abspath(__file__))
    checkout = os.path.join(os.path.dirname(os.path.dirname(here)), "build", "mxlab")
    if os.path.isfile(checkout) and os.access(checkout, os.X_OK):
        return checkout
    return None


def _read_csv(text):
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return None
    return rows[0], rows[1:]


def binary_tables(binary, directory, by):
    """[(title, (header, rows) or None, note or None)] from `mxlab summarize`."""
    out = []

    def run(args, title, what):
        try:
            r = subprocess.run([binary, "summarize", directory] + args, capture_output=True, text=True,
                               timeout=TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            out.append((title, None, f"`mxlab summarize {' '.join(args)}` failed: {e}"))
            return None
        note = None
        if r.returncode != 0:  # 2 with unreadable files: the rows are still there
            note = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit status {r.returncode}"
        return r.stdout, note

    res = run(["--csv"], "Trajectories", "trajectories")
    if res is not None:
        stdout, note = res
        out.append(("Trajectories", _read_csv(stdout), note))
    with tempfile.TemporaryDirectory() as tmp:
        pairs_path = os.path.join(tmp, "pairs.csv")
        res = run(["--by", by, "--branches", "--csv", "--compare-csv", pairs_path], f"Groups by {by}", "groups")
        if res is not None:
            stdout, note = res
            out.append((f"Groups by {by}", _read_csv(stdout), note))
            pairs = None
            if os.path.exists(pairs_path):
                with open(pairs_path, encoding="utf-8") as f:
                    pairs = _read_csv(f.read())
            out.append((f"Pairs of groups by {by}", pairs, None if pairs else "no pairs table was written"))
    return out


def python_table(loaded):
    rows, columns = summary.collect(loaded)
    text = summary.to_csv(rows, columns)
    return _read_csv(text)


def _png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=FIG_DPI)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def figures(loaded, by, max_runs):
    """[(title, base64 PNG or None, note or None)]."""
    from . import curves, interventions, panel
    out = []

    def add(title, build):
        try:
            out.append((title, _png(build()), None))
        except AnalysisError as e:
            out.append((title, None, f"not drawn: {e}"))

    add("Loss curves (FP32 and each MX recipe; seed median and 25-75 % band)",
        lambda: curves.build(loaded, color=["model.depth", "model.width"]))
    keys = survival.parse_keys(by)

    def km():
        groups, notes = survival.collect(loaded, keys)
        km_curves, tests = survival.estimate(groups)
        return survival.build(keys, km_curves, tests, notes)

    add(f"Kaplan-Meier survival of steps to divergence, by {by}", km)
    runs = [item.run for item in loaded if item.run is not None]
    for run in runs[:max_runs]:
        add(f"Run {run.run_id}: loss, bias ratio, cosine, last-bin fractions", lambda run=run: panel.build(run))
        if run.branches:
            add(f"Run {run.run_id}: interventions", lambda run=run: interventions.build(run))
    if len(runs) > max_runs:
        out.append(("More runs", None, f"panels of the first {max_runs} of {len(runs)} runs "
                    "(--max-runs N draws more)"))
    return out


def _is_float(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


FLOAT = re.compile(r"-?(\d+\.\d*|\.\d+)([eE][-+]?\d+)?|-?\d+[eE][-+]?\d+")
TEXT_COLUMNS = ("run_id", "file", "group", "arm", "a_arm", "b_arm", "status", "source", "error", "note")


def _cell(column, text):
    """Display text of one CSV cell: '-' for 'no such step' (-1), floats to 4 significant
    digits (the exact value in the tooltip), file paths as their base name; identifiers as
    they are (a run id of digits and one 'e' is no number)."""
    if column in TEXT_COLUMNS:
        return (os.path.basename(text), text) if column == "file" and text else (text, None)
    if text == "-1" and (column.endswith("_step") or column.endswith("_at")):
        return "-", None
    if FLOAT.fullmatch(text):
        return f"{float(text):.4g}", text
    return text, None


def _table(header, rows):
    parts = ["<table>", "<thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr></thead>",
             "<tbody>"]
    for row in rows:
        cells = []
        for column, text in zip(header, row):
            shown, full = _cell(column, text)
            cls = "t" if column in TEXT_COLUMNS or not (_is_float(text) or shown == "-") else "n"
            title = f' title="{html.escape(full)}"' if full and full != shown else ""
            cells.append(f'<td class="{cls}"{title}>{html.escape(shown)}</td>')
        parts.append("<tr>" + "".join(cells) + "</tr>")
    parts.append("</tbody></table>")
    return "\n".join(parts)


STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#111}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse;font-size:12px;margin:.4em 0}
th,td{border:1px solid #ccc;padding:2px 6px;white-space:nowrap}
th{background:#eee;position:sticky;top:0}td.n{text-align:right}td.t{text-align:left}
.scroll{overflow-x:auto}figure{margin:1em 0}img{max-width:100%;height:auto}
figcaption{font-size:.9em;color:#333}.note{color:#8a1c00}code{background:#f3f3f3}"""


def render(directory, loaded, tables, figs, source, notes):
    title = f"mxlab report: {directory}"
    readable = [item for item in loaded if item.run is not None]
    swept = sweep.swept_keys([item.run for item in readable])
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           f"<title>{html.escape(title)}</title>", f"<style>{STYLE}</style>", "</head>", "<body>",
           f"<h1>{html.escape(title)}</h1>",
           f"<p>{len(loaded)} run files ({len(loaded) - len(readable)} unreadable); swept keys: "
           f"{html.escape(', '.join(swept) or 'none')}. Tables from {html.escape(source)}; written by "
           f"<code>python3 -m mxlab report</code> (mxlab {__version__}).</p>"]
    for note in notes:
        out.append(f'<p class="note">{html.escape(note)}</p>')
    for heading, table, note in tables:
        out.append(f"<h2>{html.escape(heading)}</h2>")
        if note:
            out.append(f'<p class="note">{html.escape(note)}</p>')
        if table is not None:
            header, rows = table
            out.append(f'<div class="scroll">{_table(header, rows)}</div>')
    out.append("<h2>Figures</h2>")
    for caption, png, note in figs:
        if png is None:
            out.append(f'<p class="note">{html.escape(caption)}: {html.escape(note)}</p>')
            continue
        out.append(f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{png}">'
                   f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    out += ["</body>", "</html>", ""]
    return "\n".join(out)


def write(path, text):
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise AnalysisError(f"{path}: directory {directory} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".report.", suffix=".tmp", dir=directory)
    except OSError as e:
        raise AnalysisError(f"{path}: could not be written ({e.strerror or e})") from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp's 0600 would hide the page from the group
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise AnalysisError(f"{path}: could not be written ({e.strerror or e})") from None
    return path


def run_command(directory, loaded, out=None, by="arm", binary=None, max_runs=8, use_binary=True):
    """Write the report of `directory` (its files already loaded); returns [the path].
    use_binary=False: the Python summary even where an mxlab program is found."""
    if max_runs < 0:
        raise AnalysisError(f"--max-runs {max_runs}: must be >= 0")
    out = out or os.path.join(directory, "report.html")
    program = find_binary(binary) if use_binary else None
    notes = []
    if program:
        tables = binary_tables(program, directory, by)
        source = f"{program} summarize"
    else:
        tables = [("Trajectories", python_table(loaded), None)]
        source = "the Python summary (mxlab.summary)"
        why = ("--no-mxlab" if not use_binary else
               "No mxlab program found (--mxlab PATH, $MXLAB_BINARY, PATH, build/mxlab)")
        notes.append(f"{why}: the trajectory table is the Python summary, without the excursion events, and the "
                     "per-group and pairwise tables of `mxlab summarize --by` are left out.")
    figs = figures(loaded, by, max_runs)
    return [write(out, render(directory, loaded, tables, figs, source, notes))]
