"""Loading LLaDA, MMaDA, Dream and Llama/Qwen2 ARM checkpoints into native transformers classes."""
from .families import FAMILIES, Family, detect_family, get_family, register_family
from .loader import ALIASES, load, register_alias
from .wrapper import SinkModel

__all__ = ["FAMILIES", "Family", "detect_family", "get_family", "register_family", "ALIASES", "load", "register_alias", "SinkModel"]
