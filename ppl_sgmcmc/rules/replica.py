"""Replica-exchange SGLD and SGHMC (Deng, Feng, Gao, Liang & Lin, "Non-convex Learning via Replica Exchange
Stochastic Gradient MCMC", ICML 2020), with the swap rate corrected for noisy energies.

``K >= 2`` replicas run at the temperatures ``τ_0 < τ_1 < ... < τ_{K-1}``, ``τ_k = τ·ladder_k`` (``ladder_0 = 1``).
Slot 0, at the temperature ``τ`` of the target, is the chain's position: its draws are the posterior draws.
The hot slots live in the state (``replicas``, a ``(K-1, d)`` axis); every slot takes its gradient on the
step's minibatch. One step, with ``y_k`` the point where slot ``k`` takes its gradient (its position for
SGLD, ``θ + h p`` for Euler, ``θ + (h/2) p`` for the splitting integrator) and ``Ũ_k = Ũ_t(y_k)``:

1. **the energy-difference variance.** For adjacent slots the minibatch difference
   ``D̃_k = Ũ_k - Ũ_{k+1}`` has a noise of variance ``s²_k``. To first order in ``δ_k = y_k - y_{k+1}`` (exactly for a
   likelihood quadratic in ``θ``) that noise is the gradient noise ``e`` (covariance ``V``) along ``δ_k``, and
   ``s²_k = δ_kᵀ V δ_k``, which grows with the distance between the replicas. ``V``'s diagonal is estimated as
   the gradient noise of :mod:`ppl_sgmcmc.noise`: a running mean of ``(∇Ũ_t(y_0) - ∇Ũ_{t-1}(y'_0))²/2`` over the
   cold walker's consecutive gradient points (then an exponential average over :data:`VARIANCE_HORIZON` steps;
   the change of the exact gradient between the two points makes it err on the large side), and
   ``ŝ²_k = Σ_j V̂_j δ_kj²`` at the pair's current points. Deng et al. estimate one ``σ²`` by stochastic
   approximation (``σ̂²_{m+1} = (1-γ) σ̂²_m + γ σ̃²``); a single running value lags behind ``δ``, and on a Gaussian
   posterior it under-corrected the swaps of distant replicas enough to double the cold chain's variance. Or a
   given ``energy_variance``.
2. **the swaps**, for ``k = 0, ..., K-2`` in turn, with ``a_k = 1/τ_k - 1/τ_{k+1}``::

       log S̃_k = a_k (Ũ_k - Ũ_{k+1}) - a_k² ŝ²_k / (2F)
       swap the points (with their gradients) of slots k and k+1 if  u < S̃_k

   ``u ~ U(0, 1)`` (drawn as ``exp(-(ζ₁² + ζ₂²)/2)``: two standard normals make an ``Exp(1)``). ``F = 1`` (the
   paper's correction factor) makes the test exact for Gaussian energy noise of variance ``ŝ²_k``: with
   ``X = a_k D̃_k ~ N(μ, v)``, ``E min(1, e^{X - v/2}) = e^{μ} E min(1, e^{-X' - v/2})`` for ``X' ~ N(-μ, v)``, detailed
   balance in the mean over the noise (the penalty method of Ceperley & Dewing, "The penalty method for
   random walks with uncertain energies", J. Chem. Phys. 110, 1999), and ``E S̃_k = e^{μ}`` is the exact
   swap ratio (Deng et al.'s unbiased estimator). ``F > 1`` corrects less and swaps more, at a bias; the
   uncorrected swap (``ŝ² = 0``) swaps too often by ``e^{v/2}`` in the mean. The paper's ``σ²`` is the
   variance of one energy estimate with independent noises, ``s² = 2σ²``; here the slots share the
   minibatch, whose noise largely cancels in the difference. No swap is tried before :data:`MIN_TERMS` terms of
   ``V̂`` are in (a given ``energy_variance`` swaps from the first step).
3. **the move** of every slot from its (swapped) point with its (swapped) gradient at its own temperature,
   by :func:`ppl_sgmcmc.rules.sgld.step` or an integrator of :mod:`ppl_sgmcmc.rules.sghmc` (the
   ``(K, d)`` positions, momenta and noise are one array; the temperature is a ``(K, 1)`` column)::

       SGLD:   θ_k ← y_k - h ∇Ũ_t(y_k) + sqrt(2 h τ_k) ξ_k
       SGHMC:  the rest of the Euler or splitting step from y_k, the momentum p_k of slot k

   Only positions move between slots: the momenta stay at their temperatures, where they are
   ``N(0, τ_k I)`` and independent of the positions, so the swap's ratio has no kinetic term.

**Variance-reduced energies** (Deng, Feng, Karagiannis, Lin & Liang, "Accelerating Convergence of Replica Exchange
Stochastic Gradient MCMC via Variance Reduction", ICLR 2021). The noise of ``Ũ_k - Ũ_{k+1}`` grows with the
distance between the replicas, so the correction of distant replicas (in different modes) all but stops their
swaps. With anchors, each walker carries a point ``a`` where its full-data energy ``U(a)`` was computed (the kernel
sets every slot's anchor at its position every few steps, :func:`anchor`), and the swap reads the control-variate
estimate on the step's minibatch::

    Û_k = Ũ_t(y_k) - Ũ_t(a_k) + U(a_k)

unbiased for ``U(y_k)``, whose noise is the gradient noise along ``y_k - a_k``: the difference of a pair has noise
variance ``ŝ²_k = Σ_j V̂_j ((y_k - a_k) - (y_{k+1} - a_{k+1}))_j²``, which stays small while each walker stays near
its anchor, wherever the two walkers are. The anchors travel with their walkers through the swaps. The paper's
``σ²`` is estimated by stochastic approximation; here, as above, from ``V̂`` at the step's offsets. A state whose
anchors are not set (``anchored`` false: before the first :func:`anchor`, or after a restart in new coordinates)
swaps on the plain estimates. Each anchored step costs ``K`` more minibatch energies, and each :func:`anchor` ``K``
full-data energies.

**Ladder.** ``ladder`` is given, or adapted while ``count < adaptation_steps`` (the warm-up) by stochastic
approximation of each pair's swap probability towards ``target_swap_rate``:
``log(τ_{k+1}/τ_k) ← log(τ_{k+1}/τ_k) + γ_t (min(1, S̃_k) - target)``, ``γ_t = (t + 10)^{-0.6}``, the ratio kept in
``[1, MAX_RATIO]``; it starts at ``1 + 2/sqrt(d)`` per pair (about a swap rate of 0.3 between the tempered
copies of a ``d``-dimensional Gaussian).

**Noise.** The rule takes a ``(K, d + 2)`` standard normal draw (:func:`noise_shape`): row ``k``'s first ``d``
entries are slot ``k``'s Langevin noise, its last two make pair ``k``'s uniform.

**Which replica holds the chain.** ``walkers`` numbers the walkers by their starting slot and follows them
through the swaps: ``walkers[0]`` is the walker in the cold slot. A swap of pair 0 is a jump of the chain's
position to another walker's: ``swapped[0]`` marks it.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from array_api_compat import array_namespace, device

from ppl_sgmcmc.rules import sghmc, sgld
from ppl_sgmcmc.rules._types import Array

NEEDS = "gradient"  # what the rule reads from the gradient (see ppl_sgmcmc.rules)
INTEGRATORS = ("langevin", "euler", "splitting")
#: The gradient-noise estimate is a running mean of its first terms, then an exponential average with weight
#: ``1/VARIANCE_HORIZON``.
VARIANCE_HORIZON = 100
#: Swaps are tried once the variance estimate holds this many terms (unless ``energy_variance`` is given).
MIN_TERMS = 10
#: The largest ratio of adjacent temperatures an adapted ladder reaches.
MAX_RATIO = 1000.0


class ReplicaState(NamedTuple):
    """State of a replica-exchange chain of ``K`` slots (slot 0 is the chain's position, not held here).

    - **replicas**: the hot slots' positions, ``(K-1, d)``.
    - **momentum**: slot 0's momentum ``(d,)`` (``None`` for SGLD); **replica_momentum**: the hot slots'
      ``(K-1, d)``.
    - **ladder**: ``τ_k / τ``, ``(K,)``, ``ladder[0] = 1``.
    - **points**, **gradients**: each slot's last gradient point and stochastic gradient (after the swaps),
      ``(K, d)``: those of the walker now in the slot, for the noise estimate.
    - **gradient_noise**: ``V̂``, the running estimate of the gradient noise's variance, ``(d,)``.
    - **energy_variance**: ``ŝ²_k``, the variance of the minibatch energy difference of pair ``k`` at its last
      swap attempt, ``(K-1,)``.
    - **count**: steps taken (int32).
    - **swap_probability**: ``min(1, S̃_k)`` of the last step, ``(K-1,)`` (0 where no swap was tried).
    - **swapped**: whether pair ``k`` swapped in the last step, ``(K-1,)`` (bool).
    - **swaps**: the number of swaps of each pair so far, ``(K-1,)`` (int32).
    - **walkers**: which walker (its starting slot) is in each slot, ``(K,)`` (int32).
    - **anchors**, **anchor_energies**: each slot's anchor ``a_k`` ``(K, d)`` and full-data energy ``U(a_k)``
      ``(K,)`` (variance-reduced energies; ``None`` without); **anchored**: whether they are set (a boolean scalar).

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import replica
        >>> state = replica.init(jnp.zeros(4), jnp.zeros((3, 6)), num_replicas=3)  # ratio 1 + 2/sqrt(4)
        >>> state.replicas.shape, state.momentum is None, state.ladder.tolist(), state.walkers.tolist()
        ((2, 4), True, [1.0, 2.0, 4.0], [0, 1, 2])
    """

    replicas: Array
    momentum: Array | None
    replica_momentum: Array | None
    ladder: Array
    points: Array
    gradients: Array
    gradient_noise: Array
    energy_variance: Array
    count: Array  # type: ignore[assignment]  # (shadows tuple.count)
    swap_probability: Array
    swapped: Array
    swaps: Array
    walkers: Array
    anchors: Array | None = None
    anchor_energies: Array | None = None
    anchored: Array | None = None


def noise_shape(dim: int, num_replicas: int) -> tuple[int, int]:
    """The shape of the standard normal draw of :func:`init` and :func:`step`: ``(K, d + 2)``.

    **Example**::

        >>> from ppl_sgmcmc.rules import replica
        >>> replica.noise_shape(5, num_replicas=2)
        (2, 7)
    """
    return (num_replicas, dim + 2)


def initial_ladder(dim: int, num_replicas: int) -> list[float]:
    """The ladder an adapted ladder starts from: ratio ``1 + 2/sqrt(d)`` between adjacent temperatures.

    **Example**::

        >>> from ppl_sgmcmc.rules.replica import initial_ladder
        >>> initial_ladder(4, 3)
        [1.0, 2.0, 4.0]
    """
    ratio = 1 + 2 / math.sqrt(dim)
    return [ratio**k for k in range(num_replicas)]


def _rows(noise, num_replicas, dim):
    """``noise`` as ``(K, d + 2)`` rows; a ``(d,)`` draw (a caller that only wants the state's type) is repeated."""
    xp = array_namespace(noise)
    if noise.ndim == 1:
        noise = xp.broadcast_to(xp.concat([noise[:dim], xp.zeros(2, dtype=noise.dtype, device=device(noise))])[None, :],
                                (num_replicas, dim + 2))  # fmt: skip
    return noise


def init(position, noise, num_replicas, ladder=None, integrator="langevin", temperature=1.0, anchored=False):
    """Every slot at ``position``; momenta ``p_k ~ N(0, τ_k I)`` from the rows of ``noise`` (SGHMC).

    :param position: the chain's start ``θ_0``, a flat array; the hot slots start there too.
    :param noise: a standard normal draw of shape :func:`noise_shape`.
    :param num_replicas: ``K >= 2``.
    :param ladder: ``τ_k / τ`` (``K`` increasing values from 1), or ``None``: :func:`initial_ladder`.
    :param integrator: ``"langevin"`` (SGLD, default), ``"euler"`` or ``"splitting"`` (SGHMC).
    :param temperature: ``τ``, the cold slot's (default 1).
    :param anchored: whether the state holds anchors for variance-reduced energies (not set until :func:`anchor`).
    :return: :class:`ReplicaState`.

    **Example** (SGHMC: the hot slot's momentum has variance ``τ_1 = 4``)::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import replica
        >>> noise = jnp.ones((2, 3))
        >>> state = replica.init(jnp.zeros(1), noise, num_replicas=2, ladder=[1.0, 4.0], integrator="splitting")
        >>> state.momentum.tolist(), state.replica_momentum.tolist()
        ([1.0], [[2.0]])
    """
    xp, dtype, dev = array_namespace(position), position.dtype, device(position)
    dim, k = position.shape[0], num_replicas
    noise = _rows(noise, k, dim)
    ladder = initial_ladder(dim, k) if ladder is None else ladder
    ladder = xp.asarray(ladder, dtype=dtype, device=dev)
    points = xp.broadcast_to(position[None, :], (k, dim)) + xp.zeros((k, dim), dtype=dtype, device=dev)
    momentum = replica_momentum = None
    if integrator != "langevin":
        momenta = xp.sqrt(temperature * ladder)[:, None] * noise[:, :dim]
        momentum, replica_momentum = momenta[0], momenta[1:]
    zeros = xp.zeros((k - 1,), dtype=dtype, device=dev)
    return ReplicaState(
        replicas=points[1:],
        momentum=momentum,
        replica_momentum=replica_momentum,
        ladder=ladder,
        points=points,
        gradients=xp.zeros((k, dim), dtype=dtype, device=dev),
        gradient_noise=xp.zeros((dim,), dtype=dtype, device=dev),
        energy_variance=zeros,
        count=xp.asarray(0, dtype=xp.int32, device=dev),
        swap_probability=zeros,
        swapped=zeros > 0,
        swaps=xp.zeros((k - 1,), dtype=xp.int32, device=dev),
        walkers=xp.arange(k, dtype=xp.int32, device=dev),
        anchors=points + 0 if anchored else None,
        anchor_energies=xp.zeros((k,), dtype=dtype, device=dev) if anchored else None,
        anchored=xp.asarray(False, device=dev) if anchored else None,
    )


def anchor(state: ReplicaState, points: Array, energies: Array) -> ReplicaState:
    """``state`` with every slot's anchor at ``points`` (``(K, d)``: the slots' positions, slot 0 the chain's) and
    their full-data energies ``energies`` (``(K,)``): the variance-reduced energies' control variates (module
    docstring).

    **Example** (the swap then reads ``Ũ_t(y) - Ũ_t(a) + U(a)``, here exact, whatever the minibatch's noise ``b x``:
    the slots swap, as their exact energies ``U = 2`` and ``0.5`` ask; the plain estimates ``-8`` and ``-4.5`` would
    not have swapped them)::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import StochasticGradient, replica
        >>> b = -5.0  # Ũ_t(x) = x²/2 + b x, U(x) = x²/2
        >>> def grad_fn(x):
        ...     return StochasticGradient(energy=(x * x).sum() / 2 + b * x.sum(), grad=x + b, score=None)
        >>> state = replica.init(jnp.array([2.0]), jnp.zeros((2, 3)), num_replicas=2, ladder=[1.0, 2.0], anchored=True)
        >>> points = jnp.array([[2.0], [1.0]])
        >>> state = state._replace(replicas=points[1:], count=jnp.asarray(replica.MIN_TERMS))
        >>> state = replica.anchor(state, points, jnp.array([2.0, 0.5]))
        >>> _, state, _ = replica.step(jnp.array([2.0]), state, grad_fn, jnp.zeros((2, 3)), 0.1, num_replicas=2)
        >>> bool(state.anchored), state.walkers.tolist(), float(state.energy_variance[0])
        (True, [1, 0], 0.0)
    """
    xp = array_namespace(points)
    return state._replace(anchors=points, anchor_energies=xp.astype(energies, points.dtype),
                          anchored=xp.asarray(True, device=device(points)))  # fmt: skip


def log_swap_ratio(energy_low, energy_high, temperature_low, temperature_high, variance, correction_factor=1.0):
    """``log S̃ = a (Ũ_low - Ũ_high) - a² ŝ² / (2F)``, ``a = 1/τ_low - 1/τ_high``: the log of the corrected swap
    ratio of two slots with minibatch energies ``Ũ_low`` (at ``τ_low``) and ``Ũ_high`` (at ``τ_high``), whose
    difference has noise variance ``ŝ²``. Any arguments that broadcast.

    **Example** (exact energies: the Metropolis ratio of the swap; with noise the ratio is lowered)::

        >>> from ppl_sgmcmc.rules.replica import log_swap_ratio
        >>> log_swap_ratio(3.0, 1.0, 1.0, 2.0, 0.0), log_swap_ratio(3.0, 1.0, 1.0, 2.0, 4.0)
        (1.0, 0.5)
    """
    a = 1 / temperature_low - 1 / temperature_high
    return a * (energy_low - energy_high) - a * a * variance / (2 * correction_factor)


def step(
    position,
    state,
    grad_fn,
    noise,
    step_size,
    num_replicas,
    integrator="langevin",
    friction=None,
    temperature=1.0,
    energy_variance=None,
    correction_factor=1.0,
    adaptation_steps=0,
    target_swap_rate=0.3,
):
    """One replica-exchange step (see the module docstring): variance estimate, swaps, then every slot's move.

    :param position: ``θ``, the cold slot's position.
    :param state: the :class:`ReplicaState`.
    :param grad_fn: ``x -> StochasticGradient`` of the step's minibatch potential; called once per slot.
    :param noise: a standard normal draw of shape :func:`noise_shape`.
    :param step_size: ``h``, the same for every slot.
    :param num_replicas: ``K``.
    :param integrator: ``"langevin"`` (SGLD), ``"euler"`` or ``"splitting"`` (SGHMC, with ``friction``).
    :param friction: SGHMC's ``A`` (also its diffusion).
    :param temperature: ``τ``, the cold slot's.
    :param energy_variance: ``ŝ²``, a number for every pair, or ``None`` (default): estimated.
    :param correction_factor: ``F > 0`` (default 1: the exact correction for Gaussian energy noise).
    :param adaptation_steps: the ladder adapts while ``count`` is below it (default 0: fixed).
    :param target_swap_rate: the swap probability an adapted ladder aims at (default 0.3).
    :return: ``(new position, new state, the cold slot's gradient)``: the gradient at the point slot 0 moved
        from (after the swaps).

    **Example** (two slots at ``τ = 1`` and ``2`` on ``U(x) = x²/2`` with exact energies; the hot slot holds the
    lower energy, ``S = e^{0.5 (2 - 0.5)} > 1``, so the slots swap)::

        >>> import jax.numpy as jnp, torch
        >>> from ppl_sgmcmc.rules import StochasticGradient, replica
        >>> def grad_fn(x):
        ...     return StochasticGradient(energy=(x * x).sum() / 2, grad=x, score=-x)
        >>> state = replica.init(jnp.array([2.0]), jnp.zeros((2, 3)), num_replicas=2, ladder=[1.0, 2.0])
        >>> state = state._replace(replicas=jnp.array([[1.0]]))
        >>> x, state, gradient = replica.step(jnp.array([2.0]), state, grad_fn, jnp.zeros((2, 3)), 0.1,
        ...                                   num_replicas=2, energy_variance=0.0)
        >>> round(float(x[0]), 4), round(float(state.replicas[0, 0]), 4), state.walkers.tolist(), float(gradient.energy)
        (0.9, 1.8, [1, 0], 0.5)
        >>> t = replica.init(torch.tensor([2.0]), torch.zeros(2, 3), num_replicas=2, ladder=[1.0, 2.0])
        >>> t = t._replace(replicas=torch.tensor([[1.0]]))
        >>> replica.step(torch.tensor([2.0]), t, grad_fn, torch.zeros(2, 3), 0.1, num_replicas=2,
        ...              energy_variance=0.0)[0]
        tensor([0.9000])
    """
    xp, dtype = array_namespace(position), position.dtype
    k, dim = num_replicas, position.shape[0]
    noise = _rows(noise, k, dim)
    ladder = state.ladder
    taus = temperature * ladder  # (K,)
    langevin = integrator == "langevin"
    found = {}

    def swapping_grad_fn(points):
        # the cold slot's point is the chain's position itself for SGLD (the kernel then knows where it took it)
        rows = [position if langevin else points[0], *(points[j] for j in range(1, k))]
        gradients = [grad_fn(row) for row in rows]
        energies = xp.stack([xp.astype(xp.asarray(g.energy), dtype) for g in gradients])
        grads = xp.stack([g.grad for g in gradients])
        noise_variance = _gradient_noise(xp, state, grads)
        ready = (state.count >= MIN_TERMS) | (energy_variance is not None)
        offsets = points  # what the energy noise is linear in: the points, or their offsets from the anchors
        swap_energies = energies
        if state.anchors is not None:
            at_anchors = xp.stack([xp.astype(xp.asarray(grad_fn(state.anchors[j]).energy), dtype) for j in range(k)])
            swap_energies = xp.where(state.anchored, energies - at_anchors + state.anchor_energies, energies)
            offsets = xp.where(state.anchored, points - state.anchors, points)
        order, probability, swapped, variance = _swaps(
            xp, swap_energies, offsets, noise_variance, energy_variance, taus, correction_factor, noise, ready
        )
        found.update(points=points, order=order, grads=grads, noise_variance=noise_variance, variance=variance,
                     probability=probability, swapped=swapped)  # fmt: skip
        cold = dict(energy=xp.take(energies, order, axis=0), grad=xp.take(grads, order, axis=0))
        found["cold"] = gradients[0]._replace(energy=cold["energy"][0], grad=cold["grad"][0], score=None,
                                              per_example=None)  # fmt: skip
        return found["cold"]._replace(**cold)

    positions = xp.concat([position[None, :], state.replicas])
    column = taus[:, None]
    rows = noise[:, :dim]
    if langevin:
        moved, _, _ = sgld.step(positions, sgld.SGLDState(), swapping_grad_fn, rows, step_size, temperature=column)
        momenta = None
    else:
        momenta = xp.concat([state.momentum[None, :], state.replica_momentum])
        moved, momenta, _ = sghmc.INTEGRATORS[integrator](
            positions, momenta, swapping_grad_fn, rows, step_size, friction, friction, column
        )
    points, order = found["points"], found["order"]
    # every integrator adds to the gradient point from there on: the swapped points move by their offset
    moved = moved + (xp.take(points, order, axis=0) - points)
    probability, swapped = found["probability"], found["swapped"]
    if adaptation_steps:
        gain = xp.astype(state.count + 10, dtype) ** -0.6
        adapting = (state.count < adaptation_steps) & (state.count >= MIN_TERMS)
        log_ratio = xp.log(ladder[1:] / ladder[:-1]) + gain * (probability - target_swap_rate)
        log_ratio = xp.clip(log_ratio, 0.0, math.log(MAX_RATIO))
        steps = [ladder[0]]
        for j in range(k - 1):
            steps.append(steps[-1] * xp.exp(log_ratio[j]))
        ladder = xp.where(adapting, xp.stack(steps), ladder)
    new_state = ReplicaState(
        replicas=moved[1:],
        momentum=None if momenta is None else momenta[0],
        replica_momentum=None if momenta is None else momenta[1:],
        ladder=ladder,
        points=xp.take(points, order, axis=0),
        gradients=xp.take(found["grads"], order, axis=0),
        gradient_noise=found["noise_variance"],
        energy_variance=found["variance"],
        count=state.count + 1,
        swap_probability=probability,
        swapped=swapped,
        swaps=state.swaps + xp.astype(swapped, xp.int32),
        walkers=xp.take(state.walkers, order, axis=0),
        anchors=None if state.anchors is None else xp.take(state.anchors, order, axis=0),
        anchor_energies=None if state.anchors is None else xp.take(state.anchor_energies, order, axis=0),
        anchored=state.anchored,
    )
    return moved[0], new_state, found["cold"]


def _gradient_noise(xp, state, grads):
    """``V̂`` after this step's term ``(∇Ũ_t(y_0) - ∇Ũ_{t-1}(y'_0))²/2`` of the cold walker (module docstring, 1.)."""
    diff = grads[0] - state.gradients[0]
    term = diff * diff / 2
    counted = (state.count >= 1) & xp.all(xp.isfinite(term))
    weight = 1 / xp.astype(xp.clip(state.count, 1, VARIANCE_HORIZON), grads.dtype)
    return xp.where(counted, state.gradient_noise + weight * (term - state.gradient_noise), state.gradient_noise)


def _swaps(xp, energies, offsets, noise_variance, energy_variance, taus, correction_factor, noise, ready):
    """The sweep of swaps over the pairs ``(0, 1), ..., (K-2, K-1)``: ``(order, probabilities, swapped, ŝ²)``; slot
    ``j`` ends up with the point of slot ``order[j]``. ``offsets``: each slot's point, or its offset from its anchor
    (what the energy's noise is linear in)."""
    k, dim = offsets.shape
    order = xp.arange(k, device=device(energies))
    slots = order
    probabilities, swapped, variances = [], [], []
    exponential = (noise[:, dim] ** 2 + noise[:, dim + 1] ** 2) / 2  # -log u, u ~ U(0, 1)
    for j in range(k - 1):
        current, at = xp.take(energies, order, axis=0), xp.take(offsets, order, axis=0)
        if energy_variance is None:
            delta = at[j] - at[j + 1]
            variance = xp.sum(noise_variance * delta * delta)
        else:
            variance = xp.full_like(current[j], energy_variance)
        log_ratio = log_swap_ratio(current[j], current[j + 1], taus[j], taus[j + 1], variance, correction_factor)
        log_ratio = xp.where(xp.isfinite(log_ratio) & ready, log_ratio, xp.full_like(log_ratio, -math.inf))
        accept = exponential[j] > -log_ratio
        probabilities.append(xp.exp(xp.minimum(log_ratio, xp.zeros_like(log_ratio))))
        swapped.append(accept)
        variances.append(variance)
        exchanged = xp.where(slots == j, order[j + 1], xp.where(slots == j + 1, order[j], order))
        order = xp.where(accept, exchanged, order)
    return order, xp.stack(probabilities), xp.stack(swapped), xp.stack(variances)
