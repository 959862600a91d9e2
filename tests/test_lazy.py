"""sinklens/_lazy.py: a `PackageRegistry` imports its package's modules (but `skip` and `_private`)
on the first read, or with `submodule` that module of every subpackage (the samplers' `config`,
never their `sample`), and a module that fails to import is reported on every read, never a
partial registry."""
import sys

import pytest

from sinklens._lazy import PackageRegistry


def write_package(root, name, modules: dict[str, str], submodule=None):
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f"from sinklens._lazy import PackageRegistry\nREG = PackageRegistry({name!r}, "
                                     f"skip=('infra',), submodule={submodule!r})\n")
    for mod, text in modules.items():  # "a/config" is module config of subpackage a
        path = pkg / f"{mod}.py"
        path.parent.mkdir(exist_ok=True)
        if path.parent != pkg:
            (path.parent / "__init__.py").touch()
        path.write_text(text)


def test_registry_imports_its_modules_on_first_read(tmp_path, monkeypatch):
    register = "from {pkg} import REG\nREG[{name!r}] = {name!r}\n"
    write_package(tmp_path, "regprobe", {"b": register.format(pkg="regprobe", name="b"),
                                         "a": register.format(pkg="regprobe", name="a"),
                                         "infra": "raise RuntimeError('infra is skipped')\n",
                                         "_private": "raise RuntimeError('private is skipped')\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    import regprobe

    assert "regprobe.a" not in sys.modules
    assert list(regprobe.REG) == ["a", "b"]  # sorted by module name
    for mod in ("regprobe", "regprobe.a", "regprobe.b"):
        monkeypatch.delitem(sys.modules, mod)


def test_registry_reports_a_broken_module_on_every_read(tmp_path, monkeypatch):
    write_package(tmp_path, "regbroken", {"bad": "raise RuntimeError('bad module')\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    import regbroken

    for _ in range(2):
        with pytest.raises(RuntimeError, match="bad module"):
            len(regbroken.REG)
    monkeypatch.delitem(sys.modules, "regbroken")


def test_registry_with_a_submodule_imports_that_module_of_each_subpackage(tmp_path, monkeypatch):
    register = "from {pkg} import REG\nREG[{name!r}] = {name!r}\n"
    write_package(tmp_path, "subprobe", {"b/config": register.format(pkg="subprobe", name="b"),
                                         "a/config": register.format(pkg="subprobe", name="a"),
                                         "a/sample": "raise RuntimeError('sample is imported on use only')\n",
                                         "lengths": "raise RuntimeError('a plain module is infrastructure')\n",
                                         "_c/config": register.format(pkg="subprobe", name="c")},
                  submodule="config")
    monkeypatch.syspath_prepend(str(tmp_path))
    import subprobe

    assert list(subprobe.REG) == ["a", "b"] and "subprobe.a.sample" not in sys.modules
    for mod in [m for m in sys.modules if m.split(".")[0] == "subprobe"]:
        monkeypatch.delitem(sys.modules, mod)
