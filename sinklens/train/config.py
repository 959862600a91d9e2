"""The trainer's configs (model shape, run settings), torch-free so `sinklens train --help`
builds its flags from them without importing torch: every `param` field here and in
`DataConfig` (train/data.py) is a `sinklens train` flag (sinklens/cli/fields.py)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from sinklens.params import check_fields, param
from sinklens.train.data import DataConfig


ASSETS = Path(__file__).resolve().parents[1] / "assets"     # the shipped twins, by name


def init_weights_path(init_from: str) -> Path | None:
    """The folder `init_from` names: a training run (ckpt/model.safetensors), an exported folder
    (model.safetensors) or a shipped twin's name (e.g. story9-arm-4l: a training config records
    the name, never a machine's path); None when it names none of these."""
    names = [Path(init_from)] + ([ASSETS / init_from] if init_from and "/" not in init_from else [])
    return next((p for p in names if any((p / f).is_file() for f in ("ckpt/model.safetensors", "model.safetensors"))),
                None)


@dataclass(frozen=True)
class ModelConfig:
    n_layers: int = param(4, int, "transformer layers", min=1)
    d_model: int = param(192, int, "hidden size (a multiple of --n-heads)", min=1)
    n_heads: int = param(6, int, "attention heads", min=1)
    mlp_hidden: int = param(512, int, "MLP hidden size", min=1)
    vocab_size: int = 256             # the tokenizer's, set by the trainer (TrainConfig.vocab_size asks for it)
    max_len: int = param(128, int, "context length in tokens", min=1)

    def __post_init__(self):
        check_fields(self)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")


@dataclass
class TrainConfig:
    kind: str = param("dlm", str, "dlm: LLaDA recipe; arm: next-token twin; dlm-shift: Dream's recipe (position "
                      "i-1 predicts masked token i), usually with --init-from an ARM run; dual: next-token + block-"
                      "diffusion loss on one set of weights (SDAR's layout, blocks of --block-length; train/dual.py), "
                      "usually with --init-from an ARM run",
                      choices=("dlm", "arm", "dlm-shift", "dual"))
    init_from: str = param("", str, "start from these weights: a run folder (its checkpoint), an exported folder "
                           "or a shipped twin's name, e.g. story9-arm-4l")
    out: str = param("runs/dlm", str, "run folder (checkpoints, log, curves, export/)")
    seed: int = param(0, int, "random seed (data order, initialisation)", min=0)
    steps: int = param(3000, int, "optimizer steps (length of the LR schedule and of the run)", min=1)
    stop_after: int = param(0, int, "stop with a checkpoint after this step (0 = run to --steps)", min=0)
    batch_size: int = param(64, int, "problems per batch", min=1)
    lr: float = param(2e-3, float, "peak learning rate", gt=0)
    min_lr_frac: float = param(0.1, float, "final learning rate as a share of --lr (cosine)", min=0, max=1)
    warmup: int = param(100, int, "linear warm-up steps", min=0)
    weight_decay: float = param(0.01, float, "AdamW weight decay", min=0)
    grad_clip: float = param(1.0, float, "gradient norm clip", gt=0)
    gen_length: int = param(24, int, "answer region in tokens (training and eval decoding)", min=1)
    block_length: int = param(0, int, "DLM eval decoding block (0 = the whole answer in one block)", min=0)
    mask_block: int = param(0, int, "DLM: mask as block decoding sees the answer: one block of this many tokens "
                                    "partly masked, the blocks before it clean, those after it masked (0 = LLaDA's "
                                    "masking over the whole answer)", min=0)
    log_every: int = param(25, int, "steps between log lines", min=1)
    eval_every: int = param(500, int, "steps between held-out evals", min=1)
    eval_n: int = param(200, int, "held-out problems per eval", min=1)
    ckpt_every: int = param(100, int, "steps between checkpoints", min=1)
    vocab_size: int = param(256, int, "tokenizer vocabulary size", min=1)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)

    def __post_init__(self):
        check_fields(self)
        if self.mask_block and self.kind in ("arm", "dual"):
            raise ValueError(f"--mask-block is a DLM's masking; --kind {self.kind} masks by --block-length")
        if self.kind == "dual" and not self.block_length:
            raise ValueError("--kind dual needs --block-length (its diffusion mode's block, e.g. 4 as SDAR's chat models)")
        if self.init_from and init_weights_path(self.init_from) is None:
            raise ValueError(f"init_from: {self.init_from} is neither a training run (ckpt/model.safetensors), "
                             "an exported folder (model.safetensors) nor a shipped twin")

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def diffusion(self) -> bool:
        """A diffusion-only twin (the dual twin is causal by default and diffuses in blocks: train/dual.py)."""
        return self.kind not in ("arm", "dual")

    @property
    def shift(self) -> bool:
        """Dream's convention: logits at position i - 1 predict token i."""
        return self.kind != "dlm"

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        d = dict(d)
        return cls(**{**d, "model": ModelConfig(**d["model"]), "data": DataConfig(**d["data"])})
