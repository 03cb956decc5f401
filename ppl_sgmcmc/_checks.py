"""Validation of hyper-parameters, with messages that name the argument and the fix.

Shared by both backends so that the same bad input gets the same error.
"""

import math
from numbers import Integral, Real

import numpy as np


def _number(value):
    """The Python number of a 0-d array (NumPy, JAX or torch); other values unchanged."""
    if getattr(value, "shape", None) == () and hasattr(value, "item"):
        return value.item()
    return value


def boolean(name, value, kernel):
    """``True`` or ``False`` (a string such as ``"no"`` would read as true)."""
    value = _number(value)
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{kernel}: `{name}` must be True or False, got {value!r}.")
    return bool(value)


def positive(name, value, kernel):
    """A finite, strictly positive real number."""
    value = _number(value)
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{kernel}: `{name}` must be a finite positive number, got {value!r}.")
    return float(value)


def in_unit_interval(name, value, kernel):
    """A real number in the open interval (0, 1)."""
    value = _number(value)
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


def first_step_size(value, kernel):
    """The step size of step 0 (a schedule's first value): positive (``inf`` is SGFS's ``α = 0``)."""
    h = float(value)
    if not h > 0:
        raise ValueError(
            f"{kernel}: the step size at step 0 is {h!r}; it must be a positive number. Check the `step_size` "
            "schedule."
        )


def mass_options(adapt_mass_matrix, dense_mass, tuned, can_adapt, reason, kernel):
    """``(adapt_mass_matrix, dense_mass)`` resolved: the adaptation defaults to on when the step size is tuned
    (``tuned``), which needs it; an algorithm that cannot adapt (``can_adapt`` false, for ``reason``) refuses it
    and cannot tune its step size. ``dense_mass=None`` (chosen by the dimension) stays ``None`` while the
    preconditioner adapts, and is ``False`` when it does not."""
    if adapt_mass_matrix is not None:
        adapt_mass_matrix = boolean("adapt_mass_matrix", adapt_mass_matrix, kernel)
    if dense_mass is not None:
        dense_mass = boolean("dense_mass", dense_mass, kernel)
    if not can_adapt:
        if adapt_mass_matrix or dense_mass:
            raise ValueError(
                f"{kernel}: `adapt_mass_matrix`/`dense_mass` are not available: {reason} Use SGLD, SGHMC, SGNHT, "
                "pSGLD, CSGLD or CSGHMC for an adapted preconditioner."
            )
        if tuned:
            raise ValueError(f"{kernel}: give a `step_size`: the warm-up tunes step sizes in coordinates of an "
                             f"adapted preconditioner, which {kernel} does not use ({reason})")
        return False, False
    if adapt_mass_matrix is None:
        adapt_mass_matrix = tuned
    if tuned and not adapt_mass_matrix:
        raise ValueError(
            f"{kernel}: the step size is tuned in the coordinates of the adapted preconditioner, whose curvature "
            "sets its cap: leave adapt_mass_matrix on, or give a `step_size`."
        )
    if dense_mass and not adapt_mass_matrix:
        raise ValueError(
            f"{kernel}: `dense_mass=True` chooses the adapted preconditioner's form, but adapt_mass_matrix=False; "
            "set adapt_mass_matrix=True (or leave the step size to the warm-up)."
        )
    if dense_mass is None and not adapt_mass_matrix:
        dense_mass = False
    return adapt_mass_matrix, dense_mass


def estimator(value, names, estimator_type, kernel):
    """A gradient estimator: one of ``names`` (``{name: factory}``) or an estimator object."""
    if isinstance(value, estimator_type):
        return value
    if isinstance(value, str) and value in names:
        return names[value]()
    raise ValueError(
        f"{kernel}: unknown gradient {value!r}; give one of {', '.join(map(repr, names))} or an estimator of "
        "ppl_sgmcmc.gradients (e.g. control_variates(centre=...), svrg(epoch_length=...))."
    )


