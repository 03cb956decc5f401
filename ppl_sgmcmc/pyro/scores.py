"""The full-data score of a Pyro model at given latent values, and what :func:`ppl_sgmcmc.diagnostics.ksd`,
:func:`ppl_sgmcmc.diagnostics.step_halving_check` and :func:`ppl_sgmcmc.diagnostics.energy_noise` read from a
finished Pyro run.

:func:`full_data_score` is ``s(θ) = -∇U(θ)`` for the potential ``U`` of the whole data set, the gradient an
SG-MCMC kernel only estimates from minibatches: the kernel Stein discrepancy compares the draws with the
posterior through it (Gorham & Mackey, "Measuring Sample Quality with Kernels", ICML 2017).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import pyro
import torch
from pyro.infer import MCMC
from pyro.infer.autoguide.initialization import init_to_uniform

from ppl_sgmcmc import _run_view
from ppl_sgmcmc.checkpoint import ChainState
from ppl_sgmcmc.pyro import inference_data
from ppl_sgmcmc.pyro.handlers import as_tensors, subsample_plates
from ppl_sgmcmc.pyro.kernel import SGMCMCKernel
from ppl_sgmcmc.pyro.potential import ModelTarget, PotentialTarget

__all__ = ["RunView", "full_data_score"]


@contextmanager
def _global_rng_kept() -> Iterator[None]:
    """Pyro's global random state (which a prototype trace and a chain's set-up draw from) is restored at the
    end: a diagnostic does not change the user's random stream."""
    state = pyro.util.get_rng_state()
    try:
        yield
    finally:
        pyro.util.set_rng_state(state)


def _score_target(
    kernel: SGMCMCKernel, model_args: tuple, model_kwargs: Mapping[str, Any], fn: str
) -> ModelTarget | PotentialTarget:
    """The kernel's potential, in unconstrained coordinates (also for a kernel that moves constrained ones)."""
    _run_view.check_kernel(kernel, SGMCMCKernel, fn)
    _run_view.check_scores_available(kernel, fn)
    if kernel._model is None:
        assert kernel._potential_fn is not None  # a kernel has exactly one of the two
        return PotentialTarget(kernel._potential_fn, kernel.name)
    init_strategy = kernel._init_strategy or init_to_uniform
    with _global_rng_kept():
        return ModelTarget(
            kernel._model, model_args, model_kwargs, kernel._replace, kernel.name, init_strategy, kernel._compile,
            warn_no_plate=False,
        )  # fmt: skip


def _scores(
    target: ModelTarget | PotentialTarget, latents: Mapping[str, Any], generator: torch.Generator, fn: str
) -> torch.Tensor:
    """The ``(m, d)`` full-data scores at the rows of ``latents`` ``{site: (m, ...)}``."""
    dtype = torch.get_default_dtype()
    latents = {name: torch.as_tensor(np.asarray(value), dtype=dtype) for name, value in latents.items()}
    if isinstance(target, PotentialTarget) and target.layout is None:  # its latents are the ones given
        target.set_layout({name: value[0] for name, value in latents.items()})
    layout = target.layout
    expected = {name: tuple(layout.shapes[name]) for name in layout.names}
    got = {name: tuple(value.shape[1:]) for name, value in latents.items()}
    if got != expected:
        raise ValueError(
            f"{fn}: `latents` must hold the model's latent sites with shapes {expected} (unconstrained, after a "
            f"leading axis of draws), got {got}."
        )
    m = next(iter(latents.values())).shape[0]
    flat = torch.cat([latents[name].reshape(m, -1) for name in layout.names], dim=1)
    batches = target.epoch(generator, target.data_size)
    rows = [sum(target.gradient(x, batch).grad for batch in batches) for x in flat]
    return -torch.stack(rows) / len(batches)


