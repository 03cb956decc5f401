"""A chain's start on the Pyro backend: the approximate mode, the Hessian there and the noise probe.

The Pyro twin of :mod:`ppl_sgmcmc.numpyro.warmup` (same constants, same semantics), on a target of
:mod:`~ppl_sgmcmc.pyro.potential`:

* :func:`find_mode`: ``torch.optim.Adam`` with a cosine-annealed learning rate
  (``torch.optim.lr_scheduler.CosineAnnealingLR``), each step times ``max(1, |x|)``, on the minibatch
  potential, from the init strategy's point; a step whose gradient is not finite returns to the last point whose gradient was.
* :func:`hessian`: the means of the minibatch Hessians and gradients over the target's :meth:`epoch`
  batches, each Hessian by a double backward pass through the model run eagerly (``torch.autograd.grad``
  with ``create_graph``, then one batched backward pass for all ``d`` columns).
* :func:`hessian_diagonal` and :func:`largest_curvature`: Hutchinson's estimate of the Hessian's diagonal and
  the curvature it leaves, for a diagonal preconditioner of many latent coordinates.
* :func:`newton`: Newton steps from the optimiser's end point, each the best of a few fractions of the step
  on the Hessian's minibatches.
* :func:`probe`: :data:`~ppl_sgmcmc.adaptation.PROBE_BATCHES` minibatch gradients at one point,
  stacked.
"""

from __future__ import annotations

from typing import Any, cast

import torch

from ppl_sgmcmc.adaptation import (
    FIND_MODE_B2,
    FIND_MODE_FINAL_RATE,
    FIND_MODE_RATE,
    NEWTON_FRACTIONS,
    NEWTON_GROWTH,
    NEWTON_ITERATIONS,
    NEWTON_RADIUS,
    NEWTON_TOLERANCE,
    POWER_ITERATIONS,
    magnitude,
    newton_direction,
)
from ppl_sgmcmc.rules import StochasticGradient

__all__ = ["find_mode", "hessian", "hessian_diagonal", "largest_curvature", "newton", "probe"]


def find_mode(target: Any, flat: torch.Tensor, generator: torch.Generator, steps: int, score_kind: Any) -> torch.Tensor:
    """``steps`` steps of Adam on the minibatch potential from ``flat``: an approximate mode (see
    :func:`ppl_sgmcmc.numpyro.warmup.find_mode`).

    **Example** (the mode of ``U(x) = |x - 3|²/2``)::

        >>> import torch
        >>> from ppl_sgmcmc.pyro.potential import PotentialTarget
        >>> from ppl_sgmcmc.pyro.warmup import find_mode
        >>> target = PotentialTarget(lambda z: 0.5 * ((z["x"] - 3) ** 2).sum(), "SGLD")
        >>> target.set_layout({"x": torch.zeros(2)})
        >>> x = find_mode(target, torch.zeros(2), torch.Generator().manual_seed(0), 1000, False)
        >>> [round(v, 2) for v in x.tolist()]
        [3.0, 3.0]
    """
    x = flat.detach().clone()
    last_good = x.clone()
    optimizer = torch.optim.Adam([x], lr=FIND_MODE_RATE, betas=(0.9, FIND_MODE_B2))
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps, eta_min=FIND_MODE_RATE * FIND_MODE_FINAL_RATE)
    batch_state = target.init_batch(generator)
    for _ in range(steps):
        batch, batch_state = target.draw(generator, batch_state)
        grad = target.gradient(x.detach(), batch, score_kind).grad
        if bool(torch.isfinite(grad.sum())):
            last_good.copy_(x.detach())
            x.grad = grad
            optimizer.step()
            with torch.no_grad():  # Adam's step times max(1, |x|), as `scale_by_magnitude`
                x.copy_(last_good + (x - last_good) * cast(torch.Tensor, magnitude(last_good)))
        else:
            with torch.no_grad():
                x.copy_(last_good)
        schedule.step()
    return x.detach()