def find_mode(value, by_default, default_steps, kernel):
    """The optimiser steps of ``find_mode``: ``None`` is ``default_steps`` when ``by_default`` (a tuned step
    size, a control-variate centre) and 0 otherwise, ``True``/``False`` are ``default_steps``/0, an integer is a
    number of steps."""
    value = _number(value)
    if value is None:
        return default_steps if by_default else 0
    if isinstance(value, (bool, np.bool_)):
        return default_steps if value else 0
    if not isinstance(value, Integral) or value < 0:
        raise ValueError(
            f"{kernel}: `find_mode` must be True, False or a number of optimiser steps (>= 0), got {value!r}."
        )
    return int(value)


def schedule_or(check, name, value, kernel):
    """A schedule (a callable of the step index), or a value that passes ``check(name, value, kernel)``."""
    if callable(value):
        return value
    return check(name, value, kernel)


def positive_int(name, value, kernel):
    """A strictly positive integer."""
    value = _number(value)
    if isinstance(value, bool) or not isinstance(value, Integral) or value <= 0:
        raise ValueError(f"{kernel}: `{name}` must be a positive integer, got {value!r}.")
    return int(value)


def non_negative(name, value, kernel):
    """A finite real number ``>= 0``."""
    value = _number(value)
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{kernel}: `{name}` must be a finite non-negative number, got {value!r}.")
    return float(value)


def finite(name, value, kernel):
    """A finite real number."""
    value = _number(value)
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"{kernel}: `{name}` must be a finite number, got {value!r}.")
    return float(value)


def int_at_least(name, value, minimum, kernel):
    """An integer ``>= minimum``."""
    value = _number(value)
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


def positive_latents(supports, is_positive, kernel):
    """SGRLD's model: every latent site (``supports``: ``{name: support}``) has a positive support, by the
    backend's ``is_positive(support)``."""
    for name, support in supports.items():
        if not is_positive(support):
            raise ValueError(
                f"{kernel}: latent site {name!r} has support {support}; SGRLD moves positive latents "
                "only (preconditioner diag(θ), mirrored at 0). Declare it with a positive-support prior (e.g. "
                "`dist.Gamma(beta, 1.0)`, the expanded-mean parametrisation), or use SGLD, SGHMC or SGNHT."
            )


def gibbs_options(gibbs_sites, gibbs_fn, gibbs_sweeps, kernel_name, has_model=True, gibbs_init=None):
    """The kernels' local Gibbs options (``gibbs_sites``, ``gibbs_fn``, ``gibbs_sweeps``, ``gibbs_init``):
    ``None`` when none are given, else ``(sites, fn, (burn_in, kept), init)``."""
    if gibbs_sites is None and gibbs_fn is None:
        if gibbs_init is not None:
            raise ValueError(f"{kernel_name}: `gibbs_init` needs `gibbs_sites` and `gibbs_fn`.")
        return None
    if gibbs_fn is None:
        raise ValueError(
            f"{kernel_name}: `gibbs_sites` needs `gibbs_fn`, the conditional update "
            "`gibbs_fn(rng_key, gibbs_sites, hmc_sites, subsample_indices) -> gibbs_sites` of those sites."
        )
    if not callable(gibbs_fn):
        raise TypeError(f"{kernel_name}: `gibbs_fn` must be callable, got {type(gibbs_fn).__name__}.")
    if gibbs_init is not None and not callable(gibbs_init):
        raise TypeError(f"{kernel_name}: `gibbs_init` must be callable, got {type(gibbs_init).__name__}.")
    if gibbs_sites is None:
        raise ValueError(f"{kernel_name}: `gibbs_fn` needs `gibbs_sites`, the names of the sites it updates.")
    if isinstance(gibbs_sites, str):
        gibbs_sites = [gibbs_sites]
    gibbs_sites = tuple(gibbs_sites)
    if not gibbs_sites or not all(isinstance(s, str) for s in gibbs_sites):
        raise ValueError(f"{kernel_name}: `gibbs_sites` must be a non-empty list of site names, got {gibbs_sites!r}.")
    if not has_model:
        raise ValueError(f"{kernel_name}: local Gibbs sites need a `model`, not a `potential_fn`.")
    try:
        burn_in, kept = gibbs_sweeps
    except (TypeError, ValueError):
        raise ValueError(
            f"{kernel_name}: `gibbs_sweeps` must be a pair `(burn_in, kept)` of sweep counts, got {gibbs_sweeps!r}."
        ) from None
    for name, value, minimum in (("burn_in", burn_in, 0), ("kept", kept, 1)):
        if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
            raise ValueError(
                f"{kernel_name}: `gibbs_sweeps` = (burn_in, kept) needs an integer {name} >= {minimum}, got {value!r}."
            )
    return gibbs_sites, gibbs_fn, (int(burn_in), int(kept)), gibbs_init


