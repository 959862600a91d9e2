"""The sandbox lives in `sinklens.sandbox`; `runner.py` and `tasks.py` still import its config from here."""
from sinklens.sandbox import SandboxConfig  # noqa: F401
