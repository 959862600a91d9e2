"""`sinklens trace`: run a model's own sampler and record every step's attention to a trace file.

    sinklens trace --model tiny-dlm --prompt "Tom has 3 apples ..." --out run.arrow
    sinklens trace --model ./my-llada --prompt "2+2=" --steps 32 --gen-length 32 --out run.arrow
    sinklens trace --model ./my-llada --input-ids 1,2,3 --map-slices 3:0,5:7 --out run.arrow
    sinklens trace --model tiny-dlm --prompt "..." --value-norms --diagonal --lens-layers 1,3 --out run.arrow
    sinklens trace --model tiny-dlm --prompts prompts.jsonl --keep-traces 5 --out runs/corpus

Model, prompt and sampler flags as `sinklens generate`; then `sinklens report run.arrow --out DIR`.
With --prompts (a corpus run, docs/corpus.md) --out is a folder that ends up holding corpus.jsonl:
per (layer, head) totals over every prompt, the full traces of --keep-traces prompts only;
re-running resumes; under torchrun / accelerate launch the prompts are split over the processes;
`sinklens report runs/corpus/corpus.jsonl --out DIR` reports on it.
"""
from __future__ import annotations

import argparse
import errno
import os
import sys
from dataclasses import fields

from sinklens.cli.fields import add_config_flags, flag_values
from sinklens.cli.generate import Interrupted, add_run_flags, check_run_flags, new_text, run
from sinklens.cli.types import CliError, positive_int
from sinklens.trace.readouts import ReadoutOptions


def note_triton_fallback(device_type: str) -> None:
    """--route triton where its kernel cannot run at all: the lse route runs every call (said once,
    not left to be found in the timings)."""
    import importlib.util

    from sinklens.cli.logs import note

    if importlib.util.find_spec("triton") is None:
        note("note: --route triton: triton is not installed (extra gpu); every call takes the lse route")
    elif device_type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        note(f"note: --route triton: its kernel runs on CUDA only; on {device_type} every call takes the lse route")


