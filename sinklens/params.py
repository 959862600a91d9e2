"""Config fields that carry their own parse type, help text and range: `param(...)`.

The samplers' configs (each in its sampler's module, `samplers/<name>.py`) and the report's options (`report/options.py`)
declare their fields with `param`; the command line builds one flag per such field from this
metadata (`sinklens/cli/fields.py`), and `check_fields` checks a config against it, so a
parameter is written once. Imports nothing (the command line answers --help without torch).
"""
from __future__ import annotations

import math
from dataclasses import field, fields


# The largest seed any setting takes: torch's generators take 64 bits, and an eval seeds sample i
# with seed + i, so a signed 64-bit range leaves room for any number of samples.
MAX_SEED = 2**63 - 1


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


def command_flags(config, always: tuple[str, ...] = ()) -> list[str]:
    """The command-line flags that rebuild `config` (a dataclass instance with `param` fields, nested
    dataclasses flattened as the command line flattens them): every field that differs from its
    default, and the fields named in `always` (a flag the command line requires), e.g.
    ['--kind', 'dlm', '--steps', '6000']. What a run records as its command."""
    import dataclasses
    import shlex

    out = []
    for f in fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            out += command_flags(value, always)
            continue
        if "type" not in f.metadata or (f.name not in always and value == f.default):
            continue
        flag = flag_name(f.name, f.metadata)
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        else:
            text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
            out += [flag, shlex.quote(text)]
    return out


def _nonneg_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def check_fields(config) -> None:
    """Check every `param` field of a dataclass instance against its metadata (ValueError naming the field)."""
    for f in fields(config):
        if "type" in f.metadata:
            check_value(f.name, getattr(config, f.name), f.metadata)


def _num(x) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def expected(meta: dict) -> str:
    """What a field accepts, in words: 'a positive integer', '>= 0', 'in (0, 1]', 'one of [...]'."""
    if meta["choices"] is not None:
        return f"one of {list(meta['choices'])}"
    t, lo, hi = meta["type"], meta["min"], meta["max"]
    if t in _LIST_WORDS:
        return _LIST_WORDS[t]
    if t is bool:
        return "True or False"
    if t is int:
        if lo == 1 and hi is None:
            return "a positive integer"
        if lo is not None and hi is None:
            return f"an integer >= {lo}"
    if meta["gt"] is not None and meta["lt"] is None and hi is None:
        return f"> {_num(meta['gt'])}"
    if meta["gt"] is not None or meta["lt"] is not None or (lo is not None and hi is not None):
        left = f"({_num(meta['gt'])}" if meta["gt"] is not None else (f"[{_num(lo)}" if lo is not None else "(-inf")
        right = f"{_num(meta['lt'])})" if meta["lt"] is not None else (f"{_num(hi)}]" if hi is not None else "inf)")
        return f"in {left}, {right}"
    if lo is not None:
        return f">= {_num(lo)}"
    return {int: "an integer", float: "a finite number", str: "a string"}.get(t, str(t))


_LIST_WORDS = {"ids": "a token id >= 0 or a list of them", "indices": "comma-separated integers >= 0, e.g. 0,5",
               "pairs": "LAYER:HEAD pairs (integers >= 0) separated by commas, e.g. 3:5,31:0"}


def _is_list(value, item) -> bool:
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(item(v) for v in value)


def _is_pair(p) -> bool:
    return isinstance(p, (list, tuple)) and len(p) == 2 and all(_nonneg_int(i) for i in p)


# parse type -> does a value have it (before its choices and range are checked)
_HAS_TYPE = {
    bool: lambda v: isinstance(v, bool),
    "ids": lambda v: _nonneg_int(v) or (isinstance(v, (list, tuple)) and all(_nonneg_int(i) for i in v)),
    "indices": lambda v: _is_list(v, _nonneg_int),
    "pairs": lambda v: _is_list(v, _is_pair),
    int: lambda v: isinstance(v, int) and not isinstance(v, bool),
    float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
    str: lambda v: isinstance(v, str),
}


def _in_range(value, meta: dict) -> bool:
    return ((meta["min"] is None or value >= meta["min"]) and (meta["max"] is None or value <= meta["max"])
            and (meta["gt"] is None or value > meta["gt"]) and (meta["lt"] is None or value < meta["lt"]))


def check_value(name: str, value, meta: dict) -> None:
    """Raise ValueError('<name> must be <expected>, got <value>') when `value` breaks the field's rules."""
    if value is None:
        return
    t = meta["type"]
    ok = _HAS_TYPE.get(t, lambda v: True)(value)
    if ok and meta["choices"] is not None:
        ok = value in meta["choices"]
    if ok and t in (int, float):
        ok = _in_range(value, meta)
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
            elif t in ("ids", "indices"):         # an empty element ('1,,2', '1,') is refused, not dropped
                value = [int(x) for x in text.split(",")]
            elif t == "pairs":
                value = [tuple(int(y) for y in x.split(":")) for x in text.split(",")]
            elif t in (int, float):
                value = t(text)
        except ValueError:
            raise ValueError(f"{name} must be {expected(meta)}, got {text!r}") from None
    check_value(name, value, meta)
    return value
