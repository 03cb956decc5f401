"""Contour stochastic gradient Langevin dynamics (CSGLD) and its momentum version (CSGHMC):
Deng, Lin & Liang, *A Contour Stochastic Gradient Langevin Dynamics Algorithm for Simulations of
Multi-modal Distributions*, NeurIPS 2020. The CSGLD algorithm page of the documentation derives it.

The energy axis is cut into ``m`` bins by the grid ``u_k = u_min + k Δu`` (``k = 1..m-1``; bin 0 is
``(-∞, u_min + Δu]``, bin ``m-1`` is ``(u_min + (m-1) Δu, ∞)``). Written 0-based, the stochastic
energy index of a point ``x`` with minibatch energy ``Ũ = Ũ_t(x)`` is::

    j(x) = clip(ceil((Ũ - u_min) / Δu) - 1, 0, m - 1)

(the paper's ``J̃(x) = j(x) + 1``).

The chain samples the flattened density ``ϖ(x) ∝ π(x) / Ψ_θ(U(x))^ζ`` of eq. (5), whose gradient is
the ordinary one times a multiplier; the partition weights ``θ`` (a point of the simplex, uniform at
the start) are learned on the fly by stochastic approximation. One step, at the point ``x`` where
the step takes its (only) stochastic gradient, with ``j = j(x)`` and ``j⁻ = max(j - 1, 0)``::

    θ(i) ← θ(i) + ω_k θ(j)^ζ (1[i = j] - θ(i))              for all i     (eq. 9; k counts updates)
    mult = 1 + (ζ τ / Δu) (log θ(j) - log θ(j⁻))                             (eq. 6)
    CSGLD:   x' = x - h mult ∇Ũ_t(x) + sqrt(2 h τ) ξ                          (eq. 8)
    CSGHMC:  the SGHMC move of :mod:`ppl_sgmcmc.rules.sghmc` (Euler or splitting) with the
             gradient ∇Ũ_t replaced by mult ∇Ũ_t

``ω_k`` is ``sa_step_size`` (a float or a schedule of the 1-based update count ``k``; default
``1 / (k^0.6 + 100)``, the paper's). The multiplier can be negative: that is the mechanism that
pushes the sampler up out of a local trap, not an error. ``θ`` stays uniform (``mult = 1``) during
the first ``calibration_steps`` steps and, if ``adaptation_steps`` is given, stops learning after
that many steps. ``θ`` is floored at the dtype's smallest normal number so that ``log θ`` stays finite
(an exactly zero ``θ(j)`` could never grow again: its update is proportional to ``θ(j)^ζ``).

**Above the grid** (``Ũ > u_min + m Δu``) ``Ψ`` is held at ``θ(m-1)`` and the multiplier is 1: the
paper's last piece of eq. (5) extends the log-linear slope to ``+∞``, which can give a single far-out
draw all the weight of a run.

**Importance weights.** The samples follow ``ϖ``, not ``π``; each carries the log weight
``log w = ζ log Ψ_θ(Ũ(x))``, where the interpolated ``Ψ`` of eq. (5) is::

    log Ψ_θ(u) = log θ(j⁻) + (log θ(j) - log θ(j⁻)) (u - u_min - j Δu) / Δu      (j = j(u))

(``weight="interpolated"``, the default: the exact weight of the density the chain samples, for any
fixed ``θ``), or the paper's ``log w = ζ log θ(j(x))``
(``weight="bin"``, the ``m → ∞`` limit of the former; at coarse grids it biases mode masses, see
the algorithm page). ``θ`` in both is the estimate
after this step's update, ``θ_k(J̃(x_k))`` of Theorem 2. Posterior expectations are
``Σ w f(x) / Σ w``, see :mod:`ppl_sgmcmc.importance`.

**Which point is the sample.** The weight, the partition index and ``Ũ`` belong to the point where
the gradient was taken. So that a sample and its weight always match, :func:`step` returns *that
point* as the new position and keeps the integrator's own position (one move ahead) in the state:
for CSGLD the sample sequence is the Langevin chain itself, one step behind the integrator; for
CSGHMC with the splitting integrator it is the chain of midpoints ``θ + (h/2) p``. The ``position``
argument of :func:`step` (the previous sample) is therefore not used. No energy is evaluated besides
the one that comes with the gradient.

**Energy grid calibration.** ``energy_min=None`` (and/or ``energy_gap=None``) chooses the grid
from the first ``calibration_steps`` steps, during which ``θ`` stays uniform (so ``mult = 1``: plain
SGLD/SGHMC) and the weights are meaningless: ``u_min`` is the smallest minibatch energy seen in those
steps, ``Δu`` the standard deviation of the minibatch energies over their second half. A grid below
the lowest energy leaves bin 0 empty, its ``θ`` decays to 0 and the multiplier explodes in the first
occupied bin; a ``Δu`` much finer than the energy's fluctuation amplifies the noise of ``log θ`` by
``ζ τ / Δu`` (the algorithm page has the measurements).
"""

