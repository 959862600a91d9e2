"""The trainer's configs (model shape, run settings), torch-free so `sinklens train --help`
builds its flags from them without importing torch."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from sinklens.train.data import DataConfig


@dataclass(frozen=True)
class ModelConfig:
    n_layers: int = 4
    d_model: int = 192
    n_heads: int = 6
    mlp_hidden: int = 512
    vocab_size: int = 256
    max_len: int = 128

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")


@dataclass
class TrainConfig:
    kind: str = "dlm"                 # "dlm" (LLaDA recipe), "arm", or "dlm-shift" (Dream's recipe:
                                      # the masked token at i is predicted at position i - 1)
    init_from: str = ""               # start from another run's weights (its --out) or an exported ARM folder
    out: str = "runs/dlm"
    seed: int = 0
    steps: int = 3000                 # length of the LR schedule and of the run
    stop_after: int = 0               # stop (with a checkpoint) after this step; 0 = run to `steps`
    batch_size: int = 64
    lr: float = 2e-3
    min_lr_frac: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    gen_length: int = 24
    block_length: int = 0             # DLM eval decoding block (0 = whole answer in one block)
    log_every: int = 25
    eval_every: int = 500
    eval_n: int = 200
    ckpt_every: int = 100
    vocab_size: int = 256
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)

    def __post_init__(self):
        if self.kind not in ("dlm", "arm", "dlm-shift"):
            raise ValueError(f"kind must be 'dlm', 'arm' or 'dlm-shift', got {self.kind!r}")
        if self.init_from and not any((Path(self.init_from) / f).is_file()
                                      for f in ("ckpt/model.safetensors", "model.safetensors")):
            raise ValueError(f"init_from: {self.init_from} is neither a training run (ckpt/model.safetensors) "
                             "nor an exported folder (model.safetensors)")
        for name in ("steps", "batch_size", "gen_length", "log_every", "eval_every", "ckpt_every", "eval_n"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def diffusion(self) -> bool:
        return self.kind != "arm"

    @property
    def shift(self) -> bool:
        """Dream's convention: logits at position i - 1 predict token i."""
        return self.kind != "dlm"

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        d = dict(d)
        return cls(**{**d, "model": ModelConfig(**d["model"]), "data": DataConfig(**d["data"])})
