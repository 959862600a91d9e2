"""The paper's sink rule in one home: declarations (spec.py, no numpy/torch), the numpy
implementation for the analysis and for masking (np_rule.py) and the torch one for the logit lens'
sink positions on the model's device (torch_rule.py).
Import the module you need; this package face imports nothing heavy."""
from sinklens.rule.spec import (DEFAULT_EPS, DEFAULT_PROTOCOL, DEFAULT_UNITS, PROTOCOLS, UNITS, Visibility,  # noqa: F401
                                check_units, layer_visibilities)
