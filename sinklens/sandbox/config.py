"""What a sandboxed run may use (`SandboxConfig`) and what it gave (`SandboxResult`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class SandboxConfig:
    timeout: float = 10.0               # wall-clock seconds before everything is killed
    cpu_seconds: int = 10               # RLIMIT_CPU
    memory_bytes: int = 1 << 30         # RLIMIT_AS (address space)
    file_bytes: int = 16 << 20          # RLIMIT_FSIZE (largest file the program may write)
    max_processes: int = 32             # RLIMIT_NPROC (for the sandbox uid)
    max_open_files: int = 256           # RLIMIT_NOFILE
    tmpfs_bytes: int = 64 << 20         # size of each private tmpfs: the program's whole disk
    max_files: int = 64                 # files + folders in the working directory where no tmpfs can be had
    mode: str = "auto"                  # "auto" (bwrap; refused without it) | "bwrap" | "fallback" (by name only)
    network: str = "auto"               # fallback only: "auto" (netns if permitted) | "netns" | "audit"
    output_limit: int = 4096            # characters of stdout/stderr kept (tail)

    def __post_init__(self):
        if self.mode not in ("auto", "bwrap", "fallback"):
            raise ValueError(f"SandboxConfig.mode must be 'auto', 'bwrap' or 'fallback', got {self.mode!r}")
        if self.network not in ("auto", "netns", "audit"):
            raise ValueError(f"SandboxConfig.network must be 'auto', 'netns' or 'audit', got {self.network!r}")
        if not self.timeout > 0:
            raise ValueError(f"SandboxConfig.timeout must be > 0 seconds, got {self.timeout}")
        for name in ("cpu_seconds", "memory_bytes", "file_bytes", "max_processes",
                     "max_open_files", "tmpfs_bytes", "max_files", "output_limit"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxConfig.{name} must be > 0, got {getattr(self, name)}")


@dataclass
class SandboxResult:
    passed: bool                # the harness proved check() returned (nonce seen) and exit 0
    status: str                 # "passed" | "failed" | "unproven" | "timeout" | "signal:<NAME>"
    returncode: int | None
    duration: float             # wall-clock seconds
    stdout: str
    stderr: str
    isolation: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)
