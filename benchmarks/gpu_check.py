"""The GPU check: capture routes against eager attention, capture cost against flash sdpa, and a
traced and a masked 8B-shaped LLaDA generation; nothing is downloaded (random weights, bfloat16).

    python benchmarks/gpu_check.py                 # one CUDA GPU; sized for < 8 minutes on one H100
    python benchmarks/gpu_check.py --smoke         # tiny shapes on the CPU (the test suite runs this)

Models, random weights built on the device: LLaDA-shaped (bidirectional Llama, no GQA, LLaDA's
RoPE and norms: 1B = 16 layers x d 2048 x 16 heads, 8B = 32 x 4096 x 32, vocab 126464) and
Llama-shaped (causal, GQA: 1B = 16 x 2048 x 32/8 heads, 8B = 32 x 4096 x 32/8, vocab 128256).

1. Correctness, two layers of each shape at S = 512, bfloat16 and float32: received attention (and
   logits) of the lse and triton routes against transformers' eager attention (`output_attentions=True`, column
   sums over real query rows) on every layout: causal, bidirectional, block-causal (blocks of 32),
   left padding, a causal sliding window of 128 (the last two as the 4-D masks models hand over).
   Max abs differences, and whether the route's logits have plain mode's bits (transformers'
   sdpa, on the rows of real queries); "n/a" where a route declares it cannot take the call (the
   registry sends it elsewhere).
2. The column-sum kernel alone against flash sdpa alone, one layer, two tile shapes.
3. Capture cost: one forward of each full-depth model in bfloat16, plain (transformers' sdpa)
   and capture through each route that takes bfloat16, at S = 1k .. 16k (batch 1), wall time after
   synchronising, one warm-up at that length then best of 3 (lse up to 4k: seconds a forward beyond);
   peak memory per forward. A row is skipped once the budget would run out. Then a torch.profiler
   table of one captured forward: where the time beyond the kernels goes.
4. An 8B-shaped LLaDA generation (prompt 64, gen 256, block 32, 256 steps): plain, traced (as
   `sinklens trace`) and masked (top-1 sink per head, as `sinklens eval --mask-topk 1`), each through
   the default route and the lse route, each after a one-block warm-up (compiling a kernel variant is
   not a step's cost), in 3 rounds of every mode back to back: ms per step, its ratio to plain (the
   median of the rounds' own ratios: at batch 1 a step is bound by Python and kernel launches, whose
   speed moves between runs), peak GPU memory, and whether the tokens are the plain generation's (a
   trace must not change them) / the masked one's (whichever route).

Prints one markdown table per part, with the device and its date.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import statistics
import tempfile
import time
import traceback

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import sinklens.attention as sa
import sinklens.attention.routes as routes
from sinklens.attention.routes import BY_NAME

# (layers, d_model, heads, kv heads, mlp hidden, vocab) of the published shapes
SHAPES = {
    "llada-1b": (16, 2048, 16, 16, 5632, 126464), "llada-8b": (32, 4096, 32, 32, 12288, 126464),
    "llama-1b": (16, 2048, 32, 8, 8192, 128256), "llama-8b": (32, 4096, 32, 8, 14336, 128256),
}
SMOKE_SHAPES = {"llada-8b": (2, 64, 4, 4, 96, 320), "llama-8b": (2, 64, 4, 2, 96, 320)}
LAYOUTS = ("causal", "bidirectional", "block-causal", "left-padding", "window")
BLOCK, WINDOW = 32, 128
CAPTURE_ROUTES = ("lse", "triton")
TILES = ((64, 64, 4), (64, 128, 4))  # (block_m, block_n, warps) the kernel table tries
LSE_UP_TO = 4096  # the lse route is timed up to this length
BUDGET_S = 420
PARTS = ("routes", "kernel", "cost", "generation")
# the generation part's modes (name, capture route) and whose tokens each must equal: tracing must not
# change a generation, and a masked one is the same whichever route records it
GEN_MODES = (("plain", "auto"), ("trace", "auto"), ("trace-lse", "lse"), ("mask", "auto"), ("mask-lse", "lse"))
SAME_AS = {"trace": "plain", "trace-lse": "plain", "mask-lse": "mask"}
GEN_ROUNDS = 3  # rounds of the generation part (every mode once per round)  # the timing part stops here (the whole check: under 8 minutes on one H100)


def build(shape_name: str, shapes: dict, device, layers: int | None = None, dtype=torch.bfloat16):
    """A random model of that shape, built on the device (no CPU copy of 8B weights)."""
    n_layers, d, h, kv, mlp, vocab = shapes[shape_name]
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=d, intermediate_size=mlp, num_hidden_layers=layers or n_layers,
                      num_attention_heads=h, num_key_value_heads=kv, max_position_embeddings=32768,
                      rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                      tie_word_embeddings=False, use_cache=False)
    cfg.is_causal = shape_name.startswith("llama")
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(old)
    return model


@contextlib.contextmanager
def taken(route: str):
    """A list that holds True once `route` ran a call (rather than declining it or being unavailable)."""
    r, used = BY_NAME[route], []
    if route == "plain":
        yield [True]
        return
    run = r.run

    def spy(call):
        out = run(call)
        if out is not None and not used:
            used.append(True)
        return out

    r.run = spy
    try:
        yield used
    finally:
        del r.run


def layout_inputs(layout: str, s: int, vocab: int, device, dtype):
    """(ids (1|2, S), forward kwargs, real query rows (B, S) bool, is_causal) of a layout. Block-causal and
    window layouts hand the model a 4-D additive mask (0 = attend, finfo.min = not), as eager reads it."""
    ids = torch.randint(0, vocab - 8, (1, s), generator=torch.Generator().manual_seed(s)).to(device)
    real = torch.ones(1, s, dtype=torch.bool, device=device)
    if layout == "left-padding":
        ids = ids.expand(2, s).clone()
        am = torch.ones(2, s, dtype=torch.long, device=device)
        am[0, : s // 8] = 0
        return ids, {"attention_mask": am}, am.bool(), None
    if layout in ("block-causal", "window"):
        i = torch.arange(s, device=device)
        if layout == "block-causal":  # SDAR / LLaDA2: blocks see themselves and every earlier block
            ok = i[None, :] // BLOCK <= i[:, None] // BLOCK
        else:  # a causal sliding window
            ok = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - WINDOW)
        mask = torch.zeros(1, 1, s, s, dtype=dtype, device=device).masked_fill_(~ok, torch.finfo(dtype).min)
        return ids, {"attention_mask": mask, "position_ids": i[None]}, real, False
    return ids, {}, real, layout == "causal"


def eager_received(model, ids, kw, real) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, (L, B, H, S) column sums of transformers' eager maps over the real query rows)."""
    model.config._attn_implementation = "eager"
    out = model(ids, output_attentions=True, **kw)
    model.config._attn_implementation = sa.ATTENTION_NAME
    rows = real[:, None, :, None].to(out.attentions[0].dtype)
    return out.logits.float(), torch.stack([(a.float() * rows).sum(2) for a in out.attentions])