def full_data_score(
    kernel: SGMCMCKernel,
    latents: Mapping[str, Any],
    model_args: tuple = (),
    model_kwargs: Mapping[str, Any] | None = None,
    *,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The full-data score ``s(θ) = -∇U(θ)`` of a kernel's target at each row of ``latents``.

    ``U`` is the potential of the whole data set in the unconstrained coordinates: ``-log p(θ)``, minus the
    log-likelihood of all ``N`` rows, minus the log-Jacobian of the transforms to the latents' supports
    (for SGRLD too, whose chain moves the constrained values), or the kernel's ``potential_fn``. The data
    enter in minibatches of the model's own ``subsample_size`` ``n`` (Pyro's plates take no other size):
    the score is the mean of the minibatch gradients over an epoch of ``⌊N/n⌋`` minibatches drawn without
    replacement (:meth:`~ppl_sgmcmc.pyro.potential.ModelTarget.epoch`), one at a time, so that memory stays
    at one minibatch gradient whatever ``N``; the gradient is the kernel's (compiled, unless the kernel has
    ``compile_potential=False``). It is exact when the model has one subsampled plate and ``n`` divides
    ``N``; otherwise the ``N mod n`` rows an epoch cannot hold are left out and the others weighted by
    ``N/(⌊N/n⌋ n)``, an unbiased estimate over the epoch's random rows (with several subsampled plates, the
    smaller plates' rows are drawn anew once their epoch ends). A stochastic ``potential_fn(z, generator)``
    gives the mean of its gradient over :data:`~ppl_sgmcmc.pyro.potential.PotentialTarget.EPOCH_DRAWS`
    generators. Cost: ``m ⌊N/n⌋`` gradient evaluations. Pyro's global random state is left as it was.

    :param kernel: a ppl_sgmcmc Pyro kernel (it need not have run).
    :param latents: ``{site: (m, ...)}``, ``m`` values of every latent site in the unconstrained coordinates
        (tensors or arrays); the rows of the result follow :func:`ppl_sgmcmc.diagnostics.flatten_draws` of it
        (``batch_ndim=1``: sites in sorted order).
    :param model_args: the model's positional arguments (the data).
    :param model_kwargs: the model's keyword arguments.
    :param generator: draws the epoch's minibatches (default: a generator seeded with 0).
    :returns: the ``(m, d)`` scores.
    :raises TypeError: a kernel that is not a ppl_sgmcmc kernel.
    :raises ValueError: a kernel with local Gibbs sites, or ``latents`` without the model's latent sites or
        with other shapes.

    **Example** (``y_i ~ N(μ, 1)``, ``μ ~ N(0, 1)``: ``s(μ) = Σ_i y_i - (N + 1) μ``, here ``10 - 11 μ``)::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from ppl_sgmcmc.pyro import SGLD
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        ...     with pyro.plate("data", y.shape[0], subsample_size=2):
        ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=pyro.subsample(y, event_dim=0))
        >>> kernel = SGLD(model, step_size=1e-3, compile_potential=False)
        >>> full_data_score(kernel, {"mu": torch.tensor([0.0, 1.0])}, (torch.ones(10),))
        tensor([[10.],
                [-1.]])
    """
    model_args, model_kwargs = as_tensors(tuple(model_args)), as_tensors(dict(model_kwargs or {}))
    target = _score_target(kernel, model_args, model_kwargs, "full_data_score")
    generator = torch.Generator().manual_seed(0) if generator is None else generator
    return _scores(target, latents, generator, "full_data_score")


class RunView:
    """A finished ``pyro.infer.MCMC`` run of a ppl_sgmcmc kernel, as :mod:`ppl_sgmcmc.diagnostics` reads it:
    its draws (constrained, or unconstrained for the scores), the full-data scores, the adapted
    preconditioner, the per-datum log-likelihoods and CSGLD's energy grid (of every chain), and the
    continuation of its last chain from the final state the kernel kept (``kernel.last_state``, continued
    through ``kernel.resume_from``).

    :param mcmc: the run.
    :param fn: the diagnostic's name, for messages.

    **Example**::

        >>> import torch, pyro
        >>> from pyro.infer import MCMC
        >>> from ppl_sgmcmc.pyro import SGLD
        >>> kernel = SGLD(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum(), step_size=0.1)
        >>> mcmc = MCMC(kernel, warmup_steps=10, num_samples=20, initial_params={"x": torch.zeros(3)},
        ...             disable_progbar=True)
        >>> mcmc.run()
        >>> view = RunView(mcmc, "example")
        >>> view.samples()["x"].shape, view.step_index(), view.preconditioner_scales()
        ((1, 20, 3), 30, None)
    """

    def __init__(self, mcmc: MCMC, fn: str) -> None:
        kernel = mcmc.kernel
        _run_view.check_kernel(kernel, SGMCMCKernel, fn)
        if mcmc._samples is None:
            raise ValueError(_run_view.no_draws(fn))
        self.mcmc, self.kernel, self.fn = mcmc, kernel, fn
        self.model_args, self.model_kwargs = as_tensors(tuple(mcmc._args)), as_tensors(dict(mcmc._kwargs))
        self._target: ModelTarget | PotentialTarget | None = None

    @property
    def target(self) -> ModelTarget | PotentialTarget:
        """The kernel's potential in unconstrained coordinates (built once)."""
        if self._target is None:
            self._target = _score_target(self.kernel, self.model_args, self.model_kwargs, self.fn)
        return self._target

    def _final(self) -> ChainState | None:
        """``kernel.last_state`` if it is the final state of this run's last chain (its position is the last
        draw), else ``None``."""
        last = self.kernel.last_state
        if last is None:
            return None
        draws, transforms = self.mcmc.get_samples(group_by_chain=True), self.mcmc.transforms
        for name, value in last.state.z.items():
            if name not in draws:
                return None
            value = transforms[name].inv(value) if name in transforms else value
            if value.shape != draws[name].shape[2:] or not torch.allclose(value, draws[name][-1, -1]):
                return None
        return last

    def _final_required(self) -> ChainState:
        last = self._final()
        if last is None:
            raise ValueError(
                f"{self.fn}: the kernel's `last_state` is not the final state of this run: Pyro keeps a chain's "
                "state in the kernel that ran it, and chains run in parallel processes keep theirs there. Run "
                "the chains one after another (one `MCMC` per chain, say), then check each."
            )
        return last

    def _sites(self, draws: Mapping[str, Any], names: list[str], what: str) -> dict[str, np.ndarray]:
        missing = [name for name in names if name not in draws]
        if missing:
            raise ValueError(f"{self.fn}: {what} lack the latent site(s) {missing}.")
        return {name: torch.as_tensor(draws[name]).detach().cpu().numpy() for name in names}

    def samples(self) -> dict[str, np.ndarray]:
        """The latent sites' draws, constrained, ``(chains, draws, ...)``."""
        names = sorted(self._final_required().state.z)
        return self._sites(self.mcmc.get_samples(group_by_chain=True), names, "the run's draws")

    def kept(self) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """What the run kept for :func:`~ppl_sgmcmc.diagnostics.verdict`: the draws of its sites flattened,
        ``(chains, draws, d)``, the kept draws' ``noise_ratio`` of each chain, ``(chains, draws)`` (``None`` if a
        chain lacks it), and no potential energy (the kernel records none)."""
        samples = self.mcmc.get_samples(group_by_chain=True)
        values = [torch.as_tensor(samples[name]).detach().cpu().numpy() for name in sorted(samples)]
        chains, draws = values[0].shape[:2]
        flat = np.concatenate([np.reshape(value, (chains, draws, -1)) for value in values], axis=-1)
        records = [chain.get("noise_ratio") if chain else None for chain in self.mcmc._diagnostics]
        noise_ratio = None
        if all(record is not None and len(record) == draws for record in records):
            noise_ratio = np.asarray(records, np.float64)
        return flat, noise_ratio, None

    def latents(self, samples: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
        """The run's draws (or ``samples``, constrained) in the score's unconstrained coordinates."""
        target = self.target
        draws = self.mcmc.get_samples(group_by_chain=True) if samples is None else samples
        names = sorted(draws) if target.layout is None else target.layout.names  # a potential_fn: all latents
        values = self._sites(draws, names, "the run's draws" if samples is None else "`samples`")
        with torch.no_grad():
            return {
                name: target.transforms[name](torch.as_tensor(value)).numpy() if name in target.transforms else value
                for name, value in values.items()
            }

    def scores(self, rows: Mapping[str, np.ndarray], seed: int) -> np.ndarray:
        """The full-data scores at the unconstrained ``rows`` (see :func:`full_data_score`)."""
        return _scores(self.target, rows, torch.Generator().manual_seed(seed), self.fn).cpu().numpy()

    def preconditioner_scales(self) -> np.ndarray | None:
        """The adapted ``L`` of the last chain, ``(1, d)`` or ``(1, d, d)``; ``None`` when nothing adapted or
        the kernel's last state is not this run's."""
        last = self._final()
        if last is None or not last.state.adapt_state:
            return None
        return last.state.adapt_state.preconditioner.scale.detach().cpu().numpy()[None]

    def warmup_fit(self) -> tuple[float, float, int] | None:
        """What the last chain's warm-up found in its last slow window (:func:`ppl_sgmcmc.adaptation.settled`):
        ``(misfit, explored, rounds)``; ``None`` when nothing adapted or the kernel's last state is not this run's."""
        last = self._final()
        if last is None or not last.state.adapt_state:
            return None
        adapt = last.state.adapt_state
        return float(adapt.misfit), float(adapt.explored), int(adapt.rounds)

    def final_rule_state(self) -> Any:
        """The last chain's final rule state, or ``None`` when the kernel's last state is not this run's."""
        last = self._final()
        return None if last is None else last.state.rule_state

    def step_index(self) -> int:
        """The step counter of the last chain's final state."""
        return int(self._final_required().state.i)

    def continue_chains(self, adjust: Callable[[Any], Any], num_draws: int, spacing: int) -> _run_view.Continuation:
        """``num_draws`` more draws of the last chain from ``adjust`` of its final state, ``spacing`` times as
        many steps apart as the run's (every ``spacing``-th draw kept), by a new ``MCMC`` of the same kernel
        that resumes it (the caller restores the kernel)."""
        last = self._final_required()
        self.kernel.resume_from = last._replace(state=adjust(last.state))
        continued = MCMC(self.kernel, num_samples=num_draws * spacing, warmup_steps=0, disable_progbar=True)
        with _global_rng_kept():
            continued.run(*self.mcmc._args, **self.mcmc._kwargs)
        samples = continued.get_samples(group_by_chain=True)
        draws = {name: value[:, spacing - 1 :: spacing] for name, value in samples.items()}
        return _run_view.Continuation(
            [self.mcmc.num_chains - 1],
            self._sites(draws, sorted(last.state.z), "the continued draws"),
            np.array([float(last.state.step_size)]),
            np.array([float(self.kernel.last_state.state.step_size)]),
        )

    def pointwise(self, num_draws: int, chunk_size: int | None, fixed: bool = False) -> _run_view.Pointwise:
        """The per-datum log-likelihoods of the full-data model (:func:`ppl_sgmcmc.pyro.full_data_log_likelihood`'s
        batched evaluation; ``fixed``: of the model on the :func:`~ppl_sgmcmc.diagnostics.fixed_rows` of each
        subsampled plate) at ``num_draws`` draws evenly spaced over each chain (of every chain the run holds),
        evaluated lazily ``chunk_size`` draws at a time, with the subsampled plates and the plate of each observed
        site."""
        target = self.target
        assert isinstance(target, ModelTarget)  # energy_noise and the verdict refuse a potential_fn first
        sizes, model = dict(target.plate_sizes), self.kernel.model
        if fixed:  # the model as declared, its plates' indices given
            indices = {name: torch.as_tensor(_run_view.fixed_rows(size, n)) for name, (size, n) in sizes.items()}
            declared = self.kernel.subsampled_model

            def model(*args: Any, **kwargs: Any) -> Any:
                with subsample_plates(indices):
                    return declared(*as_tensors(args), **as_tensors(kwargs))

            sizes = {name: (n, n) for name, (_, n) in sizes.items()}
        sites = inference_data._sites(self.mcmc, model)
        plates = _run_view.site_plates(sites.plates, sizes, self.fn)
        samples = self.mcmc.get_samples(group_by_chain=True)  # deterministic sites too, as full_data_log_likelihood
        chains, draws = next(iter(samples.values())).shape[:2]
        index = torch.as_tensor(_run_view.chain_index(draws, num_draws, self.fn))
        m = chains * len(index)
        flat = {name: value[:, index].reshape((m,) + value.shape[2:]) for name, value in samples.items()}
        entries = sum(math.prod(shape) for shape, _ in sites.observed.values())
        rows = _run_view.rows_per_chunk(chunk_size, entries, m)
        return _run_view.Pointwise(
            sizes, plates, target.replace, (chains, len(index)),
            inference_data._log_likelihood_chunks(self.mcmc, flat, sites.observed, rows, model),
        )  # fmt: skip

    def energy_gaps(self) -> np.ndarray:
        """CSGLD's ``Δu`` of each chain, as the chains reported it (``mcmc.diagnostics()``)."""
        chains = self.mcmc._diagnostics
        if not chains or any(chain is None or "energy_gap" not in chain for chain in chains):
            raise ValueError(f"{self.fn}: the run's chains did not report their `energy_gap` (mcmc.diagnostics()).")
        return np.array([float(chain["energy_gap"]) for chain in chains])
