"""`sinklens generate` and `sinklens trace`: run a model's own sampler from the command line.

    sinklens generate --model smollm2-135m-instruct --prompt "Hi" --max-new-tokens 16
    sinklens trace --model ./my-llada --prompt "2+2=" --steps 32 --gen-length 32 --block-length 32 --out run.arrow
    sinklens trace --model ./my-llada --input-ids 1,2,3 ...      # token ids instead of text
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import fields

from sinklens.cliargs import CliError, nonneg_int, positive_int

def add_sampler_flags(parser: argparse.ArgumentParser, exclude: tuple[str, ...] = (),
                      title: str = "sampler arguments (official names; only those of the model's sampler are accepted)"
                      ) -> list[str]:
    """One flag per field of the registered sampler configs (`sinklens.samplers.configs`): type,
    range, help and default come from the field, so no flag table is kept by hand. A field that
    several samplers share (steps, temperature, ...) is one flag. Returns the field names."""
    from sinklens.samplers.configs import SAMPLERS, expected, parse_text

    by_name: dict[str, list] = {}
    for sampler, cls in SAMPLERS.items():
        for f in fields(cls):
            if f.name not in exclude:
                by_name.setdefault(f.name, []).append((sampler, f))
    group = parser.add_argument_group(title)
    for name, uses in by_name.items():
        meta = uses[0][1].metadata
        helps = {f.metadata["help"] for _, f in uses}
        text = helps.pop() if len(helps) == 1 else "; ".join(f"{s}: {f.metadata['help']}" for s, f in uses)
        if meta["type"] is not bool and not meta["choices"]:
            text += f"; {expected(meta)}"
        text += " [default " + ", ".join(f"{s}: {'unset' if f.default is None else f.default}" for s, f in uses) + "]"
        flag = "--" + name.replace("_", "-")
        if meta["type"] is bool:
            group.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None,
                               help=text.replace("%", "%%"))
            continue

        def parse(value, name=name, meta=meta):
            try:
                return parse_text(name, value, meta)
            except ValueError as e:  # argparse prints "argument --flag: <message>"
                raise argparse.ArgumentTypeError(str(e).split(" ", 1)[1]) from None

        metavar = "{" + ",".join(meta["choices"]) + "}" if meta["choices"] else (
            "ID[,ID...]" if meta["type"] == "ids" else {int: "N", float: "X"}.get(meta["type"], "TEXT"))
        group.add_argument(flag, dest=name, type=parse, default=None, metavar=metavar, help=text.replace("%", "%%"))
    return list(by_name)


def sampler_args(args: argparse.Namespace, names: list[str]) -> dict:
    """The sampler flags the user gave (a flag left out keeps the sampler's / preset's default)."""
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="alias, local folder, .gguf file or hub id")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (wrapped in the chat template when the tokenizer has one)")
    src.add_argument("--input-ids", help="comma-separated token ids instead of a prompt, e.g. 1,2,3")
    p.add_argument("--raw", action="store_true", help="do not apply the chat template to --prompt")
    p.add_argument("--seed", type=nonneg_int, default=0, help="torch seed set right before sampling (default 0)")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: as stored)")
    p.add_argument("--device", default=None, help="e.g. cpu, cuda:0")
    p.set_defaults(sampler_fields=add_sampler_flags(p))


def parse_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise CliError(f"--input-ids must be comma-separated integers, got {text!r}") from None
    if not ids:
        raise CliError("--input-ids is empty")
    if min(ids) < 0:
        raise CliError(f"--input-ids must be token ids >= 0, got {min(ids)}")
    return ids


def _prompt_ids(model, args) -> list[int]:
    if args.input_ids is not None:
        return parse_ids(args.input_ids)
    if model.tokenizer is None:
        raise CliError(f"{args.model} has no tokenizer: pass --input-ids instead of --prompt")
    if not args.raw and getattr(model.tokenizer, "chat_template", None):
        return model.apply_chat_template(args.prompt)
    return model.tokenizer.encode(args.prompt)


def _run(args, trace=None, capture=None, progress=False):
    import torch

    from sinklens.models.loader import load

    model = load(args.model, dtype=args.dtype, device=args.device)
    ids = torch.tensor([_prompt_ids(model, args)])
    torch.manual_seed(args.seed)
    try:
        out = model.generate(ids, trace=trace, capture=capture, progress=progress, **sampler_args(args, args.sampler_fields))
    except (TypeError, ValueError) as e:
        raise CliError(str(e)) from None
    return model, ids, out


def _text(model, ids, out) -> str:
    new = out.sequences[0, ids.shape[1]:].tolist()
    if model.tokenizer is None:
        return " ".join(map(str, new))
    return model.tokenizer.decode(new, skip_special_tokens=True)


def cmd_generate(args) -> int:
    model, ids, out = _run(args)
    if args.json:
        print(json.dumps({"prompt_ids": ids[0].tolist(), "generated_ids": out.sequences[0, ids.shape[1]:].tolist(),
                          "sequence": out.sequences[0].tolist(), "steps": out.num_steps}))
    else:
        print(_text(model, ids, out))
    return 0


def cmd_trace(args) -> int:
    from sinklens.samplers.base import CaptureOptions

    slices = []
    for part in (args.map_slices or "").split(","):
        if part:
            try:
                layer, head = part.split(":")
                slices.append((int(layer), int(head)))
                if min(slices[-1]) < 0:
                    raise ValueError
            except ValueError:
                raise CliError(f"--map-slices must look like 3:0,5:7 (layer:head >= 0), got {args.map_slices!r}") from None
    capture = CaptureOptions(query_groups=False if args.no_groups else None, map_slices=tuple(slices),
                             capture_prefix=args.capture_prefix, query_chunk=args.query_chunk, route=args.route,
                             received_dtype="float32" if args.float32 else "float16")
    model, ids, out = _run(args, trace=args.out, capture=capture, progress=True)
    t = out.trace
    size = os.path.getsize(args.out)
    print(f"wrote {args.out}: {t.num_steps} steps x {t.num_layers} layers x {t.num_heads} heads, "
          f"{size / 1e6:.2f} MB ({size / max(t.num_steps, 1) / 1e3:.1f} kB per step)", file=sys.stderr)
    print(_text(model, ids, out))
    return 0


def register(sub) -> None:
    """Add `generate` and `trace` to the sinklens sub-command parser."""
    g = sub.add_parser("generate", help="run a model's own sampler and print the text",
                       description=cmd_generate.__doc__ or __doc__)
    _add_common(g)
    g.add_argument("--json", action="store_true", help="print ids (prompt, generated, full sequence) as JSON")
    g.set_defaults(func=cmd_generate)

    t = sub.add_parser("trace", help="run a model's own sampler and record every step's attention to a trace file",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(t)
    t.add_argument("--out", required=True, help="trace file to write (Arrow IPC stream, .arrow)")
    t.add_argument("--float32", action="store_true", help="store received attention as float32 (default float16)")
    t.add_argument("--map-slices", help="full attention maps to keep, as layer:head pairs, e.g. 3:0,5:7")
    t.add_argument("--no-groups", action="store_true", help="do not split received attention by masked / unmasked queries")
    t.add_argument("--capture-prefix", action="store_true", help="ARM: capture all prefix rows at every step")
    t.add_argument("--query-chunk", type=positive_int, default=None,
                   help="query rows per chunk in capture (memory bound; default: from an 8 MB cache budget)")
    t.add_argument("--route", choices=("auto", "exact", "lse"), default="auto",  # AttentionRequest ROUTES
                   help="capture route: exact softmax, or lse (output from sdpa's fused kernel, bit-identical to "
                        "an untraced run); auto = lse on CUDA and in bf16/fp16, exact for float32 on CPU")
    t.set_defaults(func=cmd_trace)