def hessian(target: Any, flat: torch.Tensor, batches: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The means over ``batches`` of the Hessian of the minibatch potential at ``flat``, ``(d, d)``, and of its
    gradient.

    **Example** (``U(x) = x₀² + 3 x₀ x₁ + 2 x₁²``)::

        >>> import torch
        >>> from ppl_sgmcmc.pyro.potential import PotentialTarget
        >>> from ppl_sgmcmc.pyro.warmup import hessian
        >>> target = PotentialTarget(lambda z: z["x"][0] ** 2 + 3 * z["x"][0] * z["x"][1] + 2 * z["x"][1] ** 2, "SGLD")
        >>> target.set_layout({"x": torch.zeros(2)})
        >>> H, g = hessian(target, torch.tensor([1.0, 0.0]), [None])
        >>> H.tolist(), g.tolist()
        ([[2.0, 3.0], [3.0, 4.0]], [2.0, 3.0])
    """
    d = flat.shape[0]
    eye = torch.eye(d, dtype=flat.dtype, device=flat.device)
    total = torch.zeros((d, d), dtype=flat.dtype, device=flat.device)
    total_grad = torch.zeros_like(flat)
    for batch in batches:
        rows = None
        with torch.enable_grad():
            x = flat.detach().requires_grad_()
            (grad,) = torch.autograd.grad(target.differentiable_energy(x, batch), x, create_graph=True)
            total_grad += grad.detach()
            if grad.requires_grad:  # else the energy is linear in x
                try:
                    (rows,) = torch.autograd.grad(grad, x, grad_outputs=eye, is_grads_batched=True, allow_unused=True)
                except RuntimeError:  # an operation without a batching rule: one column at a time
                    columns = [torch.autograd.grad(grad, x, v, retain_graph=True, allow_unused=True)[0] for v in eye]
                    rows = None if columns[0] is None else torch.stack(columns)
        if rows is not None:
            total += rows.detach()
    return total / len(batches), total_grad / len(batches)


def _hvp(target: Any, flat: torch.Tensor, batch: Any, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(∇Ũ(flat), ∇²Ũ(flat) v)`` on ``batch``, by a double backward pass."""
    with torch.enable_grad():
        x = flat.detach().requires_grad_()
        (grad,) = torch.autograd.grad(target.differentiable_energy(x, batch), x, create_graph=True)
        if not grad.requires_grad:  # the energy is linear in x
            return grad.detach(), torch.zeros_like(flat)
        (hv,) = torch.autograd.grad(grad, x, grad_outputs=v, allow_unused=True)
    return grad.detach(), torch.zeros_like(flat) if hv is None else hv.detach()


def hessian_diagonal(target: Any, flat: torch.Tensor, batches: list[Any],
                     generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Hutchinson's estimate of the Hessian's diagonal, one Rademacher probe per minibatch, and the mean gradient
    (see :func:`ppl_sgmcmc.numpyro.warmup.hessian_diagonal`).

    **Example**::

        >>> import torch
        >>> from ppl_sgmcmc.pyro.potential import PotentialTarget
        >>> from ppl_sgmcmc.pyro.warmup import hessian_diagonal
        >>> target = PotentialTarget(lambda z: z["x"][0] ** 2 + 2 * z["x"][1] ** 2, "SGLD")
        >>> target.set_layout({"x": torch.zeros(2)})
        >>> diagonal, g = hessian_diagonal(target, torch.ones(2), [None] * 3, torch.Generator().manual_seed(0))
        >>> diagonal.tolist(), g.tolist()
        ([2.0, 4.0], [2.0, 4.0])
    """
    diagonal, total = torch.zeros_like(flat), torch.zeros_like(flat)
    for batch in batches:
        z = 2.0 * torch.randint(0, 2, flat.shape, generator=generator).to(flat.dtype) - 1.0
        grad, hv = _hvp(target, flat, batch, z)
        diagonal += z * hv
        total += grad
    return diagonal / len(batches), total / len(batches)


def largest_curvature(target: Any, flat: torch.Tensor, batches: list[Any], scale: torch.Tensor,
                      generator: torch.Generator) -> torch.Tensor:  # fmt: skip
    """The largest eigenvalue of ``diag(scale) H diag(scale)`` by power iteration, one Hessian-vector product per
    iteration on the minibatches in turn (see :func:`ppl_sgmcmc.numpyro.warmup.largest_curvature`).

    **Example** (``H = [[2, 1], [1, 2]]``: eigenvalues 3 and 1)::

        >>> import torch
        >>> from ppl_sgmcmc.pyro.potential import PotentialTarget
        >>> from ppl_sgmcmc.pyro.warmup import largest_curvature
        >>> H = torch.tensor([[2.0, 1.0], [1.0, 2.0]])
        >>> target = PotentialTarget(lambda z: z["x"] @ H @ z["x"] / 2, "SGLD")
        >>> target.set_layout({"x": torch.zeros(2)})
        >>> round(float(largest_curvature(target, torch.zeros(2), [None], torch.ones(2), torch.Generator().manual_seed(0))), 3)
        3.0
    """
    v = torch.randn(flat.shape, generator=generator, dtype=flat.dtype).to(flat.device)
    v = v / v.norm()
    rayleigh = torch.zeros((), dtype=flat.dtype, device=flat.device)
    for iteration in range(POWER_ITERATIONS):
        w = scale * _hvp(target, flat, batches[iteration % len(batches)], scale * v)[1]
        rayleigh = torch.dot(v, w)
        v = w / w.norm()
    return rayleigh.abs()


def newton(target: Any, flat: torch.Tensor, batches: list[Any], score_kind: Any,
           hessian_batches: list[Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Up to :data:`~ppl_sgmcmc.adaptation.NEWTON_ITERATIONS` Newton steps from ``flat``, each from the Hessian at
    its start point on ``hessian_batches`` (``batches`` when ``None``) and the best of a few fractions of the step on
    ``batches``; returns the end point and the Hessian at the last step's start (see
    :func:`ppl_sgmcmc.numpyro.warmup.newton`)."""
    hessian_batches = batches if hessian_batches is None else hessian_batches
    g = torch.stack([target.gradient(flat, batch, score_kind).grad for batch in batches]).mean(0)
    x, radius = flat, NEWTON_RADIUS
    for _ in range(NEWTON_ITERATIONS):
        H = hessian(target, x, hessian_batches)[0]
        step = cast(torch.Tensor, newton_direction(H, g, radius))
        best, best_energy, best_t = x, float("inf"), 0.0
        for t in (0.0, *NEWTON_FRACTIONS):
            candidate = x - t * step
            grads = [target.gradient(candidate, batch, score_kind) for batch in batches]
            energy = sum(float(out.energy) for out in grads)
            if energy < best_energy:  # NaN never is
                best, best_energy, best_t = candidate, energy, t
                g = torch.stack([out.grad for out in grads]).mean(0)
        x, radius = best, radius * NEWTON_GROWTH if best_t == NEWTON_FRACTIONS[0] else radius
        if best_t * abs(float(step @ H @ step)) ** 0.5 < NEWTON_TOLERANCE:
            break
    return x, H


def probe(target: Any, flat: torch.Tensor, batches: list[Any], score_kind: Any) -> StochasticGradient:
    """The stochastic gradients of ``batches`` at ``flat``, stacked (rows)."""
    grads = [target.gradient(flat, batch, score_kind) for batch in batches]
    score = None if grads[0].score is None else torch.stack([g.score for g in grads])
    return StochasticGradient(torch.stack([g.energy for g in grads]), torch.stack([g.grad for g in grads]), score)
