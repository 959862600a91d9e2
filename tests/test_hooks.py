"""The hook protocol's `attention_mask` keyword: given only to a `before_step` that takes it, whether
the hook is a method (remembered per class) or any other callable attribute."""
import torch

from sinklens.samplers.hooks import Hooks


class WithMask:
    def __init__(self):
        self.seen = []

    def before_step(self, step, tokens, is_masked, attention_mask=None):
        self.seen.append(attention_mask)


class WithoutMask:
    def __init__(self):
        self.calls = 0

    def before_step(self, step, tokens, is_masked):
        self.calls += 1


class FunctionAttribute:
    """before_step as a plain function stored on the instance (no __func__)."""

    def __init__(self):
        self.seen = []
        self.before_step = lambda step, tokens, is_masked, attention_mask=None: self.seen.append(attention_mask)


def test_attention_mask_only_to_hooks_that_take_it():
    tokens = torch.zeros(1, 4, dtype=torch.long)
    masked = torch.zeros(1, 4, dtype=torch.bool)
    real = torch.tensor([[False, True, True, True]])
    for _ in range(2):   # a second Hooks of the same classes: the remembered answer, the same behaviour
        a, b, c = WithMask(), WithoutMask(), FunctionAttribute()
        Hooks([a, b, c]).before_step(0, tokens, masked, real)
        assert a.seen[0] is real and c.seen[0] is real
        assert b.calls == 1   # called without the keyword it does not take