def correctness(shapes: dict, device, s: int, dtype):
    """One table row per (shape, layout), as each is done: each route's max abs difference from eager
    in received attention and in logits, and whether its logits have plain mode's (sdpa's) bits."""
    for name in shapes:
        model = build(name, shapes, device, layers=2, dtype=dtype)
        own_causal = model.config.is_causal
        for layout in LAYOUTS:
            ids, kw, real, causal = layout_inputs(layout, s, model.config.vocab_size, device, dtype)
            model.config.is_causal = own_causal if causal is None else causal
            with torch.no_grad():
                ref_logits, ref = eager_received(model, ids, kw, real)
                plain_logits = model(ids, **kw).logits.float()
                cells = []
                for route in CAPTURE_ROUTES:
                    req = sa.AttentionRequest(capture=True, query_mask=real, route=route)
                    try:
                        with taken(route) as used:
                            logits = model(ids, sinklens=req, **kw).logits.float()
                    except ImportError:
                        logits = None
                    if logits is None or not used:
                        cells.append("n/a")
                        continue
                    same = "yes" if torch.equal(logits[real], plain_logits[real]) else "no"   # rows of real queries
                    cells.append(f"{(req.received - ref).abs().max().item():.1e} / "
                                 f"{(logits - ref_logits)[real].abs().max().item():.1e} / {same}")
            yield f"| {name} | {str(dtype)[6:]} | {layout} | " + " | ".join(cells) + " |"
        del model


