"""The capture routes, as a registry: each route one module declaring what it can record.

| route | module | records | where "auto" picks it |
|---|---|---|---|
| compiled | compiled.py (+ onepass.c, build.py) | all but full maps | CPU, float32, where the kernel builds |
| exact (whole layer) | exact_whole.py | received, groups, blocking (no keep_self) | CPU float32, layers ≤ SMALL_SCORES |
| triton | triton.py (+ triton_kernel.py) | received, groups, blocking, masks; output = sdpa's bits | CUDA, where triton is installed |
| lse | lse.py | everything; output = sdpa's bits | CUDA; CPU half precision |
| exact (chunked) | exact.py | everything, any device and dtype | the fallback everywhere |
| plain | plain.py | nothing (blocked keys as a mask) | requests that need no probabilities |

`choose_route` reads what a call needs (`Needs`) and returns the routes whose declaration covers
it and that can run here (`Route.available`), in order: the route the request names
(`AttentionRequest.route`) first (and its declared fallback: triton's is lse), then the "auto" ones
for the call's device and dtype in registry order. The attention function runs the first that
does not decline (a route may decline a call at run time: a small layer's rare underflow, a
per-head mask the C kernel does not take), so every call lands on a route that records it.
"""
from __future__ import annotations

from sinklens.attention.routes.base import Call, Modifiers, Needs, Records, Route
from sinklens.attention.routes.compiled import Compiled
from sinklens.attention.routes.exact import Exact
from sinklens.attention.routes.exact_whole import ExactWhole
from sinklens.attention.routes.lse import Lse
from sinklens.attention.routes.plain import Plain
from sinklens.attention.routes.triton import Triton

# Registry order is "auto"'s preference. ExactWhole answers to the name "exact" too: it is the exact
# route for a small layer, the chunked loop its fallback.
REGISTRY: tuple[Route, ...] = (Compiled(), ExactWhole(), Triton(), Lse(), Exact(), Plain())
BY_NAME: dict[str, Route] = {r.name: r for r in REGISTRY}
ALIASES = {"exact": ("exact-whole", "exact")}
PLAIN = BY_NAME["plain"]


def candidates(needs: Needs, named: str) -> tuple[Route, ...]:
    """The routes whose declaration covers `needs`, best first, for a request naming route `named`."""
    first = [BY_NAME[n] for n in ALIASES.get(named, (named,))] if named != "auto" else []
    if first and first[-1].fallback:
        first.append(BY_NAME[first[-1].fallback])
    auto = [r for r in REGISTRY if (needs.device, needs.dtype) in r.auto]
    out = []
    for r in first + auto:
        if r not in out and r.records.covers(needs):
            out.append(r)
    return tuple(out)


def choose_route(call: Call) -> tuple[Route, ...]:
    """The routes that can record what `call` asks and can run here, best first (see the module docstring).

    The candidates are a pure function of what `Needs.of` reads (the call's facts, the request's
    instructions) and the route the request names, so they are remembered for the process by those
    plain values (`Needs.key`). Within one forward (one request) the layers differ only in what they
    block, their mask, their modifiers and (a model spread over a GPU and the CPU) whether they run
    on the CPU: the routes available for those are remembered on the request. On a tiny twin, testing
    the declarations field by field, then building a key per layer, each cost a layer about what its
    kernel does."""
    req = call.req
    if not req.needs_probabilities:
        return (PLAIN,)
    mods, query = call.mods, call.query
    key = (call.blocked is None, call.attention_mask is None, mods.sinks is None, mods.softcap is None,
           query.dtype, query.is_cpu)
    memo = req._scratch.get("routes")
    if memo is None:
        memo = req._scratch["routes"] = {}
    routes = memo.get(key)
    if routes is None:
        full = Needs.key(call)
        covering = _CANDIDATES.get(full)
        if covering is None:
            covering = _CANDIDATES[full] = candidates(Needs.of(call), req.route)
        routes = memo[key] = tuple(r for r in covering if r.available(call))
    return routes


_CANDIDATES: dict[tuple, tuple[Route, ...]] = {}   # choose_route's key -> candidates(...)


__all__ = ["ALIASES", "BY_NAME", "Call", "Modifiers", "Needs", "REGISTRY", "Records", "Route", "candidates",
           "choose_route"]
