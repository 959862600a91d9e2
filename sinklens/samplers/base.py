"""Old import path of four names other code imports from here. Their homes: `sinklens.samplers.capture`
(CaptureOptions, masked_unmasked_groups), `.hooks` (StepEvent) and `.steps` (cut_at_end)."""
from sinklens.samplers.capture import CaptureOptions, masked_unmasked_groups  # noqa: F401
from sinklens.samplers.hooks import StepEvent  # noqa: F401
from sinklens.samplers.steps import cut_at_end  # noqa: F401
