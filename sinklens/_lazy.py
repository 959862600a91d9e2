"""A registry that imports its package's modules on its first read.

The sampler and family registries are `PackageRegistry`s. Their built-in entries live one per
module (`sinklens/models/dream.py`) or one per subpackage (`sinklens/samplers/dream/config.py`)
of their package and register themselves when imported; the registry imports every such module
on its first read, so adding one is adding a file (or a folder), with no list to edit.
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable, MutableMapping
from typing import Any


class PackageRegistry(MutableMapping):
    """name -> registered object (a dict, in registration order). The first read imports, sorted by
    name and leaving out the `skip` ones and private `_x` ones: every module of `package` (no
    `submodule`), or the module `submodule` of every subpackage (`submodule="config"`: the
    samplers); those modules register their entries while imported. Writes never import."""

    def __init__(self, package: str, skip: Iterable[str] = (), submodule: str | None = None):
        self.package, self.skip, self.submodule = package, frozenset(skip), submodule
        self._entries: dict[str, Any] = {}
        self._discovered = False

    def discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True  # first: the modules imported below read and write this registry
        try:
            path = importlib.import_module(self.package).__path__
            for info in sorted(pkgutil.iter_modules(path), key=lambda info: info.name):
                if info.name.startswith("_") or info.name in self.skip or info.ispkg != bool(self.submodule):
                    continue
                leaf = f".{self.submodule}" if self.submodule else ""
                importlib.import_module(f"{self.package}.{info.name}{leaf}")
        except BaseException:
            self._discovered = False  # a module failed to import: say so again on the next read, not a partial registry
            raise

    def __getitem__(self, name: str) -> Any:
        self.discover()
        return self._entries[name]

    def __iter__(self):
        self.discover()
        return iter(self._entries)

    def __len__(self) -> int:
        self.discover()
        return len(self._entries)

    def __setitem__(self, name: str, value: Any) -> None:
        self._entries[name] = value

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __repr__(self) -> str:
        return f"PackageRegistry({self.package!r}, {list(self)})"