from typing import NamedTuple

from array_api_compat import array_namespace, device

from ppl_sgmcmc.rules import sghmc, sgld
from ppl_sgmcmc.rules._types import Array

NEEDS = "gradient"  # what the rule reads from the gradient (see ppl_sgmcmc.rules)
INTEGRATORS = ("langevin", "euler", "splitting")
WEIGHTS = ("interpolated", "bin")


def default_sa_step_size(k):
    """The paper's stochastic-approximation step size ``ω_k = 1 / (k^0.6 + 100)`` (``k``: the 1-based update count).

    **Example**::

        >>> from ppl_sgmcmc.rules.csgld import default_sa_step_size
        >>> [round(default_sa_step_size(k), 5) for k in (1, 100, 10_000)]
        [0.0099, 0.00863, 0.00285]
    """
    return 1.0 / (k**0.6 + 100.0)


class CSGLDState(NamedTuple):
    """State of a CSGLD/CSGHMC chain.

    - **position**: the integrator's position, one move ahead of the sample (see the module docstring).
    - **momentum**: CSGHMC's momentum ``p``; ``None`` for CSGLD.
    - **theta**: the partition weights ``θ`` (``m`` entries on the simplex).
    - **energy_min**, **energy_gap**: the grid ``u_min`` and ``Δu`` (being calibrated while
      ``count < calibration_steps``).
    - **energy_mean**, **energy_m2**: running mean and sum of squared deviations of the energies of
      the calibration window (Welford), for ``Δu``.
    - **count**: steps taken (int32); the stochastic approximation has made ``count - calibration_steps``
      updates.
    - **log_weight**: ``log w`` of the last sample; **partition**: its 0-based bin ``j``; **multiplier**:
      the gradient multiplier used at it.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import csgld
        >>> state = csgld.init(jnp.zeros(2), jnp.zeros(2), num_partitions=3, energy_min=0.0, energy_gap=1.0)
        >>> state.theta.shape, state.momentum is None, int(state.count), float(state.multiplier)
        ((3,), True, 0, 1.0)
    """

    position: Array
    momentum: Array | None
    theta: Array
    energy_min: Array
    energy_gap: Array
    energy_mean: Array
    energy_m2: Array
    count: Array  # type: ignore[assignment]  # (shadows tuple.count)
    log_weight: Array
    partition: Array
    multiplier: Array


