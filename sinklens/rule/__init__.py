"""The paper's sink rule in one home: declarations (spec.py, no numpy/torch), the numpy
implementation (np_rule.py) that the analysis, sink masking and the logit lens all call.
Import the module you need; this package face imports nothing heavy."""
from sinklens.rule.spec import (DEFAULT_EPS, DEFAULT_PROTOCOL, DEFAULT_UNITS, PROTOCOLS, UNITS, Visibility,  # noqa: F401
                                check_units, layer_visibilities)
