"""Attention capture and masking (see docs/design.md, Contract 2)."""
from sinklens.attention.function import ATTENTION_NAME, register, sinklens_attention
from sinklens.attention.request import AttentionRequest

register()

__all__ = ["ATTENTION_NAME", "AttentionRequest", "register", "sinklens_attention"]