def init(
    position,
    noise,
    num_partitions,
    energy_min=None,
    energy_gap=None,
    calibration_steps=0,
    integrator="langevin",
    temperature=1.0,
    initial_theta=None,
):
    """Uniform ``θ`` (or ``initial_theta``); the grid as given (placeholders while it is calibrated); CSGHMC's momentum
    ``p ~ N(0, τ I)`` from the standard normal ``noise``.

    :param position: the chain's start ``x_0``, a flat array; the state takes its dtype.
    :param noise: ``ζ``, a standard normal draw of the shape of ``position`` (CSGHMC's momentum ``sqrt(τ) ζ``).
    :param num_partitions: ``m``, the number of energy bins.
    :param energy_min: ``u_min``, or ``None`` to calibrate it (then ``calibration_steps >= 2``, or 0 for a
        chain continued from a state whose grid was calibrated).
    :param energy_gap: ``Δu``, or ``None`` to calibrate it (likewise).
    :param integrator: ``"langevin"`` (CSGLD, no momentum, default), ``"euler"`` or ``"splitting"`` (CSGHMC).
    :param calibration_steps: steps with uniform ``θ`` that calibrate the grid (default 0).
    :param temperature: ``τ`` (default 1).
    :param initial_theta: ``θ``'s starting value (``m`` weights on the simplex) instead of the uniform one.
        The other arguments are those of :func:`step`.
    :return: :class:`CSGLDState`.
    :raises ValueError: a grid to calibrate with fewer than 2 ``calibration_steps``.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import csgld
        >>> x, noise = jnp.array([1.0, -2.0]), jnp.array([0.5, -0.5])
        >>> state = csgld.init(x, noise, num_partitions=4, energy_min=0.0, energy_gap=1.0)
        >>> state.theta.tolist(), state.momentum is None
        ([0.25, 0.25, 0.25, 0.25], True)
        >>> csgld.init(x, noise, num_partitions=4, energy_min=0.0, energy_gap=1.0, integrator="splitting").momentum.tolist()
        [0.5, -0.5]
    """
    xp, dtype, dev = array_namespace(position), position.dtype, device(position)
    _check_calibration(energy_min, energy_gap, calibration_steps)

    def scalar(value):
        return xp.asarray(value, dtype=dtype, device=dev)

    momentum = None if integrator == "langevin" else temperature**0.5 * noise
    return CSGLDState(
        position=position,
        momentum=momentum,
        theta=(
            xp.full((num_partitions,), 1.0 / num_partitions, dtype=dtype, device=dev)
            if initial_theta is None
            else xp.asarray(initial_theta, dtype=dtype, device=dev)
        ),
        energy_min=scalar(0.0 if energy_min is None else energy_min),
        energy_gap=scalar(1.0 if energy_gap is None else energy_gap),
        energy_mean=scalar(0.0),
        energy_m2=scalar(0.0),
        count=xp.asarray(0, dtype=xp.int32, device=dev),
        log_weight=scalar(0.0),
        partition=xp.asarray(0, dtype=xp.int32, device=dev),
        multiplier=scalar(1.0),
    )


def _check_calibration(energy_min, energy_gap, calibration_steps):
    # 0: no calibration, the state's grid is used as it is (a chain continued from its state)
    if (energy_min is None or energy_gap is None) and calibration_steps == 1:
        raise ValueError(
            "csgld: a grid chosen from the chain (`energy_min` or `energy_gap` None) needs "
            f"`calibration_steps >= 2` (or 0 to keep the state's grid), got {calibration_steps}."
        )


def _grid(energy, state, energy_min, energy_gap, calibration_steps):
    """The grid after this step's calibration: ``(u_min, Δu, mean, m2)``."""
    xp = array_namespace(energy)
    count = state.count
    calibrating = count < calibration_steps
    u_min, gap, mean, m2 = state.energy_min, state.energy_gap, state.energy_mean, state.energy_m2
    if energy_min is None:
        running_min = xp.where(count == 0, energy, xp.minimum(u_min, energy))
        u_min = xp.where(calibrating, running_min, u_min)
    if energy_gap is None:
        start = calibration_steps // 2
        in_window = calibrating & (count >= start)
        n = xp.astype(xp.maximum(count - start + 1, xp.ones_like(count)), energy.dtype)
        delta = energy - mean
        new_mean = mean + delta / n
        new_m2 = m2 + delta * (energy - new_mean)
        mean = xp.where(in_window, new_mean, mean)
        m2 = xp.where(in_window, new_m2, m2)
        floor = xp.finfo(energy.dtype).eps * (1 + xp.abs(mean))
        std = xp.maximum(xp.sqrt(m2 / xp.maximum(n - 1, xp.ones_like(n))), floor)
        gap = xp.where(in_window & (n >= 2), std, gap)
    return u_min, gap, mean, m2


