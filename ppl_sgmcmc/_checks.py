"""Validation of hyper-parameters, with messages that name the argument and the fix.

Shared by both backends so that the same bad input gets the same error.
"""

import math
from numbers import Integral, Real


def positive(name, value, kernel):
    """A finite, strictly positive real number."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{kernel}: `{name}` must be a finite positive number, got {value!r}.")
    return float(value)


def in_unit_interval(name, value, kernel):
    """A real number in the open interval (0, 1)."""
    if isinstance(value, bool) or not isinstance(value, Real) or not 0 < value < 1:
        raise ValueError(f"{kernel}: `{name}` must lie strictly between 0 and 1, got {value!r}.")
    return float(value)


def choice(name, value, options, kernel):
    """One of a fixed set of strings."""
    if value not in options:
        raise ValueError(f"{kernel}: unknown {name} {value!r}; choose one of {', '.join(map(repr, options))}.")
    return value


def step_size(value, kernel):
    """A positive float, or a schedule: a callable of the step index returning the step size."""
    if callable(value):
        return value
    return positive("step_size", value, kernel)


def positive_int(name, value, kernel):
    """A strictly positive integer."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value <= 0:
        raise ValueError(f"{kernel}: `{name}` must be a positive integer, got {value!r}.")
    return int(value)
