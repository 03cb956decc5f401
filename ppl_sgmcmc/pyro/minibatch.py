"""Minibatch indices for subsampled plates, drawn by the kernel in O(n) per step.

Pyro's own plate draws its indices with ``torch.randperm(N)`` from the global RNG on every trace.
The kernels draw them here instead, from the chain's own ``torch.Generator``, and condition the
plate on them (:class:`~ppl_sgmcmc.pyro.handlers.subsample_plates`):

* ``replace=True`` (default): ``n`` indices uniformly with replacement, ``S_t ~ U{0..N-1}^n``.
* ``replace=False``: epoch-wise reshuffling; a permutation of ``0..N-1`` is drawn once per epoch
  and consumed ``n`` indices at a time (the tail shorter than ``n`` is skipped): O(N) once per
  epoch, amortised O(n) per step.

The functions mirror :mod:`ppl_sgmcmc.numpyro.minibatch`, with a generator in place of a key.
"""

from typing import NamedTuple

import torch


class BatchState(NamedTuple):
    """Per plate: the current epoch's permutation and the position in it (empty when ``replace``)."""

    permutation: dict
    position: dict


def init(generator, plate_sizes, replace, device=None):
    """The batch state at the start of the chain. ``plate_sizes``: ``{name: (N, n)}``."""
    if replace:
        return BatchState({}, {})
    return BatchState(
        {name: torch.randperm(size, generator=generator, device=device) for name, (size, _) in plate_sizes.items()},
        {name: 0 for name in plate_sizes},
    )


def draw(generator, state, plate_sizes, replace, device=None):
    """The indices of each subsampled plate for one step, and the advanced batch state."""
    if replace:
        indices = {
            name: torch.randint(size, (n,), generator=generator, device=device)
            for name, (size, n) in plate_sizes.items()
        }
        return indices, state
    indices, permutation, position = {}, dict(state.permutation), dict(state.position)
    for name, (size, n) in plate_sizes.items():
        start = position[name]
        if start + n > size:  # a new epoch
            permutation[name] = torch.randperm(size, generator=generator, device=device)
            start = 0
        indices[name] = permutation[name][start : start + n]
        position[name] = start + n
    return indices, BatchState(permutation, position)