def step(
    position,
    state,
    grad_fn,
    noise,
    step_size,
    num_partitions,
    energy_min=None,
    energy_gap=None,
    zeta=0.75,
    sa_step_size=default_sa_step_size,
    calibration_steps=0,
    adaptation_steps=None,
    weight="interpolated",
    integrator="langevin",
    friction=None,
    temperature=1.0,
):
    """One CSGLD (``integrator="langevin"``) or CSGHMC (``"euler"``/``"splitting"``, with ``friction``) step.

    Returns ``(sample, state, gradient)``: ``sample`` is the point where ``grad_fn`` was called (the
    point that ``state.log_weight`` and ``state.partition`` describe), ``gradient`` the unmodified
    stochastic gradient there. ``position`` is not used (see the module docstring).

    :param state: the :class:`CSGLDState` (the integrator's position is ``state.position``).
    :param grad_fn: ``x -> StochasticGradient``; called once. Its ``energy`` places ``x`` on the grid.
    :param noise: ``ξ``, a standard normal draw of the shape of the position.
    :param step_size: ``h``.
    :param num_partitions: ``m``; ``energy_min``, ``energy_gap``: the grid, ``None`` to calibrate.
    :param zeta: the flattening strength ``ζ`` (default 0.75; 0 is SGLD/SGHMC).
    :param sa_step_size: ``ω_k``, a float or a function of the 1-based update count (default
        :func:`default_sa_step_size`).
    :param calibration_steps: steps with uniform ``θ`` that calibrate the grid (default 0).
    :param adaptation_steps: stop learning ``θ`` after this many steps (default ``None``: never).
    :param weight: ``"interpolated"`` (default) or ``"bin"`` log weights.
    :param integrator: ``"langevin"`` (CSGLD, default), ``"euler"`` or ``"splitting"`` (CSGHMC, with ``friction``).
    :param temperature: ``τ`` (default 1).

    **Example** (one CSGLD step on ``U(x) = |x|²/2``, with ``jax.numpy`` and with ``torch`` arrays)::

        >>> import jax.numpy as jnp, torch
        >>> from ppl_sgmcmc.rules import StochasticGradient, csgld
        >>> def grad_fn(x):  # U(x) = |x|²/2: ∇U = x; no data, so the score is -∇U
        ...     return StochasticGradient(energy=(x * x).sum() / 2, grad=x, score=-x)
        >>> grid = dict(num_partitions=4, energy_min=0.0, energy_gap=1.0)  # init takes the grid only
        >>> hyper = dict(grid, sa_step_size=0.1)
        >>> x, noise = jnp.array([1.0, -2.0]), jnp.array([0.5, -0.5])
        >>> sample, state, gradient = csgld.step(x, csgld.init(x, noise, **grid), grad_fn, noise, 0.1, **hyper)
        >>> sample.tolist(), float(gradient.energy), int(state.partition)  # U = 2.5 lies in bin 2
        ([1.0, -2.0], 2.5, 2)
        >>> [round(v, 4) for v in state.theta.tolist()], round(float(state.multiplier), 4)
        ([0.2412, 0.2412, 0.2765, 0.2412], 1.1026)
        >>> t, z = torch.tensor([1.0, -2.0]), torch.tensor([0.5, -0.5])
        >>> csgld.step(t, csgld.init(t, z, **grid), grad_fn, z, 0.1, **hyper)[1].theta
        tensor([0.2412, 0.2412, 0.2765, 0.2412])
    """
    del position
    found = {}

    def flattened_grad_fn(x):
        gradient = grad_fn(x)
        found["sample"], found["gradient"] = x, gradient
        found["contour"] = _contour(
            gradient.energy, state, num_partitions, energy_min, energy_gap, zeta, sa_step_size,
            calibration_steps, adaptation_steps, weight, temperature,
        )  # fmt: skip
        return gradient._replace(grad=found["contour"][-1] * gradient.grad)

    if integrator == "langevin":
        new_position, _, _ = sgld.step(
            state.position, sgld.SGLDState(), flattened_grad_fn, noise, step_size, temperature=temperature
        )
        momentum = None
    else:
        new_position, momentum, _ = sghmc.INTEGRATORS[integrator](
            state.position, state.momentum, flattened_grad_fn, noise, step_size, friction, friction, temperature
        )
    theta, u_min, gap, mean, m2, log_weight, partition, multiplier = found["contour"]
    new_state = CSGLDState(
        position=new_position,
        momentum=momentum,
        theta=theta,
        energy_min=u_min,
        energy_gap=gap,
        energy_mean=mean,
        energy_m2=m2,
        count=state.count + 1,
        log_weight=log_weight,
        partition=partition,
        multiplier=multiplier,
    )
    return found["sample"], new_state, found["gradient"]


