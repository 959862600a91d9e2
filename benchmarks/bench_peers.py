"""sinklens capture beside the other routes to the same numbers, side by side in one run.

Each route computes every layer's per-head received attention (column sums of the attention
maps) of one forward pass, batch 1, float32, on
- `smollm2`: SmolLM2-135M-Instruct (real weights, causal, 30 layers, GQA 9/3), and
- `bidir`: a random LLaDA-shaped bidirectional Llama (8 layers, d 1024, 16 heads, vocab 8192).
Routes:
- plain:     no capture (transformers' sdpa through the sinklens attention): the floor
- sinklens-compiled / -exact / -lse: `AttentionRequest(capture=True, route=...)` (compiled: the
             one-pass C route, the CPU default where it builds)
- eager:     transformers' eager attention with `output_attentions=True`, maps column-summed
- tlens:     TransformerLens (`transformer-lens` 4.x `TransformerBridge` around the HF model),
             `run_with_cache` with only the `hook_pattern` hooks
- nnsight:   nnsight tracing the eager model, saving each layer's attention weights
Time: process CPU seconds (one torch thread), best of --repeats, routes interleaved.
Memory: peak RSS growth during one more call over the RSS just before it (a sampling thread,
0.5 ms; never during a timed call),
run with glibc's mmap threshold fixed (MALLOC_MMAP_THRESHOLD_=131072, set by this script when
it re-executes itself) so that freed buffers leave RSS and a route's peak is its own.

    pip install -e .[bench]
    PYTHONPATH=. python benchmarks/bench_peers.py --seqs 256 512 1024
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time

if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None:  # re-exec with a fixed mmap threshold (see docstring)
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "131072"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import sinklens.attention as sa  # noqa: E402
from benchmarks.bench_attention import peak_growth  # noqa: E402

ROUTES = ("plain", "sinklens-compiled", "sinklens-exact", "sinklens-lse", "eager", "tlens", "nnsight")


def load(name: str) -> LlamaForCausalLM:
    if name == "smollm2":
        import sinklens
        return sinklens.load("smollm2-135m-instruct", dtype="float32").model
    cfg = LlamaConfig(vocab_size=8192, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=4096)
    cfg.is_causal = False  # LLaDA: bidirectional
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    model.config._attn_implementation = sa.ATTENTION_NAME
    return model


class Routes:
    """One model, wrapped once per route (TransformerLens and nnsight each get their own copy)."""

    def __init__(self, model, routes):
        self.model = model
        self.eager = copy.deepcopy(model)
        self.eager.set_attn_implementation("eager")
        self.tl = self.nn = None
        if "tlens" in routes:
            from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module
            tl_model = copy.deepcopy(self.eager)
            self.tl = build_bridge_from_module(tl_model, "LlamaForCausalLM", hf_config=tl_model.config)
        if "nnsight" in routes:
            from nnsight import NNsight
            self.nn = NNsight(copy.deepcopy(self.eager))

    def run(self, route: str, ids: torch.Tensor) -> torch.Tensor | None:
        """(L, H, S) received attention (None for plain)."""
        if route == "plain":
            self.model(ids, use_cache=False)
            return None
        if route.startswith("sinklens"):
            req = sa.AttentionRequest(capture=True, route=route.split("-")[1])
            self.model(ids, sinklens=req, use_cache=False)
            return req.received[:, 0]
        if route == "eager":
            out = self.eager(ids, output_attentions=True, use_cache=False)
            return torch.stack([a[0].sum(1) for a in out.attentions])
        if route == "tlens":
            _, cache = self.tl.run_with_cache(ids, names_filter=lambda n: n.endswith("hook_pattern"))
            return torch.stack([cache[f"blocks.{l}.attn.hook_pattern"][0].sum(1)
                                for l in range(self.model.config.num_hidden_layers)])
        saved = []
        with self.nn.trace(ids, use_cache=False):
            for layer in self.nn.model.layers:
                saved.append(layer.self_attn.output[1].save())
        return torch.stack([s[0].sum(1) for s in saved])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["smollm2", "bidir"])
    p.add_argument("--seqs", nargs="+", type=int, default=[256, 512, 1024, 2048])
    p.add_argument("--routes", nargs="+", default=list(ROUTES), choices=ROUTES)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    others = [r for r in args.routes if r != "plain"]
    print("| model | S | " + " | ".join(f"{r} s" for r in args.routes) + " | "
          + " | ".join(f"{r} peak MB" for r in args.routes) + " | max abs diff vs eager |")
    print("|---" * (3 + 2 * len(args.routes)) + "|")
    for name in args.models:
        routes = Routes(load(name), args.routes)
        for s in args.seqs:
            ids = torch.randint(0, routes.model.config.vocab_size, (1, s), generator=torch.Generator().manual_seed(s))
            for r in args.routes:
                routes.run(r, ids[:, :16])  # warm-up
            cpu, mem = {r: float("inf") for r in args.routes}, {}
            for _ in range(args.repeats):  # time without the memory sampler (its CPU would count)
                for r in args.routes:
                    t = time.process_time()
                    routes.run(r, ids)
                    cpu[r] = min(cpu[r], time.process_time() - t)
            for r in args.routes:
                mem[r] = peak_growth(lambda: routes.run(r, ids))
            diff = ""
            if "eager" in args.routes:
                ref = routes.run("eager", ids)
                diff = ", ".join(f"{r} {(routes.run(r, ids) - ref).abs().max().item():.1e}"
                                 for r in others if r != "eager")
            print(f"| {name} | {s} | " + " | ".join(f"{cpu[r]:.2f}" for r in args.routes) + " | "
                  + " | ".join(f"{mem[r]:.0f}" for r in args.routes) + f" | {diff} |", flush=True)
        del routes


if __name__ == "__main__":
    main()
