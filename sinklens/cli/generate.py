"""`sinklens generate`: run a model's own sampler and print the text (or --json).

    sinklens generate --model tiny-dlm --prompt "Tom has 3 apples ..."
    sinklens generate --model smollm2-135m-instruct --prompt "Hi" --max-new-tokens 16 --json
    sinklens generate --model ./my-llada --input-ids 1,2,3 --steps 32 --gen-length 32

Sampler flags left out take the model's defaults (sinklens.samplers.lengths): a sinklens twin's
training settings, else the family's published setting, cut to the model's context with a note.
The sampler flags are derived from the registered sampler configs (sinklens.samplers.SAMPLERS); `sinklens
trace` shares this module's options.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields

from sinklens.cli.fields import add_config_flags, add_field_flag, flag_values
from sinklens.cli.types import CliError, nonneg_int, seed


def add_sampler_flags(parser: argparse.ArgumentParser, exclude: tuple[str, ...] = (),
                      title: str = "sampler arguments (official names; only those of the model's sampler are accepted)",
                      only: str | None = None) -> dict[str, str]:
    """One flag per field of the registered sampler configs (`SAMPLERS`: every sampler's config.py): type,
    range, help and default come from the field, so no flag table is kept by hand. A field that
    several samplers share (steps, temperature, ...) is one flag. A field's old name (`RENAMED`,
    e.g. Dream's --eps for --time-eps) is accepted with a deprecation note unless `exclude` names
    it. `only`: that sampler's flags alone (`--model X --help`). Returns field name -> dest (the
    name, or `sampler_<name>` where the command has a setting of that name: eval's masking `threshold`)."""
    from sinklens.samplers.registry import SAMPLERS, expected

    by_name: dict[str, list] = {}
    for sampler, cls in SAMPLERS.items():
        if only is not None and sampler != only:
            continue
        for f in fields(cls):
            if f.name not in exclude:
                by_name.setdefault(f.name, []).append((sampler, f))
    group = parser.add_argument_group(title)
    taken = {a.dest for a in parser._actions}
    dests = {name: f"sampler_{name}" if name in taken else name for name in by_name}
    for name, uses in by_name.items():
        old = tuple("--" + o.replace("_", "-") for s, _ in uses for o, new in SAMPLERS[s].RENAMED.items()
                    if new == name and o not in exclude)
        meta = {**uses[0][1].metadata, "old_flags": old}
        helps = {f.metadata["help"] for _, f in uses}
        text = helps.pop() if len(helps) == 1 else "; ".join(f"{s}: {f.metadata['help']}" for s, f in uses)
        ranges = {expected(f.metadata) for _, f in uses}
        if len(ranges) > 1:  # samplers differ (top_k: >= 1 for an ARM, >= 0 for SDAR): the flag takes what any
            meta.update(_loosest_range([f.metadata for _, f in uses]))   # of them does, each config checks its own
            text += "; " + ", ".join(f"{s}: {expected(f.metadata)}" for s, f in uses)
        elif meta["type"] is not bool and not meta["choices"]:
            text += f"; {expected(meta)}"
        text += " [official default " + ", ".join(("" if only else f"{s}: ") + ("unset" if f.default is None else
                                                                                 str(f.default)) for s, f in uses) + "]"
        add_field_flag(group, "--" + name.replace("_", "-"), dests[name], meta, None, text)
    return dests


def _loosest_range(metas: list[dict]) -> dict:
    """The range (min / gt, max / lt) of a flag several samplers share: every value one of them accepts
    (top_p: [0, 1] where LLaDA2 takes 0 and Dream (0, 1]), so the command line refuses before loading a
    model only what no sampler takes, and the model's sampler config checks its own range."""
    def bound(inclusive: str, strict: str, pick):
        ends = [(m.get(inclusive), True) if m.get(inclusive) is not None else
                (m.get(strict), False) if m.get(strict) is not None else None for m in metas]
        if any(e is None for e in ends):   # one sampler has no bound on this side
            return {inclusive: None, strict: None}
        value = pick(v for v, _ in ends)
        closed = any(v == value and inc for v, inc in ends)
        return {inclusive: value if closed else None, strict: None if closed else value}
    return {**bound("min", "gt", min), **bound("max", "lt", max)}


def sampler_args(args: argparse.Namespace, dests: dict[str, str]) -> dict:
    """The sampler flags the user gave, by field name (`dests`: `add_sampler_flags`'s answer; a
    flag left out keeps the sampler's / preset's default)."""
    return {n: getattr(args, d) for n, d in dests.items() if getattr(args, d, None) is not None}


RUN_SAMPLER_TITLE = ("sampler arguments (official names; only those of the model's sampler are accepted; "
                     "one left out takes the model's default: a twin's training settings, else the paper's "
                     "GSM8K setting, capped by the context)")


def sampler_title(title: str, command: str, sampler: str | None) -> str:
    """A sampler group's title: every sampler's flags, and how to list one model's; or whose these are."""
    if sampler is None:
        return (f"{title}. Every sampler's flags are listed; `sinklens {command} --model M --help` lists only those of "
                "M's sampler")
    return f"{title}. The {sampler} sampler's flags (the one --model runs; without --model: every sampler's)"


def help_sampler(command: str, argv: list[str]) -> str | None:
    """The sampler whose flags `sinklens COMMAND --model M [--sampler S] --help` lists: M's, told
    from its config.json (`precheck.model_sampler`'s reading); None for the generic help (no
    --model, or one that cannot be told without loading it)."""
    given = {}
    for i, word in enumerate(argv):
        flag, eq, value = word.partition("=")
        if flag.startswith("--"):
            given[flag[2:].replace("-", "_")] = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
    if not given.get("model"):
        return None
    from sinklens.models.loader import checkpoint_family
    from sinklens.samplers.registry import SAMPLERS

    found = checkpoint_family(given["model"])
    try:
        return None if found is None else found[0].pick_sampler(given.get("sampler"), given)
    except ValueError:                     # a --sampler it does not run: the run says so
        return None if given.get("sampler") not in SAMPLERS else given["sampler"]


def add_run_flags(p: argparse.ArgumentParser, prompts_file: bool = False, command: str = "generate",
                  sampler: str | None = None) -> None:
    """Model, prompt and sampler flags (generate and trace; prompts_file: trace's --prompts too).
    `sampler`: list only its flags (`--model X --help`)."""
    p.add_argument("--model", required=True, help="alias, local folder, .gguf file or hub id")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (wrapped in the chat template when the tokenizer has one)")
    src.add_argument("--input-ids", type=parse_ids, help="comma-separated token ids instead of a prompt, e.g. 1,2,3")
    if prompts_file:
        src.add_argument("--prompts", help="corpus run: a JSON Lines file, one {\"prompt\": text} (\"id\" optional) "
                         "per line; keeps per-(layer, head) totals instead of full traces (--out is a folder)")
    p.add_argument("--raw", action="store_true", help="do not apply the chat template to --prompt")
    p.add_argument("--sampler", default=None, help="the sampler to run (default: the model family's own); another "
                   "one its checkpoints run, e.g. llada21 = LLaDA2.1's editing sampler on an llada2_moe checkpoint")
    p.add_argument("--seed", type=seed, default=0, help="torch seed set right before sampling")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: as stored)")
    p.add_argument("--device", default=None, help="e.g. cpu, cuda:0")
    big = p.add_argument_group("models bigger than one device (accelerate's big-model inference; docs/models.md)")
    big.add_argument("--device-map", default=None, choices=("auto", "balanced", "balanced_low_0", "sequential"),
                     help="spread the layers over the GPUs, then CPU memory, then --offload-folder")
    big.add_argument("--max-memory", type=parse_max_memory, default=None,
                     help="per-device cap with --device-map, e.g. 0=70GiB,1=70GiB,cpu=200GiB")
    big.add_argument("--offload-folder", default=None, help="with --device-map: folder for the layers that fit nowhere")
    from sinklens.models.options import LoadOptions
    add_config_flags(p.add_argument_group("random-init control (docs/analysis.md)"), LoadOptions)
    p.set_defaults(sampler_fields=add_sampler_flags(p, title=sampler_title(RUN_SAMPLER_TITLE, command, sampler),
                                                    only=sampler))