def _contour(
    energy,
    state,
    num_partitions,
    energy_min,
    energy_gap,
    zeta,
    sa_step_size,
    calibration_steps,
    adaptation_steps,
    weight,
    temperature,
):
    """Grid, index, SA update of ``θ``, log weight and gradient multiplier at a point of minibatch energy ``energy``."""
    xp, dtype, dev = array_namespace(state.theta), state.theta.dtype, device(state.theta)
    energy = xp.asarray(energy, dtype=dtype, device=dev)
    # a non-finite energy makes the kernel reject the step; keep the index arithmetic finite meanwhile
    energy = xp.where(xp.isfinite(energy), energy, state.energy_min)
    u_min, gap, mean, m2 = _grid(energy, state, energy_min, energy_gap, calibration_steps)

    raw = xp.ceil((energy - u_min) / gap) - 1  # float, integer-valued
    j = xp.clip(raw, 0, num_partitions - 1)
    above = raw > num_partitions - 1  # beyond the grid's end u_min + m Δu: Ψ flat at θ(m-1)
    j_prev = xp.maximum(j - 1, xp.zeros_like(j))
    bins = xp.arange(num_partitions, dtype=dtype, device=dev)
    onehot = xp.astype(bins == j, dtype)
    onehot_prev = xp.astype(bins == j_prev, dtype)

    # stochastic approximation (eq. 9), frozen while the grid is calibrated and after `adaptation_steps`
    theta = state.theta
    updates = xp.astype(state.count - calibration_steps + 1, dtype)
    omega = sa_step_size(xp.maximum(updates, xp.ones_like(updates))) if callable(sa_step_size) else sa_step_size
    theta_j = xp.sum(theta * onehot)
    stepped = xp.maximum(theta + omega * theta_j**zeta * (onehot - theta), xp.full_like(theta, xp.finfo(dtype).tiny))
    adapting = updates >= 1
    if adaptation_steps is not None:
        adapting = adapting & (state.count < adaptation_steps)
    theta = xp.where(adapting, stepped, theta)

    log_theta = xp.log(theta)
    log_j = xp.sum(log_theta * onehot)
    log_prev = xp.sum(log_theta * onehot_prev)
    slope = xp.where(above, xp.zeros_like(log_j), log_j - log_prev)
    multiplier = 1 + zeta * temperature / gap * slope
    if weight == "bin":
        log_weight = zeta * log_j
    else:
        fraction = xp.minimum((energy - (u_min + j * gap)) / gap, xp.ones_like(energy))
        log_weight = zeta * (log_prev + (log_j - log_prev) * fraction)
    return theta, u_min, gap, mean, m2, log_weight, xp.astype(j, xp.int32), multiplier