class GibbsFnError(RuntimeError):
    """``gibbs_fn`` (or ``gibbs_init``) broke its contract: it must return a dict with exactly the keys
    of ``gibbs_sites``, each of the shape of the minibatch's site. Both backends check what it returns
    and raise this error, naming the kernel, the function and the expected keys or shape, from the
    first stochastic gradient on (NumPyro: the kernel's ``init``; Pyro: its first ``sample``).

    **Example** (a two-component mixture with a local membership ``z``; ``gibbs_fn`` renames it)::

        >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
        >>> from ppl_sgmcmc.numpyro import SGLD
        >>> from ppl_sgmcmc.numpyro.gibbs import GibbsFnError
        >>> def model(x):
        ...     mu = numpyro.sample("mu", dist.Normal(0.0, 3.0).expand([2]).to_event(1))
        ...     with numpyro.plate("data", x.shape[0], subsample_size=4):
        ...         z = numpyro.sample("z", dist.Categorical(probs=jnp.array([0.5, 0.5])))
        ...         numpyro.sample("x", dist.Normal(mu[z], 1.0), obs=numpyro.subsample(x, event_dim=0))
        >>> def gibbs_fn(rng_key, gibbs_sites, hmc_sites, subsample_indices):
        ...     return {"labels": gibbs_sites["z"]}  # should be {"z": ...}
        >>> kernel = SGLD(model, step_size=1e-3, gibbs_sites=["z"], gibbs_fn=gibbs_fn)
        >>> try:
        ...     kernel.init(jax.random.PRNGKey(0), 0, {"mu": jnp.zeros(2)}, model_args=(jnp.arange(10.0),))
        ... except GibbsFnError as err:
        ...     print(err)
        SGLD: `gibbs_fn` must return a dict with the keys ['z'], got ['labels'].
    """


def gibbs_result(new, current, shape, label, kernel):
    """The sites ``new`` returned by ``gibbs_fn`` (``label``), checked against the ``current`` ones: a dict
    with the same keys and, by ``shape(value)``, the same shapes."""
    if not isinstance(new, dict) or set(new) != set(current):
        raise GibbsFnError(
            f"{kernel}: `{label}` must return a dict with the keys {sorted(current)}, got "
            f"{sorted(new) if isinstance(new, dict) else type(new).__name__}."
        )
    for name, value in new.items():
        if tuple(shape(value)) != tuple(shape(current[name])):
            raise GibbsFnError(
                f"{kernel}: `{label}` returned {name!r} of shape {tuple(shape(value))}; the minibatch's site has "
                f"shape {tuple(shape(current[name]))}."
            )
    return new


def gibbs_sites(names, sites, data_sites, kernel, plate_call):
    """Check that each local Gibbs site in ``names`` is a latent sample site of the model (``sites``:
    ``{name: site}`` of a prototype trace, plates' index sites left out) inside a subsampled plate
    (``data_sites``); ``plate_call`` is how the PPL declares one, for the message."""
    latent = [k for k, s in sites.items() if s["type"] == "sample" and not s["is_observed"]]
    for site in names:
        if site not in sites or sites[site]["type"] != "sample":
            raise ValueError(
                f"{kernel}: `gibbs_sites` names {site!r}, which is not a sample site of the model; its latent "
                f"sample sites are {', '.join(map(repr, latent)) or 'none'}."
            )
        if sites[site]["is_observed"]:
            raise ValueError(f"{kernel}: Gibbs site {site!r} is observed; name latent sites only.")
        if site not in data_sites:
            raise ValueError(
                f"{kernel}: Gibbs site {site!r} is not inside a subsampled plate. Local Gibbs sites are redrawn "
                f"for each minibatch and must lie inside `{plate_call}(name, N, subsample_size=n)` with n < N; "
                "a global discrete latent is not supported (marginalise it out)."
            )