def parse_max_memory(text: str) -> dict:
    """'0=70GiB,cpu=200GiB' -> {0: '70GiB', 'cpu': '200GiB'} (accelerate's max_memory)."""
    out = {}
    for part in text.split(","):
        dev, sep, size = part.partition("=")
        if not sep or not dev or not size:
            raise argparse.ArgumentTypeError(f"expected DEVICE=SIZE pairs like 0=70GiB,cpu=200GiB, got {text!r}")
        out[int(dev) if dev.isdigit() else dev] = size
    return out


def parse_ids(text: str) -> list[int]:
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty")
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",")]   # an empty element ('1,,2') is refused
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers, got {text!r}") from None
    if min(ids) < 0:
        raise argparse.ArgumentTypeError(f"must be token ids >= 0, got {min(ids)}")
    return ids


def prompt_ids(model, args) -> list[int]:
    if args.input_ids is not None:
        return args.input_ids
    if model.tokenizer is None:
        raise CliError(f"{args.model} has no tokenizer: pass --input-ids instead of --prompt")
    if not args.raw and getattr(model.tokenizer, "chat_template", None):
        return model.apply_chat_template(args.prompt)
    return model.tokenizer.encode(args.prompt)


ENCODER_HINT = "use `sinklens trace` to record where its attention goes"


