"""The package's layering, read from the source (every import, also those inside functions).

Layers, lowest first (docs/design.md, "Layers"): a module may import its own layer's package and
any lower layer, never a higher one, never a peer package of its own layer, and never the
package face (`sinklens/__init__.py`). No import cycle: the two registries (families in
`models/families.py`, samplers in `samplers/registry.py`) find their built-in modules by scanning
their package and importing them by name at run time, which is not an import statement; those
modules import the registry, never the other way round. A sampler's `config.py` (what the
command line reads for its flags) imports only the standard library and the config base.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "sinklens"

# Lowest first. Packages on one line are peers: they must not import each other.
LAYERS: list[tuple[str, ...]] = [
    ("_version", "params", "_lazy", "runlock", "columns", "cache"),  # utilities: import nothing from sinklens
    ("rule",),                    # the sink rule: declarations, numpy and torch implementations
    ("attention", "trace", "sandbox"),  # the capture function; the trace file format; the code sandbox (stdlib only)
    ("samplers", "masking"),      # drive a model step by step (write traces); a per-step masking hook
    ("models",),                  # family adapters, loader, SinkModel (its generate dispatches to samplers)
    ("train", "analysis"),        # the pure trainer; numpy analysis of traces
    ("report", "export"),          # outputs over analyses: figures and page; inputs for bertviz / circuitsvis
    ("eval",),
    ("experiments",),             # demo, replicate, study, score: built on everything above
    ("cli",),                     # the entry point and every sub-command's registration
    ("__main__",),                # `python -m sinklens`: calls the cli
]
RANK = {pkg: r for r, peers in enumerate(LAYERS) for pkg in peers}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The sinklens modules `name` imports (`from pkg import mod` counts as importing pkg.mod)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "sinklens"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "sinklens":
                continue
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.add(sub if sub in modules else mod)
    return out


def outside_imports(path: Path) -> set[str]:
    """Top-level names of the non-sinklens modules `path` imports (absolute imports only)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            out.add((node.module or "").split(".")[0])
    return out - {"sinklens"}


def graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {name: imports(name, path, modules) for name, path in modules.items()}


def layer(module: str) -> str:
    """'face' for sinklens/__init__.py, else the layer package."""
    parts = module.split(".")
    return "face" if len(parts) == 1 else parts[1]


def violations(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in sorted(g.items()):
        ls = layer(src)
        if ls == "face":
            continue
        for dst in sorted(targets):
            ld = layer(dst)
            if ld == "face":
                bad.append(f"{src} imports the package face (sinklens/__init__.py)")
            elif ld == ls:
                continue
            elif ld not in RANK or ls not in RANK:
                bad.append(f"{src} -> {dst}: package {ld if ld not in RANK else ls!r} has no layer in LAYERS")
            elif RANK[ld] > RANK[ls]:
                bad.append(f"{src} ({ls}) imports the higher layer {dst} ({ld})")
            elif RANK[ld] == RANK[ls]:
                bad.append(f"{src} ({ls}) imports its peer {dst} ({ld})")
    return bad


def cycles(g: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v), on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_every_package_has_a_layer():
    pkgs = {p.stem if p.is_file() else p.name for p in PKG.iterdir()
            if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()}
    assert pkgs - set(RANK) == set(), "add the new package to LAYERS here and in docs/design.md"


def test_no_lower_layer_imports_a_higher_one_or_the_face():
    assert violations(graph()) == []


def test_no_import_cycle():
    assert [sorted(c) for c in cycles(graph())] == []


def test_the_checks_catch_what_they_are_for():
    """The checker itself, on made-up graphs: an upward import, a peer import, the face, a cycle."""
    g = {"sinklens.trace.writer": {"sinklens.analysis.scores"}, "sinklens.masking.policy": {"sinklens.samplers.hooks"},
         "sinklens.eval.runner": {"sinklens"}, "sinklens.report.report": {"sinklens.analysis.analyze"}}
    bad = violations(g)
    assert len(bad) == 3  # sorted by importer: eval.runner, masking.policy, trace.writer
    assert "face" in bad[0] and "peer" in bad[1] and "higher layer" in bad[2]
    cyc = cycles({"sinklens.a.x": {"sinklens.a.y"}, "sinklens.a.y": {"sinklens.a.x"}, "sinklens.a.z": {"sinklens.a.x"}})
    assert sorted(map(sorted, cyc)) == [["sinklens.a.x", "sinklens.a.y"]]


@pytest.mark.slow
def test_a_samplers_config_imports_only_the_standard_library_and_the_config_base():
    """The command line imports every sampler's config (and its package) to build its flags: with
    torch there, --help would load torch. sample.py, imported on first use, may import anything."""
    g, modules, bad = graph(), all_modules(), []
    configs = [m for m in modules if m.startswith("sinklens.samplers.") and m.count(".") == 3 and m.endswith(".config")]
    assert {"sinklens.samplers.llada.config", "sinklens.samplers.dream.config"} <= set(configs)
    for config in configs:
        package = config.rpartition(".")[0]
        for name in (package, config):
            allowed = {"sinklens.samplers.registry", "sinklens.params", config}
            bad += [f"{name} imports {m}" for m in sorted(g[name] - allowed)]
            bad += [f"{name} imports {m}" for m in sorted(outside_imports(modules[name]) - set(sys.stdlib_module_names))]
    assert bad == []


def test_the_config_check_sees_torch(tmp_path):
    src = tmp_path / "config.py"
    src.write_text("import torch\nfrom dataclasses import dataclass\nfrom sinklens.samplers import registry\n")
    assert outside_imports(src) - set(sys.stdlib_module_names) == {"torch"}
    assert imports("sinklens.samplers.x.config", src, all_modules()) == {"sinklens.samplers.registry"}
