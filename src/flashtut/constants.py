"""Numerical constants the kernels and references share, written once.

GPUs have a fast base-2 exponential (``ex2.approx``); ``exp(x) = 2 ** (x * LOG2E)``, so kernels
fold ``LOG2E`` into the softmax scale and work in base 2, and convert the log-sum-exp they
return back to natural log with ``LN2``.
"""
from __future__ import annotations

import math

#: log2(e): multiply a natural-log exponent by it to use ``exp2``
LOG2E = math.log2(math.e)
#: ln(2): multiply a base-2 logarithm by it to get the natural log
LN2 = math.log(2.0)