def check_run_flags(args, generates: str | None = None) -> None:
    """The model's name, --dtype and the sampler flags, answered before torch is imported; then,
    from the model's config.json, whether its sampler takes the flags (and generates text, when
    `generates` says what to do instead), before any weight is read."""
    from sinklens.cli import precheck

    if getattr(args, "prompt", None) is not None and not args.prompt.strip():
        raise CliError("--prompt is empty: expected the text to generate from (or --input-ids 1,2,3)")
    if args.raw and getattr(args, "input_ids", None) is not None:    # ids are never templated: --raw would do nothing
        raise CliError("--raw goes with --prompt (it leaves the text out of the chat template); --input-ids are "
                       "used as given")
    precheck.model_name(args.model)
    precheck.dtype(args.dtype)
    precheck.sampler_name(args.sampler)
    precheck.sampler_flags(sampler_args(args, args.sampler_fields))
    if getattr(args, "random_init", None) is not None and getattr(args, "device_map", None) is not None:
        raise CliError("--random-init re-initialises a model held whole on one device; it does not go with --device-map")
    precheck.model_sampler(args.model, args.sampler, sampler_args(args, args.sampler_fields), generates=generates)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a generation, with what the run had produced (`progress`: the Progress hook)."""

    def __init__(self, model, ids, config, progress):
        super().__init__()
        self.model, self.ids, self.config, self.progress = model, ids, config, progress


class Progress:
    """A step hook for the command line: keeps the newest canvas (what Ctrl-C prints) and, after
    the second step, says how long the whole run will take when that is long (the first step
    alone would mislead: it holds the start-up, and an ARM's prefill of the whole prompt)."""

    LONG_S = 10.0   # estimates shorter than this are not worth a line

    def __init__(self, steps: int, on_stop: str = "prints what is made so far"):
        self.steps, self.done, self.tokens, self.on_stop = steps, 0, None, on_stop   # on_stop: what Ctrl-C does
        self.t0 = self.t1 = time.perf_counter()

    def after_step(self, event) -> None:
        self.tokens = event.tokens[0].detach().clone()   # the canvas this step saw: what was committed before it
        self.done += 1
        now = time.perf_counter()
        if self.done == 1:
            self.t1 = now
        elif self.done == 2:
            step = now - self.t1
            estimate = (self.t1 - self.t0) + step * (self.steps - 1)
            if estimate >= self.LONG_S:
                _note_beside_bar(f"a step takes {step:.2f} s (the first {self.t1 - self.t0:.2f} s): about "
                                 f"{_duration(estimate)} for up to {self.steps} steps (Ctrl-C stops and {self.on_stop})")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _note_beside_bar(message: str) -> None:
    """A note printed while a progress bar is on screen, above the bar."""
    from sinklens.cli.logs import note, quiet

    if quiet():
        return
    try:
        from tqdm import tqdm
    except ImportError:
        return note(message)
    tqdm.write(message, file=sys.stderr)


def settings_line(name: str, config, prompt: int) -> str:
    """What a run is about to do, in one line: its sampler, lengths, steps and settings."""
    settings = ", ".join(f"{k}={v}" for k, v in config.to_dict().items() if v is not None)
    if not config.generates:
        return (f"{name}: {config.name} sampler, one forward pass over the prompt's {prompt} tokens (an encoder "
                f"generates nothing)" + (f" ({settings})" if settings else ""))
    tokens, steps = tokens_and_steps(config, prompt)
    return (f"{name}: {config.name} sampler, prompt {prompt} tokens, {tokens} new tokens x up to {steps} steps = "
            f"{tokens * steps} token-steps ({settings})")


def tokens_and_steps(config, prompt: int) -> tuple[int, int]:
    """(new tokens, the most steps) of `config` after a prompt of `prompt` tokens (`max_steps`)."""
    return (config.length or 0) if config.length_field else 0, config.max_steps(prompt)


def run(args, trace=None, capture=None, check=None):
    """Load, `check(model)`, build the sampler config (model defaults + flags, notes on stderr),
    say the settings and (after the first step, when long) an estimate, generate. Returns (model,
    ids (1, P), config, GenerateOutput); Ctrl-C raises `Interrupted` with the canvas so far. The
    caller has checked the flags (`check_run_flags`)."""
    import torch

    from sinklens.cli.logs import note, verbose
    from sinklens.models.loader import load
    from sinklens.models.options import control_label
    from sinklens.samplers import lengths
    from sinklens.samplers.registry import get_config

    t0 = time.perf_counter()
    model = load(args.model, dtype=args.dtype, device=args.device, **load_args(args))
    verbose(f"loaded {args.model} in {time.perf_counter() - t0:.1f} s: {model!r}")
    if check is not None:
        check(model)
    ids = torch.tensor([prompt_ids(model, args)])
    if getattr(args, "prompt", None):   # a twin asked what it never read
        from sinklens.train.tokenizer import vocabulary_note
        if hint := vocabulary_note(model.source["path"], args.prompt):
            note(hint)
    try:
        sampler = model.family.pick_sampler(args.sampler, sampler_args(args, args.sampler_fields))
    except ValueError as e:
        raise CliError(str(e)) from None
    try:
        plan = lengths.settings(get_config(sampler), lengths.ModelFacts.of(model),
                                prompt_length=ids.shape[1], overrides=sampler_args(args, args.sampler_fields))
        config = plan.config()
    except TypeError as e:  # a flag of another family's sampler
        raise CliError(str(e)) from None
    for line in plan.deprecated + plan.notes:
        note(line)
    verbose(f"prompt: {ids.shape[1]} tokens; sampler {config.name}: {config.to_dict()}")
    note(settings_line(control_label(args.model, getattr(args, "random_init", None)), config, ids.shape[1]))
    tokens, steps = tokens_and_steps(config, ids.shape[1])
    torch.manual_seed(args.seed)
    progress = Progress(steps) if trace is None else Progress(steps, "keeps the finished steps as a truncated trace")
    try:
        out = model.generate(ids, trace=trace, capture=capture, hook=progress, progress=args.progress, config=config)
    except KeyboardInterrupt:
        raise Interrupted(model, ids, config, progress) from None
    verbose(f"generated in {time.perf_counter() - progress.t0:.1f} s ({out.num_steps} steps)")
    return model, ids, config, out


def load_args(args) -> dict:
    """load()'s keywords beyond dtype and device, only those given: device_map / max_memory /
    offload_folder and the `LoadOptions` fields (--random-init)."""
    from sinklens.models.options import LoadOptions

    given = {k: getattr(args, k, None) for k in ("device_map", "max_memory", "offload_folder")}
    return {k: v for k, v in {**given, **flag_values(LoadOptions, args)}.items() if v is not None}


def new_text(ids, out) -> str:
    """The generated text (token ids when the model has no tokenizer). Empty text gets a note on
    stderr: the text stops at the first end token, which a model may put first."""
    if out.text is None:
        return " ".join(map(str, out.sequences[0, ids.shape[1]:].tolist()))
    if not out.text[0].strip():
        from sinklens.cli.logs import note

        note(f"the generated text is empty: it stops at the first end token, and the model put one first (or "
             f"made only special tokens); `sinklens generate --json` lists all {out.sequences.shape[1] - ids.shape[1]} "
             "generated ids")
    return out.text[0]


def _check_generates(model) -> None:
    from sinklens.samplers.registry import get_config

    if not get_config(model.family.sampler).generates:
        from sinklens.cli.precheck import encoder_refusal

        raise CliError(encoder_refusal(model.source.get("name_or_path", "the model"), model.family.name, ENCODER_HINT))


def _print_interrupted(e: Interrupted, as_json: bool) -> int:
    """What Ctrl-C leaves: the tokens committed so far (masked positions as the mask token)."""
    p, model, prompt = e.progress, e.model, e.ids.shape[1]
    made = [] if p.tokens is None else p.tokens[prompt:].tolist()
    text = model.tokenizer.decode(made) if model.tokenizer is not None else " ".join(map(str, made))
    if as_json:
        print(json.dumps({"text": text, "prompt_ids": e.ids[0].tolist(), "generated_ids": made, "steps": p.done,
                          "interrupted": True, "sampler": {"name": e.config.name, "args": e.config.to_dict()}}))
    else:
        print(text)
    print(f"sinklens generate: interrupted after {p.done} of up to {p.steps} steps; printed the canvas so far "
          f"({len(made)} tokens{', still-masked positions as the mask token' if model.is_diffusion else ''})",
          file=sys.stderr)
    return 130


def cmd_generate(args) -> int:
    check_run_flags(args, generates=ENCODER_HINT)
    try:
        model, ids, config, out = run(args, check=_check_generates)
    except Interrupted as e:
        return _print_interrupted(e, args.json)
    if args.json:
        print(json.dumps({"text": out.text[0] if out.text else None, "prompt_ids": ids[0].tolist(),
                          "generated_ids": out.sequences[0, ids.shape[1]:].tolist(),
                          "sequence": out.sequences[0].tolist(), "steps": out.num_steps,
                          "sampler": {"name": config.name, "args": config.to_dict()}}))
    else:
        print(new_text(ids, out))
    return 0


def register(sub, sampler: str | None = None) -> None:
    g = sub.add_parser("generate", help="run a model's own sampler and print the text", description=__doc__)
    add_run_flags(g, sampler=sampler)
    g.add_argument("--json", action="store_true",
                   help="print one JSON object: text, prompt / generated / full ids, steps, sampler settings")
    g.set_defaults(func=cmd_generate)
