"""Config fields that carry their own parse type, help text and range: `param(...)`.

The samplers' configs (each in its sampler's module, `samplers/<name>.py`) and the report's options (`report/options.py`)
declare their fields with `param`; the command line builds one flag per such field from this
metadata (`sinklens/cli/fields.py`), and `check_fields` checks a config against it, so a
parameter is written once. Imports nothing (the command line answers --help without torch).
"""
from __future__ import annotations

import math
from dataclasses import field, fields


def param(default, type: type, help: str, *, min=None, gt=None, max=None, lt=None, choices=None, flag=None,
          old_flags=()):
    """A config field: default, parse type (int | float | str | bool | "ids" | "indices" | "pairs"),
    help text and the allowed values (min/max inclusive, gt/lt exclusive, or choices). A None
    default means "not set" (the model's value, or off) and is always allowed. `flag`: the
    command-line flag when it is not `--` + the field name with dashes; `old_flags`: earlier
    spellings still accepted, with a deprecation note. A `dataclasses.MISSING`
    default makes a required field (a required flag).
    "ids": token ids >= 0 (one or a list); "indices": a list of integers >= 0 (steps, layers);
    "pairs": a list of (a, b) integer pairs >= 0, written A:B,A:B (layer:head)."""
    meta = dict(type=type, help=help, min=min, gt=gt, max=max, lt=lt, choices=choices, flag=flag,
                old_flags=tuple(old_flags))
    return field(default=default, metadata=meta)


def param_like(cls, name: str, **changes):
    """A field declared like `cls`'s `param` field `name` (default, type, help, range), with
    `changes` to its metadata: one setting that two configs carry is written once."""
    f = next(f for f in fields(cls) if f.name == name)
    return field(default=f.default, metadata={**f.metadata, **changes})


def flag_name(name: str, meta: dict) -> str:
    """The command-line flag of a `param` field: its own `flag`, else `--` + the name with dashes."""
    return meta["flag"] or "--" + name.replace("_", "-")


def _nonneg_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def check_fields(config) -> None:
    """Check every `param` field of a dataclass instance against its metadata (ValueError naming the field)."""
    for f in fields(config):
        if "type" in f.metadata:
            check_value(f.name, getattr(config, f.name), f.metadata)


def expected(meta: dict) -> str:
    """What a field accepts, in words: 'a positive integer', '>= 0', 'in (0, 1]', 'one of [...]'."""
    if meta["choices"] is not None:
        return f"one of {list(meta['choices'])}"
    t, lo, hi = meta["type"], meta["min"], meta["max"]
    if t is bool:
        return "True or False"
    if t == "ids":
        return "a token id >= 0 or a list of them"
    if t == "indices":
        return "comma-separated integers >= 0, e.g. 0,5"
    if t == "pairs":
        return "LAYER:HEAD pairs (integers >= 0) separated by commas, e.g. 3:5,31:0"
    if t is int:
        if lo == 1 and hi is None:
            return "a positive integer"
        if lo is not None and hi is None:
            return f"an integer >= {lo}"
    if meta["gt"] is not None and meta["lt"] is None and hi is None:
        return f"> {meta['gt']:g}"
    if meta["gt"] is not None or meta["lt"] is not None or (lo is not None and hi is not None):
        left = f"({meta['gt']:g}" if meta["gt"] is not None else (f"[{lo:g}" if lo is not None else "(-inf")
        right = f"{meta['lt']:g})" if meta["lt"] is not None else (f"{hi:g}]" if hi is not None else "inf)")
        return f"in {left}, {right}"
    if lo is not None:
        return f">= {lo:g}"
    return {int: "an integer", float: "a finite number", str: "a string"}.get(t, str(t))


def check_value(name: str, value, meta: dict) -> None:
    """Raise ValueError('<name> must be <expected>, got <value>') when `value` breaks the field's rules."""
    if value is None:
        return
    t = meta["type"]
    ok = True
    if t is bool:
        ok = isinstance(value, bool)
    elif t == "ids":
        ids = [value] if isinstance(value, int) else value
        ok = isinstance(ids, (list, tuple)) and all(_nonneg_int(i) for i in ids)
    elif t == "indices":
        ok = isinstance(value, (list, tuple)) and len(value) > 0 and all(_nonneg_int(i) for i in value)
    elif t == "pairs":
        ok = isinstance(value, (list, tuple)) and len(value) > 0 and all(
            isinstance(p, (list, tuple)) and len(p) == 2 and all(_nonneg_int(i) for i in p) for p in value)
    elif t is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif t is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    elif t is str:
        ok = isinstance(value, str)
    if ok and meta["choices"] is not None:
        ok = value in meta["choices"]
    if ok and t in (int, float):
        ok = ((meta["min"] is None or value >= meta["min"]) and (meta["max"] is None or value <= meta["max"])
              and (meta["gt"] is None or value > meta["gt"]) and (meta["lt"] is None or value < meta["lt"]))
    if not ok:
        raise ValueError(f"{name} must be {expected(meta)}, got {value!r}")


def parse_text(name: str, text, meta: dict):
    """A field's value from command-line text ("8", "0.9", "true", "1,2", "3:5"), checked like the
    config checks it; a value that is not a string is only checked. ValueError names the field."""
    value = text
    if isinstance(text, str):
        t = meta["type"]
        try:
            if t is bool:
                lowered = text.strip().lower()
                if lowered not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError
                value = lowered in ("true", "1", "yes")
            elif t in ("ids", "indices"):
                value = [int(x) for x in text.split(",") if x.strip()]
            elif t == "pairs":
                value = [tuple(int(y) for y in x.split(":")) for x in text.split(",") if x.strip()]
            elif t in (int, float):
                value = t(text)
        except ValueError:
            raise ValueError(f"{name} must be {expected(meta)}, got {text!r}") from None
    check_value(name, value, meta)
    return value
