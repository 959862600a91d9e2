"""Capture cost per forward, per route, against a plain sdpa forward: causal, bidirectional and
block-causal.

Models: SmolLM2-135M (real weights, causal, GQA 9/3; `--models smollm2`), a random 4-layer
causal Llama (d 512, 8 heads; `llama4`), a random 6-layer bidirectional Llama (d 512,
8 heads; `bidir6`, the model of bench_attention.py) and a random 4-layer SDAR-shaped Qwen3
(d 512, 8 heads, GQA 8/4, QK-norm) run three ways on the same weights: `qwen4` causal,
`qwen4-block32` / `qwen4-block64` under the block-causal mask SDAR and LLaDA2 hand the model
(a query sees its own and earlier blocks of 32 / 64 from position 0; a 4-D bool mask, as
sinklens/models/sdar.py passes it). Batch 1, float32 unless --dtype.
Modes, interleaved in one process (so load hits each alike): --repeats rounds, each timing every
mode back to back in an order that rotates between rounds; the table gives each mode's best time
and, per mode, the median of the rounds' own ratios to the base ± its standard error (a bootstrap
over the rounds, benchmarks/common.py) with their range. Process
CPU time with one torch thread (wall time on a shared 2-core machine is mostly other jobs;
`--clock wall` times elapsed seconds instead, for a quiet machine):

- plain: the sinklens attention with no request (transformers' sdpa)
- compiled / exact / lse: capture of every layer and head through that route (AttentionRequest.route;
  compiled is the one-pass C kernel, the CPU default where it builds)
- chunkN: the exact route with a fixed query chunk of N (to compare with the automatic chunk)
- readouts: the --readout-route (default auto) plus the O(L·H·S) mechanism readouts (value and key norms, cos(q, k),
  diagonal share, hidden-state norms and top channels; sinklens/trace/readouts.py)
- distance: that route plus the distance profile; all: readouts and distance together
- lens: readouts plus the logit lens at every layer (final norm + LM head at the step's sink positions)

Ratios are to `--base` (default plain; `--base exact` for readouts-on against capture alone):

    PYTHONPATH=. python benchmarks/bench_capture.py --models smollm2 bidir6 --modes exact readouts distance \
        --base exact --seqs 256 512 1024

    PYTHONPATH=. python benchmarks/bench_capture.py --models llama4 bidir6 --seqs 256 512 1024 2048
    PYTHONPATH=. python benchmarks/bench_capture.py --models qwen4 qwen4-block32 qwen4-block64 --modes plain exact lse

`--breakdown` adds, per model and length, one forward of mode `all` under cProfile (CPU time):
the time inside each readout's code (the distance sums, the diagonal, the q/k/v readouts, the
hidden-state hook) as a share of that forward. cProfile adds its own cost to each Python call, so
these shares are upper bounds; the ratios of the table are the measurement:

    PYTHONPATH=. python benchmarks/bench_capture.py --models llama4 --modes exact all --base exact --breakdown
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import os
import pstats
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

import sinklens.attention as sa

from common import beside_busy, machine, paired  # benchmarks/common.py, beside this script


def random_llama(layers: int, causal: bool) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=8192, hidden_size=512, intermediate_size=1376, num_hidden_layers=layers,
                      num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=4096)
    cfg.is_causal = causal
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    model.config._attn_implementation = sa.ATTENTION_NAME
    return model


def random_qwen3(causal: bool) -> Qwen3ForCausalLM:
    """SDAR's architecture (Qwen3: GQA, QK-RMSNorm) at benchmark size; causal=False for the
    block-causal runs, which always hand the model their mask (as SDAR's config does)."""
    cfg = Qwen3Config(vocab_size=8192, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=4096)
    cfg.is_causal = causal
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval()
    model.config._attn_implementation = sa.ATTENTION_NAME
    return model


def block_of(name: str) -> int | None:
    """`qwen4-block32` -> 32; None for models without attention blocks."""
    return int(name.split("-block")[1]) if "-block" in name else None


def load(name: str, dtype: torch.dtype):
    if name == "smollm2":
        import sinklens
        return sinklens.load("smollm2-135m-instruct", dtype="float32").model.to(dtype)
    if name.startswith("qwen4"):
        return random_qwen3(causal=block_of(name) is None).to(dtype)
    return random_llama(*{"llama4": (4, True), "bidir6": (6, False)}[name]).to(dtype)


READOUT_ROUTE = ["auto"]   # --readout-route
READOUTS = dict(value_norms=True, qk_norms=True, diagonal=True, hidden_norms=True)
READOUT_MODES = {"readouts": READOUTS, "distance": dict(distance=True), "all": dict(READOUTS, distance=True),
                 "lens": dict(READOUTS, lens_layers="every")}   # item-1 readouts + the logit lens at every layer


def block_causal(s: int, block: int) -> torch.Tensor:
    """(1, 1, S, S) bool: query i sees key j iff j // block <= i // block."""
    b = torch.arange(s) // block
    return (b[None, :] <= b[:, None])[None, None]


def forward(model, mode: str, ids: torch.Tensor, mask: torch.Tensor | None = None):
    if mask is not None:
        model_kw = dict(attention_mask=mask, position_ids=torch.arange(ids.shape[1])[None])
    else:
        model_kw = {}
    if mode == "plain":
        return model(ids, use_cache=False, **model_kw).logits
    kw = {}
    if mode.startswith("chunk"):
        kw["query_chunk"] = int(mode[5:])
        mode = "exact"
    if mode in READOUT_MODES:
        from sinklens.attention.readouts import readout_hooks

        opts = dict(READOUT_MODES[mode])
        if opts.get("lens_layers") == "every":
            opts["lens_layers"] = tuple(range(model.config.num_hidden_layers))
        req = sa.AttentionRequest(capture=True, route=READOUT_ROUTE[0], **opts)
        with readout_hooks(model, req):
            model(ids, sinklens=req, use_cache=False, **model_kw)
        if req.lens_layers:   # after the forward, as SinkModel.run_model: final norm + LM head at the sink positions
            from sinklens.attention.readouts import finish_lens

            norm, head = model.get_decoder().norm, model.get_output_embeddings()
            finish_lens(req, lambda x: head(norm(x)).float(), {"causal": getattr(model.config, "is_causal", True)})
        return req.received
    if "route" in {f.name for f in dataclasses.fields(sa.AttentionRequest)}:
        kw["route"] = mode
    req = sa.AttentionRequest(capture=True, **kw)
    model(ids, sinklens=req, use_cache=False, **model_kw)
    return req.received


def readout_code() -> dict[tuple[str, str], str]:
    """(file, function name) -> the readout it computes, for --breakdown."""
    from sinklens.attention import readouts, reduce

    return {(reduce.__file__, "OffsetSums.add"): "distance sums", (reduce.__file__, "binned"): "distance binning",
            (reduce.__file__, "_add_diagonal"): "diagonal",
            (readouts.__file__, "record_vectors"): "value / key / query readouts",
            (readouts.__file__, "hook"): "hidden-state norms (forward hook)"}


def breakdown(model, ids, mask) -> str:
    """One forward of mode `all` under cProfile: seconds in each readout's code, and their share."""
    from sinklens.attention.reduce import OffsetSums

    prof = cProfile.Profile(timer=time.process_time)
    prof.enable()
    forward(model, "all", ids, mask)
    prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (calls, primitive calls, own, cumulative, callers)
    total = max(ct for *_, ct, _ in stats.values())
    offset_add = OffsetSums.add.__code__.co_firstlineno  # reduce.py has two `add`s: LayerSums' and this one
    code = readout_code()
    spent = {}
    for (path, line, name), (*_, ct, _) in stats.items():
        key = (path, "OffsetSums.add" if name == "add" and line == offset_add else name)
        if key in code:
            spent[code[key]] = spent.get(code[key], 0.0) + ct
    parts = [f"{label} {t:.3f} s ({100 * t / total:.1f} %)" for label, t in spent.items()]
    return f"forward {total:.3f} s: " + "; ".join(parts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["smollm2", "llama4", "bidir6"])
    p.add_argument("--seqs", nargs="+", type=int, default=[256, 512, 1024, 2048])
    p.add_argument("--modes", nargs="+", default=["plain", "exact", "lse"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clock", default="cpu", choices=["cpu", "wall"],
                   help="cpu: process CPU time (all threads; the default, robust to a shared machine); "
                        "wall: elapsed time, what a user waits (only meaningful on a quiet machine)")
    p.add_argument("--base", default="plain", help="the mode the ratios divide by (one of --modes)")
    p.add_argument("--breakdown", action="store_true", help="after each row, the readouts' share of one forward (cProfile)")
    p.add_argument("--readout-route", default="auto", help="the capture route of the readout modes")
    p.add_argument("--beside-busy", action="store_true", help="run beside a second process spinning on one core")
    args = p.parse_args()
    if args.base not in args.modes:
        p.error(f"--base {args.base} must be one of --modes {args.modes}")
    READOUT_ROUTE[0] = args.readout_route
    print(machine())
    with beside_busy(args.beside_busy):
        table(args)
    print("load average (1, 5, 15 min) at end: %.2f %.2f %.2f" % os.getloadavg())


def table(args) -> None:
    """The timed table: every model and length, the modes back to back in rotating order each round."""
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    print(f"clock: {args.clock}, {args.threads} torch thread(s), {args.repeats} rounds (times: best; ratios: median of the rounds' ± its standard error (range))")
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    dtype = getattr(torch, args.dtype)
    base = args.base
    others = [m for m in args.modes if m != base]
    print(f"| model | S | {base} s | " + " | ".join(f"{m} s" for m in others) + " | "
          + " | ".join(f"{m}/{base}" for m in others) + " |")
    print("|---" * (3 + 2 * len(others)) + "|")
    for name in args.models:
        model = load(name, dtype)
        vocab = model.config.vocab_size
        for s in args.seqs:
            ids = torch.randint(0, vocab, (1, s), generator=torch.Generator().manual_seed(s))
            block = block_of(name)
            mask = None if block is None else block_causal(s, block)
            for m in args.modes:  # warm-up
                forward(model, m, ids[:, :32], None if mask is None else mask[..., :32, :32])
            times = {m: [] for m in args.modes}
            for r in range(args.repeats):   # the modes back to back, in an order that rotates between rounds
                for m in args.modes[r % len(args.modes):] + args.modes[:r % len(args.modes)]:
                    t = clock()
                    forward(model, m, ids, mask)
                    times[m].append(clock() - t)
            best = {m: min(v) for m, v in times.items()}
            ratios = " | ".join(paired(times[m], times[base]) for m in others)
            print(f"| {name} | {s} | {best[base]:.3f} | " + " | ".join(f"{best[m]:.3f}" for m in others)
                  + f" | {ratios} |", flush=True)
            if args.breakdown:
                print(f"  {name} S={s} all, {breakdown(model, ids, mask)}", flush=True)
        del model


if __name__ == "__main__":
    main()
