"""A small reader for the resolved configuration stored in every run file (`config_yaml`).

That text is what `mxlab dump-config` prints: block YAML, `key: value` lines, nested maps
indented by spaces, sequences as `- ` items. We parse that subset here instead of using
PyYAML because (1) PyYAML may be absent on the CI machine and (2) PyYAML implements YAML 1.1,
which reads `6e-4` as a *string* - a learning rate would then sort and compare as text.
Flow collections (`[a, b]`, `{k: v}`) are split one level deep, which covers `set:` patches.
"""

import re

from . import AnalysisError

_INT = re.compile(r"^[-+]?[0-9]+$")
_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
_SPECIAL_FLOATS = {".inf": float("inf"), "+.inf": float("inf"), "-.inf": float("-inf"),
                   ".nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"),
                   "nan": float("nan")}


def scalar(text):
    """Convert one YAML scalar (already stripped, comments removed) to a Python value."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "~", ""):
        return None
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    if low in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[low]
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [scalar(p.strip()) for p in _split_flow(inner)] if inner else []
    if text.startswith("{") and text.endswith("}"):
        out = {}
        for part in _split_flow(text[1:-1].strip()):
            if part.strip():
                key, _, value = part.partition(":")
                out[key.strip()] = scalar(value.strip())
        return out
    return text


def _split_flow(text):
    """Split a flow collection's body on top-level commas."""
    parts, depth, cur, quote = [], 0, [], None
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    return parts


def _strip_comment(line):
    """Remove a trailing `# comment` that is not inside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def parse(text):
    """Parse the block-YAML subset into nested dicts/lists of scalars."""
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        if raw.strip() in ("---", "..."):
            continue
        body = _strip_comment(raw).rstrip()
        if body.strip():
            lines.append((len(body) - len(body.lstrip(" ")), body.strip(), number))
    value, pos = _parse_block(lines, 0, 0 if not lines else lines[0][0])
    if pos != len(lines):
        raise AnalysisError(f"config_yaml line {lines[pos][2]}: unexpected indentation "
                            f"('{lines[pos][1]}'); is this text from `mxlab dump-config`?")
    return value if value is not None else {}


def _parse_block(lines, pos, indent):
    if pos >= len(lines):
        return None, pos
    if lines[pos][1].startswith("- ") or lines[pos][1] == "-":
        return _parse_seq(lines, pos, indent)
    return _parse_map(lines, pos, indent)


def _parse_map(lines, pos, indent, out=None):
    out = {} if out is None else out
    while pos < len(lines) and lines[pos][0] == indent and not lines[pos][1].startswith("-"):
        _, body, number = lines[pos]
        key, sep, rest = body.partition(":")
        if not sep:
            raise AnalysisError(f"config_yaml line {number}: expected 'key: value', got '{body}'")
        key, rest = key.strip(), rest.strip()
        pos += 1
        if rest:
            out[key] = scalar(rest)
        elif pos < len(lines) and (lines[pos][0] > indent or
                                   (lines[pos][0] == indent and lines[pos][1].startswith("-"))):
            out[key], pos = _parse_block(lines, pos, lines[pos][0])
        else:
            out[key] = None
    return out, pos


def _parse_seq(lines, pos, indent):
    out = []
    while pos < len(lines) and lines[pos][0] == indent and (
            lines[pos][1].startswith("- ") or lines[pos][1] == "-"):
        _, body, number = lines[pos]
        item = body[1:].strip()
        pos += 1
        if not item:
            if pos < len(lines) and lines[pos][0] > indent:
                value, pos = _parse_block(lines, pos, lines[pos][0])
            else:
                value = None
            out.append(value)
        elif ":" in item and not item.startswith(("{", "[", "'", '"')):
            # "- key: value" opens a map whose further keys sit at the item's indentation.
            item_indent = indent + (len(body) - len(item))
            first = [(item_indent, item, number)]
            sub = first + [ln for ln in lines[pos:]]
            value, used = _parse_map(sub, 0, item_indent)
            pos += used - 1
            out.append(value)
        else:
            out.append(scalar(item))
    return out, pos


def flatten(tree, prefix=""):
    """Nested dicts -> {"model.width": 512, ...}; sequences are indexed (`interventions.0.at`)."""
    flat = {}
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, (dict, list)) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def parse_flat(text):
    """The resolved config as one flat dict of dotted keys."""
    tree = parse(text)
    return flatten(tree) if isinstance(tree, (dict, list)) else {}


def format_value(value):
    """A config value as a short label (`6e-4`, `mxfp8_e4m3`, `True`)."""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