def map_slices(text: str) -> tuple[tuple[int, int], ...]:
    """'3:0,5:7' -> ((3, 0), (5, 7))"""
    out = []
    for part in text.split(","):       # an empty element ('3:0,,5:7') is refused like any other bad one
        try:
            layer, head = (int(x) for x in part.split(":"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected LAYER:HEAD pairs like 3:0,5:7, got {text!r}") from None
        if min(layer, head) < 0:
            raise argparse.ArgumentTypeError(f"layer and head must be >= 0, got {part!r}")
        out.append((layer, head))
    return tuple(out)


def cmd_trace(args) -> int:
    from sinklens.cli.logs import note

    check_run_flags(args)               # before CaptureOptions imports torch
    from sinklens.eval.corpus_config import CorpusConfig

    given = [f.name for f in fields(CorpusConfig) if "type" in f.metadata and getattr(args, f.name) != f.default]
    if args.prompts is None and given:
        raise CliError(f"{', '.join('--' + g.replace('_', '-') for g in given)} {'goes' if len(given) == 1 else 'go'} "
                       "with --prompts FILE.jsonl (a corpus run); a single trace stores the attention itself (its "
                       "units and eps are `sinklens report`'s)")
    if args.prompts is not None:
        _check_corpus_flags(args)
    from sinklens.runlock import FileLock, RunDirBusy
    from sinklens.samplers.capture import CaptureOptions
    from sinklens.trace.schema import replaceable

    if os.path.isdir(args.out) and args.prompts is None:
        raise CliError(f"--out {args.out!r} is a folder; expected a trace file path such as run.arrow")
    if args.prompts is None and os.path.isfile(args.out) and not replaceable(args.out):
        raise CliError(f"--out {args.out!r} exists and is not a trace; not overwriting it (choose another "
                       "path such as run.arrow, or remove the file)")
    replaces = args.prompts is None and os.path.isfile(args.out)   # a trace of an earlier run: replaced, and said
    if args.prompts is None and os.path.dirname(args.out):
        os.makedirs(os.path.dirname(args.out), exist_ok=True)   # made now, as report and eval make theirs, not after the load
    capture = CaptureOptions(query_groups=False if args.no_groups else None, map_slices=args.map_slices,
                             capture_prefix=args.capture_prefix, query_chunk=args.query_chunk, route=args.route,
                             received_dtype="float32" if args.float32 else "float16",
                             **flag_values(ReadoutOptions, args))
    if args.prompts is not None:
        if args.route == "triton" and args.device_map is None:   # said before the load (a single trace: after)
            note_triton_fallback((args.device or "cpu").split(":")[0])
        return cmd_corpus(args, capture)

    def check(model):
        bad = [f"{l}:{h}" for l, h in args.map_slices if l >= model.num_layers or h >= model.num_heads]
        if bad:
            raise CliError(f"--map-slices {','.join(bad)}: the model has {model.num_layers} layers x "
                           f"{model.num_heads} heads (0-based)")
        bad = [l for l in args.lens_layers or () if l >= model.num_layers]
        if bad:
            raise CliError(f"--lens-layers {','.join(map(str, bad))}: the model has {model.num_layers} layers (0-based)")
        if args.route == "triton":
            note_triton_fallback(model.device.type)

    try:
        with FileLock(args.out):        # before the load: a second `trace --out` of this file pays none
            if replaces:
                note(f"note: {args.out} holds an earlier trace; this run replaces it")
            model, ids, config, out = run(args, trace=args.out, capture=capture, check=check)
    except RunDirBusy as e:
        raise CliError(str(e)) from None
    except OSError as e:                # the trace's write (disk full, `ulimit -f`): pyarrow names no file
        full = {errno.EFBIG, errno.ENOSPC}
        if e.filename is not None or not (e.errno in full or any(f"errno {n}]" in str(e) for n in full)):
            raise
        raise OSError(f"could not write {args.out} ({' '.join(str(e).split())}); the steps written before stay in it "
                      "as a truncated trace (`sinklens report` reads them)") from None
    except Interrupted as e:
        if os.path.isfile(args.out) and os.path.getsize(args.out) == 0:
            os.remove(args.out)   # stopped before a step was written: no empty file left for `report` to trip on
        if not os.path.isfile(args.out):
            print(f"sinklens trace: interrupted before the first step finished; no trace written to {args.out}",
                  file=sys.stderr)
            return 130
        print(f"sinklens trace: interrupted after {e.progress.done} of up to {e.progress.steps} steps; {args.out} "
              "keeps the finished steps (a truncated trace: `sinklens report` reads them)", file=sys.stderr)
        return 130
    layers, heads = model.num_layers, model.num_heads
    size = os.path.getsize(args.out)
    note(f"wrote {args.out}: {out.num_steps} steps x {layers} layers x {heads} heads, {size / 1e6:.2f} MB "
         f"({size / max(out.num_steps, 1) / 1e3:.1f} kB per step); next: sinklens report {args.out} --out report/")
    if config.generates:                # an encoder's trace is its one forward pass: no text to print
        print(new_text(ids, out))
    return 0


def _check_corpus_flags(args) -> None:
    """What a corpus run cannot take, answered before torch is imported."""
    if os.path.isdir(args.prompts):
        raise CliError(f"--prompts {args.prompts!r} is a folder; expected a JSON Lines file, one {{\"prompt\": text}} "
                       "per line")
    if not os.path.isfile(args.prompts):
        raise CliError(f"--prompts {args.prompts!r}: no such file (expected a JSON Lines file, one "
                       "{\"prompt\": text} per line)")
    if os.path.isfile(args.out):
        raise CliError(f"--out {args.out!r} is a file; with --prompts it is the run folder")
    if args.map_slices:
        raise CliError("--map-slices keeps full maps, which a corpus run does not store; trace single prompts for maps")


def cmd_corpus(args, capture) -> int:
    from sinklens.cli.generate import load_args, sampler_args
    from sinklens.cli.logs import note
    from sinklens.eval.corpus import CorpusConfig, run_corpus
    from sinklens.runlock import RunDirBusy

    cfg = CorpusConfig(**flag_values(CorpusConfig, args), model=args.model, prompts=args.prompts, out=args.out,
                       raw=args.raw, seed=args.seed, sampler=args.sampler,
                       sampler_args=sampler_args(args, args.sampler_fields),
                       dtype=args.dtype, device=args.device, load_args=load_args(args), capture=capture,
                       progress=args.progress)
    try:
        path = run_corpus(cfg)
    except RunDirBusy as e:     # another process writes this --out: an input problem (exit 2)
        raise CliError(str(e)) from None
    except KeyboardInterrupt:
        print(f"sinklens trace: interrupted; the finished prompts are kept in {args.out}: the same command "
              "resumes from them", file=sys.stderr)
        return 130
    if path is not None:
        from sinklens.analysis.corpus import open_corpus

        c = open_corpus(path)
        note(f"wrote {path}: {c.num_prompts} prompts, {c.meta['num_layers']} layers x {c.meta['num_heads']} heads, "
             f"{os.path.getsize(path) / 1e6:.2f} MB; skipped {len(c.meta['skipped'])}; next: sinklens report {path} "
             "--out report/")
        print(path)
    return 0


def register(sub, sampler: str | None = None) -> None:
    t = sub.add_parser("trace", help="run a model's own sampler and record every step's attention to a trace file",
                       description=__doc__)
    add_run_flags(t, prompts_file=True, command="trace", sampler=sampler)
    t.add_argument("--out", required=True, help="trace file to write (Arrow IPC stream, .arrow); with --prompts "
                   "the run folder")
    t.add_argument("--float32", action="store_true", help="store received attention as float32 (default float16)")
    t.add_argument("--map-slices", type=map_slices, default=(), help="full attention maps to keep, as LAYER:HEAD "
                   "pairs, e.g. 3:0,5:7")
    t.add_argument("--no-groups", action="store_true", help="do not split received attention by masked / unmasked "
                   "queries")
    t.add_argument("--capture-prefix", action="store_true", help="ARM: capture all prefix rows at every step")
    t.add_argument("--query-chunk", type=positive_int, default=None,
                   help="query rows per chunk in capture (memory bound; default: from an 8 MB cache budget)")
    t.add_argument("--route", choices=("auto", "compiled", "exact", "lse", "triton"), default="auto",  # AttentionRequest ROUTES
                   help="capture route: compiled (one-pass C kernel on CPU, built on first use), exact softmax, lse "
                        "(output from sdpa's fused kernel, bit-identical to an untraced run), triton (fused kernel, "
                        "extra gpu; falls back to lse where it does not apply); auto = compiled for float32 on CPU "
                        "where it builds (else exact), lse on CUDA and in bfloat16/float16")
    add_config_flags(t.add_argument_group("mechanism readouts (off by default; docs/analysis.md)"), ReadoutOptions)
    from sinklens.eval.corpus_config import CorpusConfig
    add_config_flags(t.add_argument_group("corpus run (--prompts; docs/corpus.md)"), CorpusConfig)
    t.set_defaults(func=cmd_trace, out_is="file")   # a folder with --prompts: cmd_trace checks which
