"""sinklens/_lazy.py: a module bound by name is imported by its first attribute read (not before),
and reads go to the module (a later patch there is seen); `no_grad` disables grad at call time;
a `PackageRegistry` imports its package's modules (but `skip` and `_private`) on the first read,
and a module that fails to import is reported on every read, never a partial registry."""
import sys

import pytest
import torch

from sinklens._lazy import PackageRegistry, lazy, no_grad


def write_package(root, name, modules: dict[str, str]):
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f"from sinklens._lazy import PackageRegistry\nREG = PackageRegistry({name!r}, "
                                     "skip=('infra',))\n")
    for mod, text in modules.items():
        (pkg / f"{mod}.py").write_text(text)


def test_lazy_imports_on_first_read_and_follows_the_module(tmp_path, monkeypatch):
    (tmp_path / "lazyprobe_mod.py").write_text("VALUE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    proxy = lazy("lazyprobe_mod")
    assert repr(proxy) == "<lazy module 'lazyprobe_mod'>" and "lazyprobe_mod" not in sys.modules
    assert proxy.VALUE == 3 and "lazyprobe_mod" in sys.modules
    monkeypatch.setattr(sys.modules["lazyprobe_mod"], "VALUE", 4)
    assert proxy.VALUE == 4
    monkeypatch.delitem(sys.modules, "lazyprobe_mod")


def test_no_grad_at_call_time():
    @no_grad
    def f(x):
        return x * 2

    with torch.inference_mode(False), torch.enable_grad():  # conftest runs each test in inference mode
        x = torch.ones(2, requires_grad=True)
        assert not f(x).requires_grad and (x * 2).requires_grad


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
