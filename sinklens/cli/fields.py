"""Flags from config dataclasses: one flag per `param` field (`sinklens/params.py`).

The parse type, range, choices, help and default of a flag come from its field, so no flag table
is kept by hand: the sampler flags (`generate.add_sampler_flags`), `sinklens report`
(`ReportOptions`, `PageOptions`), `sinklens eval` (`EvalConfig`) and `sinklens train` (`TrainConfig`,
`ModelConfig`, `DataConfig`) are built here. Torch-free
(the command line's --help).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING, fields


class _Deprecated(argparse.Action):
    """An old spelling of a flag (hidden from --help): stores like the flag `now` and says so in one line."""

    def __init__(self, option_strings, dest, now: str, store: argparse.Action, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.now, self.store = now, store

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"note: {option_string} is deprecated, use {self.now}", file=sys.stderr)
        self.store(parser, namespace, values, option_string)


def add_field_flag(group, flag: str, dest: str, meta: dict, default, text: str) -> None:
    """One argparse flag for a field with `param` metadata; a bad value is argparse's one-line
    'argument --flag: must be <expected>, got <value>'. Booleans get --x / --no-x; a field without
    a default (`MISSING`) is a required flag. The field's `old_flags` are accepted too, with a
    deprecation note, and not listed in --help."""
    from sinklens.params import parse_text

    required = default is MISSING
    default = None if required else default
    if meta["type"] is bool:
        action = group.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=default,
                                    required=required, help=text.replace("%", "%%"))
        for old in meta.get("old_flags") or ():
            for spelling, now, value in ((old, flag, True), (old.replace("--", "--no-", 1), "--no-" + flag[2:], False)):
                group.add_argument(spelling, dest=dest, action=_Deprecated, now=now, nargs=0, default=argparse.SUPPRESS,
                                   help=argparse.SUPPRESS, store=lambda p, ns, v, o, value=value: setattr(ns, dest, value))
        return

    def parse(value):
        try:
            return parse_text(dest, value, meta)
        except ValueError as e:  # "<field> must be ..." -> argparse prints "argument --flag: must be ..."
            raise argparse.ArgumentTypeError(str(e).split(" ", 1)[1]) from None

    metavar = "{" + ",".join(meta["choices"]) + "}" if meta["choices"] else {
        "ids": "ID[,ID...]", "indices": "I[,I...]", "pairs": "L:H[,L:H...]", int: "N", float: "X"}.get(
        meta["type"], "TEXT")
    group.add_argument(flag, dest=dest, type=parse, default=default, required=required, metavar=metavar,
                       help=text.replace("%", "%%"))
    for old in meta.get("old_flags") or ():
        group.add_argument(old, dest=dest, type=parse, action=_Deprecated, now=flag, default=argparse.SUPPRESS,
                           metavar=metavar, help=argparse.SUPPRESS,
                           store=lambda p, ns, v, o: setattr(ns, dest, v))


def add_config_flags(parser, cls, prefix: str = "", required: tuple[str, ...] = ()) -> list[str]:
    """A flag per `param` field of dataclass `cls`: `--<prefix><field>` with dashes (or the field's
    own `flag`), dest `<prefix><field>`, default = the field's. Fields named in `required` are
    required flags although the library has a default (e.g. `sinklens train --out`). Returns the dests."""
    from sinklens.params import expected, flag_name

    dests = []
    for f in fields(cls):
        meta = f.metadata
        if "type" not in meta:          # a plain field: set by the caller, not a flag
            continue
        dest = (prefix + f.name).replace("-", "_")
        text = meta["help"] + (f"; {expected(meta)}" if meta["type"] in (int, float) and not meta["choices"] else "")
        add_field_flag(parser, flag_name(dest, meta), dest, meta, MISSING if f.name in required else f.default, text)
        dests.append(dest)
    return dests


def flag_values(cls, args: argparse.Namespace, prefix: str = "") -> dict:
    """`cls`'s `param` fields from the parsed flags of `add_config_flags(parser, cls, prefix)`."""
    return {f.name: getattr(args, (prefix + f.name).replace("-", "_")) for f in fields(cls) if "type" in f.metadata}