def kernel_cost(device, seqs: list[int], heads: int, kv_heads: int, d: int) -> list[str]:
    """One layer's attention of an 8B shape: flash sdpa alone (output + lse) against the column-sum
    kernel alone, for a few tile shapes (which one the route should use)."""
    from triton.testing import do_bench

    from sinklens.attention.fused import fused_sdpa_with_lse
    from sinklens.attention.triton_kernel import column_sums

    rows = []
    for s in seqs:
        for causal in (True, False):
            g = torch.Generator(device=device).manual_seed(s)
            q = torch.randn(1, heads, s, d, device=device, dtype=torch.bfloat16, generator=g)
            k = torch.randn(1, kv_heads, s, d, device=device, dtype=torch.bfloat16, generator=g)
            v = torch.randn_like(k)
            _, lse = fused_sdpa_with_lse(q, k, v, None, d ** -0.5, causal)
            sdpa_ms = do_bench(lambda: fused_sdpa_with_lse(q, k, v, None, d ** -0.5, causal))
            cells = []
            for bm, bn, warps in TILES:
                ms = do_bench(lambda: column_sums(q, k, lse, d ** -0.5, causal, block_m=bm, block_n=bn,
                                                  num_warps=warps))
                cells.append(f"{ms:.2f} ({ms / sdpa_ms:.2f}x)")
            rows.append(f"| {heads}/{kv_heads} | {s} | {'causal' if causal else 'bidirectional'} | {sdpa_ms:.2f} | "
                        + " | ".join(cells) + " |")
            print(rows[-1], flush=True)
    return rows


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def peak_reset(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_gb(device) -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if torch.device(device).type == "cuda" else float("nan")


def timed_forward(model, ids, mode: str, device) -> tuple[float, float]:
    """(seconds, peak GB) of one forward in `mode` (plain or a route)."""
    req = None if mode == "plain" else sa.AttentionRequest(capture=True, route=mode)
    sync(device)
    peak_reset(device)
    t = time.perf_counter()
    with torch.no_grad():
        model(ids, sinklens=req) if req is not None else model(ids)
    sync(device)
    return time.perf_counter() - t, peak_gb(device)


def timed_routes() -> tuple[str, ...]:
    """The capture routes that take bfloat16 (a route declared float32-only would be timed as its fallback)."""
    return tuple(r for r in CAPTURE_ROUTES if torch.bfloat16 in BY_NAME[r].records.dtypes)


def capture_cost(shapes: dict, device, seqs: list[int], budget_s: float) -> list[str]:
    rows, start = [], time.perf_counter()
    modes = ("plain",) + timed_routes()
    for name in sorted(shapes, key=lambda n: -shapes[n][1]):   # the 8B shapes first, should the budget run out
        model = build(name, shapes, device)
        model.config._attn_implementation = sa.ATTENTION_NAME
        for s in seqs:
            ids = torch.randint(0, model.config.vocab_size - 8, (1, s), device=device)
            best = {}
            for mode in modes:
                spent = time.perf_counter() - start
                if spent > budget_s:
                    break
                if mode == "lse" and s > LSE_UP_TO:   # seconds a forward there; its ratio only grows
                    best[mode] = (float("nan"), float("nan"))
                    continue
                try:
                    with taken(mode) as used:
                        timed_forward(model, ids, mode, device)   # warm-up at this length (kernels, allocator)
                    if not used:   # the route is not available here: its fallback would be timed
                        best[mode] = (float("nan"), float("nan"))
                        continue
                    runs = [timed_forward(model, ids, mode, device) for _ in range(3)]
                    best[mode] = (min(r[0] for r in runs), max(r[1] for r in runs))
                except (ImportError, RuntimeError) as e:   # no triton; out of memory
                    best[mode] = (float("nan"), float("nan"))
                    print(f"  {name} S={s} {mode}: {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)
            if len(best) < len(modes):
                rows.append(f"| {name} | {s} | skipped: the {budget_s:.0f} s budget is spent |" + " |" * (2 * len(modes)))
                continue
            base = best["plain"][0]
            cell = lambda x, fmt: "-" if x != x else format(x, fmt)  # noqa: E731  (nan: not timed)
            rows.append(f"| {name} | {s} | " + " | ".join(cell(1e3 * best[m][0], ".1f") for m in modes) + " | "
                        + " | ".join(cell(best[m][0] / base, ".2f") + "x" * (best[m][0] == best[m][0]) for m in modes[1:])
                        + " | " + " | ".join(cell(best[m][1], ".1f") for m in modes) + " |")
            print(rows[-1], flush=True)
        del model
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    return rows


def overhead_profile(shapes: dict, device, s: int) -> str:
    """torch.profiler over one captured forward (route "triton") of the 8B-shaped LLaDA at length s:
    where the time beyond the kernels goes (the ops by their own CPU time)."""
    from torch.profiler import ProfilerActivity, profile

    model = build("llada-8b", shapes, device)
    model.config._attn_implementation = sa.ATTENTION_NAME
    ids = torch.randint(0, model.config.vocab_size - 8, (1, s), device=device)
    for mode in ("plain", "triton"):
        timed_forward(model, ids, mode, device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.device(device).type == "cuda" else [])
    tables = []
    for mode in ("plain", "triton"):
        with profile(activities=acts) as prof:
            seconds, _ = timed_forward(model, ids, mode, device)
        tables.append(f"{mode}: {1e3 * seconds:.1f} ms\n"
                      + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=48))
    del model
    return "\n".join(tables)


def generation(shapes: dict, device, gen: int, block: int, prompt: int, rounds: int = GEN_ROUNDS) -> list[str]:
    """Plain / traced / masked generations of the 8B-shaped LLaDA through SinkModel (the LLaDA family):
    each mode once to warm up (one block: compiling a kernel variant is not a step's cost), then
    `rounds` rounds of every mode back to back, in an order that rotates between rounds. A step here
    is bound by Python and kernel launches, whose speed moves between rounds: a ratio is the median
    of the rounds' own ratios to plain."""
    from sinklens.masking.config import MaskingConfig
    from sinklens.masking.policy import SinkMaskingPolicy
    from sinklens.models.families import get_family
    from sinklens.models.wrapper import SinkModel
    from sinklens.samplers import CaptureOptions
    from sinklens.train.model import ModelConfig, llada_config

    n_layers, d, h, _, mlp, vocab = shapes["llada-8b"]
    model = build("llada-8b", shapes, device)
    model.config._attn_implementation = sa.ATTENTION_NAME
    cfg = ModelConfig(n_layers=n_layers, d_model=d, n_heads=h, mlp_hidden=mlp, vocab_size=vocab, max_len=4096)
    conf = llada_config(cfg, mask_id=vocab - 1, eos_id=vocab - 2, pad_id=vocab - 3, dtype="bfloat16")
    m = SinkModel(model, get_family("llada"), None, conf, {"name_or_path": "random llada-8b shape"})
    ids = torch.randint(0, vocab - 8, (1, prompt), generator=torch.Generator().manual_seed(0)).to(device)
    settings = dict(steps=gen, gen_length=gen, block_length=block)
    routes_of = dict(GEN_MODES)
    ms = {mode: [] for mode in routes_of}
    peaks, tokens, steps = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:

        def run(mode: str, **over) -> tuple[float, object]:
            hook = SinkMaskingPolicy(MaskingConfig(mask_k=1), num_layers=m.num_layers, is_diffusion=True, model=m) \
                if mode.startswith("mask") else None
            path = os.path.join(tmp, "t.arrow") if mode.startswith("trace") else None
            sync(device)
            peak_reset(device)
            t = time.perf_counter()
            with torch.no_grad():
                out = m.generate(ids, trace=path, hook=hook, capture=CaptureOptions(route=routes_of[mode]),
                                 **dict(settings, **over))
            sync(device)
            return time.perf_counter() - t, out

        for mode in routes_of:
            run(mode, steps=block, gen_length=block)
        modes = list(routes_of)
        for r in range(rounds):
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
                seconds, out = run(mode)
                ms[mode].append(1e3 * seconds / out.num_steps)
                peaks.setdefault(mode, []).append(peak_gb(device))
                tokens.setdefault(mode, out.sequences)
                steps[mode] = out.num_steps
                if not torch.equal(out.sequences, tokens[mode]):
                    raise RuntimeError(f"{mode}: round {r} generated other tokens than round 0")
    rows = []
    for mode in routes_of:
        ratios = sorted(a / p for a, p in zip(ms[mode], ms["plain"]))
        ref = SAME_AS.get(mode)
        same = f"{ref}: " + ("yes" if torch.equal(tokens[mode], tokens[ref]) else "no") if ref else "-"
        rows.append(f"| llada-8b | {mode} | {steps[mode]} | {statistics.median(ms[mode]):.1f} | "
                    f"{statistics.median(ratios):.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f}) | {max(peaks[mode]):.1f} | {same} |")
    return rows


def part(run) -> None:
    """Run one part of the check; a failure prints its traceback and the next part still runs."""
    try:
        run()
    except Exception:
        print("```\n" + traceback.format_exc() + "```", flush=True)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: the code paths, not the numbers")
    ap.add_argument("--seqs", nargs="+", type=int, default=None, help="capture-cost lengths (default 1k..16k)")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help="seconds the capture-cost part may take")
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="which parts to run (default: all)")
    args = ap.parse_args(argv)
    want = set(args.parts)
    torch.set_grad_enabled(False)
    if args.smoke:
        device, shapes, seqs, s_check, gen, block, prompt = "cpu", SMOKE_SHAPES, args.seqs or [64], 64, 8, 4, 8
    else:
        if not torch.cuda.is_available():
            raise SystemExit("gpu_check: no CUDA device here; --smoke runs the tiny CPU version")
        device, shapes, seqs, s_check, gen, block, prompt = "cuda", SHAPES, args.seqs or [1024, 2048, 4096, 8192, 16384], \
            512, 256, 32, 64
    what = torch.cuda.get_device_name() if device == "cuda" else "CPU (smoke: tiny shapes)"
    print(f"## GPU check, {datetime.date.today()}, {what}, torch {torch.__version__}\n")
    t0 = time.perf_counter()
    if "routes" in want:
        routes_table(shapes, device, s_check)
    if "kernel" in want and device == "cuda":
        print(f"\n### One layer: sdpa (output + lse) against the column-sum kernel alone, bfloat16, D = 128\n")
        print("| heads / kv heads | S | layout | sdpa ms | " + " | ".join(f"kernel {bm}x{bn}, {w} warps ms" for bm, bn, w in TILES)
              + " |")
        print("|---|---|---|---|" + "---|" * len(TILES))
        part(lambda: [kernel_cost(device, [4096, 16384], h, kv, 128) for h, kv in ((32, 32), (32, 8))])
    if "cost" in want:
        print(f"\n### Capture against plain (transformers' sdpa), one forward, batch 1, best of 3\n")
        modes = ("plain",) + timed_routes()
        print("| model | S | " + " | ".join(f"{m} ms" for m in modes) + " | "
              + " | ".join(f"{m}/plain" for m in modes[1:]) + " | " + " | ".join(f"{m} peak GB" for m in modes) + " |")
        print("|---|---|" + "---|" * (3 * len(modes) - 1))
        part(lambda: capture_cost(shapes, device, seqs, args.budget_s))
        print(f"\n### Where a captured forward's time goes (8B-shaped LLaDA, S = {s_check * 2})\n\n```")
        part(lambda: print(overhead_profile(shapes, device, s_check * 2)))
        print("```")
    if "generation" in want:
        print(f"\n### 8B-shaped LLaDA generation (prompt {prompt}, gen {gen}, block {block}, {gen} steps), "
              f"{GEN_ROUNDS} rounds\n")
        print("| model | mode | steps | ms / step (median) | / plain: median (range) of the rounds | peak GB | "
              "same tokens as |")
        print("|---|---|---|---|---|---|---|")
        part(lambda: [print(row, flush=True) for row in generation(shapes, device, gen, block, prompt)])
    print(f"\n(total {time.perf_counter() - t0:.0f} s)")


def routes_table(shapes: dict, device, s_check: int) -> None:
    print(f"### Routes against eager attention (2 layers of each shape, S = {s_check})\n")
    print("| model | dtype | layout | " + " | ".join(f"{r}: received / logits max abs diff / plain's bits" for r in CAPTURE_ROUTES)
          + " |")
    print("|---|---|---|" + "---|" * len(CAPTURE_ROUTES))
    for dtype in (torch.bfloat16, torch.float32):
        part(lambda: [print(row, flush=True) for row in correctness(shapes, device, s_check, dtype)])


if __name__ == "__main__":
    main()
