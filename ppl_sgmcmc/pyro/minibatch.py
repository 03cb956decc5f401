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

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch


class BatchState(NamedTuple):
    """Per plate: the current epoch's permutation and the position in it (empty when ``replace``).

    **Example**::

        >>> import torch
        >>> from ppl_sgmcmc.pyro import minibatch
        >>> minibatch.init(torch.Generator().manual_seed(0), {"data": (10, 3)}, replace=True)
        BatchState(permutation={}, position={})
    """

    #: ``{plate name: the epoch's permutation of 0..N-1}`` (int64 tensor of shape ``(N,)``).
    permutation: dict[str, torch.Tensor]
    #: ``{plate name: the index into the permutation where the next minibatch starts}``.
    position: dict[str, int]


def init(
    generator: torch.Generator,
    plate_sizes: Mapping[str, tuple[int, int]],
    replace: bool,
    device: torch.device | str | None = None,
) -> BatchState:
    """The batch state at the start of the chain. ``plate_sizes``: ``{name: (N, n)}``.

    :param generator: the chain's ``torch.Generator`` (for the first epoch's permutations).
    :param plate_sizes: ``{plate name: (N, n)}``.
    :param replace: draw with replacement (no state) or reshuffle each epoch.
    :param device: the device of the index tensors.

    **Example**::

        >>> import torch
        >>> from ppl_sgmcmc.pyro import minibatch
        >>> state = minibatch.init(torch.Generator().manual_seed(0), {"data": (10, 3)}, replace=False)
        >>> sorted(state.permutation["data"].tolist()), state.position["data"]
        ([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 0)
    """
    if replace:
        return BatchState({}, {})
    return BatchState(
        {name: torch.randperm(size, generator=generator, device=device) for name, (size, _) in plate_sizes.items()},
        {name: 0 for name in plate_sizes},
    )


def draw(
    generator: torch.Generator,
    state: BatchState,
    plate_sizes: Mapping[str, tuple[int, int]],
    replace: bool,
    device: torch.device | str | None = None,
) -> tuple[dict[str, torch.Tensor], BatchState]:
    """The indices of each subsampled plate for one step, and the advanced batch state.

    :param generator: the chain's ``torch.Generator``.
    :param state: the :class:`BatchState`.
    :param plate_sizes: ``{plate name: (N, n)}``.
    :param replace: with replacement, or the next ``n`` indices of the epoch's permutation.
    :param device: the device of the index tensors.
    :return: ``({plate name: n indices}, new state)``.

    **Example** (without replacement: three minibatches of 3 cover 9 distinct points of 10; the fourth
    starts a new epoch)::

        >>> import torch
        >>> from ppl_sgmcmc.pyro import minibatch
        >>> generator, sizes = torch.Generator().manual_seed(0), {"data": (10, 3)}
        >>> state = minibatch.init(generator, sizes, replace=False)
        >>> seen = []
        >>> for _ in range(3):
        ...     indices, state = minibatch.draw(generator, state, sizes, replace=False)
        ...     seen += indices["data"].tolist()
        >>> len(set(seen)), state.position["data"]
        (9, 9)
        >>> indices, state = minibatch.draw(generator, state, sizes, replace=False)
        >>> state.position["data"]
        3
    """
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
