"""Validation of hyper-parameters, with messages that name the argument and the fix.

Shared by both backends so that the same bad input gets the same error.
"""

import math
from numbers import Integral, Real

import numpy as np


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


def non_negative(name, value, kernel):
    """A finite real number ``>= 0``."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{kernel}: `{name}` must be a finite non-negative number, got {value!r}.")
    return float(value)


def finite(name, value, kernel):
    """A finite real number."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"{kernel}: `{name}` must be a finite number, got {value!r}.")
    return float(value)


def int_at_least(name, value, minimum, kernel):
    """An integer ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(f"{kernel}: `{name}` must be an integer >= {minimum}, got {value!r}.")
    return int(value)


def positive_definite(name, value, kernel):
    """A positive scalar, a vector of positive diagonal entries, or a symmetric positive-definite matrix;
    returned as a float64 NumPy array."""
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        array = None
    if array is None or array.ndim > 2 or not np.all(np.isfinite(array)):
        raise ValueError(
            f"{kernel}: `{name}` must be a positive scalar, a vector of positive diagonal entries or a symmetric "
            f"positive-definite matrix, got {value!r}."
        )
    if array.ndim < 2:
        if not np.all(array > 0):
            raise ValueError(f"{kernel}: `{name}` must have positive entries, got {value!r}.")
        return array
    if array.shape[0] != array.shape[1] or not np.allclose(array, array.T, rtol=1e-6, atol=0):
        raise ValueError(f"{kernel}: `{name}` must be a square symmetric matrix, got shape {array.shape}.")
    try:
        np.linalg.cholesky(array)
    except np.linalg.LinAlgError:
        raise ValueError(f"{kernel}: `{name}` must be positive definite (its Cholesky factorisation failed).") from None
    return array


def initial_theta(value, num_partitions, auto_grid, kernel):
    """CSGLD's ``initial_theta``: ``m`` positive finite weights on an explicit grid, normalised to the simplex."""
    try:
        theta = None if isinstance(value, str) else np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        theta = None
    if theta is None or theta.shape != (num_partitions,) or not np.all(np.isfinite(theta)) or not np.all(theta > 0):
        raise ValueError(
            f"{kernel}: `initial_theta` must be {num_partitions} (= num_partitions) positive finite weights, got {value!r}."
        )
    if auto_grid:
        raise ValueError(
            f"{kernel}: `initial_theta` weights the bins of a known grid; give `energy_min` and `energy_gap` "
            "explicitly (not \"auto\")."
        )
    return theta / theta.sum()
