"""Semi-collapsed LDA declared as an ordinary Pyro model: the twin of :mod:`models.lda` (NumPyro),
with the same sites, parametrisations, collapsed-Gibbs conditional and data layout, sampled by the
kernels of :mod:`ppl_sgmcmc.pyro` with local Gibbs sites (:mod:`ppl_sgmcmc.pyro.gibbs`)::

    kernel = SGNHT(lda_model, step_size=1e-2, diffusion=0.75, gibbs_sites=["z"],
                   gibbs_fn=make_gibbs_fn(words, mask, parametrisation="expanded"),
                   gibbs_init=make_gibbs_init(words, mask, parametrisation="expanded"), gibbs_sweeps=(3, 2))
    MCMC(kernel, warmup_steps=..., num_samples=...).run(words, mask, vocab_size=V, parametrisation="expanded")

See :mod:`models.lda` for the model's equations and the Fisher-identity gradient. The data preparation
(:func:`models.lda_common.prepare_corpus`), the top words (:func:`models.lda_common.top_words`) and the
held-out perplexity (:mod:`models.lda_evaluation`) take the topics of either backend
(``topic_word(samples["theta"])``); ``python -m models.run_lda --backend pyro`` runs this declaration
from the command line (:mod:`models.run_lda`).

Only the arithmetic is written again here, in torch: the two distributions and the collapsed-Gibbs
sweep, whose positions run in a Python loop (vectorised over the minibatch's documents) where the
JAX version uses ``lax.fori_loop``. ``tests/models/test_lda_pyro.py`` checks each against the NumPyro
version.
"""

from __future__ import annotations

from collections.abc import Callable

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.distributions.torch_distribution import TorchDistribution

from models.lda_common import PARAMETRISATIONS

_NO_SAMPLE_SHAPE = torch.Size()  # the default sample shape (immutable, so shared)

__all__ = [
    "CollapsedTopicAssignments",
    "TopicWords",
    "collapsed_gibbs_sweep",
    "lda_model",
    "make_gibbs_fn",
    "make_gibbs_init",
    "topic_columns",
    "topic_counts",
    "topic_word",
]


def topic_counts(z: torch.Tensor, mask: torch.Tensor, num_topics: int) -> torch.Tensor:
    """``n_dk``: the number of unmasked tokens of each document assigned to each topic, shape ``(..., K)``."""
    one_hot = torch.nn.functional.one_hot(z.long(), num_topics).to(torch.get_default_dtype())
    return (one_hot * mask[..., None]).sum(-2)


class CollapsedTopicAssignments(TorchDistribution):
    """The topic assignments of a document whose proportions ``Dirichlet(α 1_K)`` are integrated out;
    :class:`models.lda.CollapsedTopicAssignments` in torch (same ``log_prob``, same sampling scheme)."""

    arg_constraints = {"concentration": constraints.positive}

    def __init__(
        self,
        concentration: float | torch.Tensor,
        num_topics: int,
        mask: torch.Tensor,
        validate_args: bool | None = None,
    ) -> None:
        self.concentration = torch.as_tensor(concentration, dtype=torch.get_default_dtype())
        self.num_topics = int(num_topics)
        self.mask = torch.as_tensor(mask, dtype=torch.bool)
        super().__init__(self.mask.shape[:-1], self.mask.shape[-1:], validate_args=validate_args)

    @constraints.dependent_property(is_discrete=True, event_dim=1)
    def support(self):
        return constraints.independent(constraints.integer_interval(0, self.num_topics - 1), 1)

    def sample(self, sample_shape: torch.Size = _NO_SAMPLE_SHAPE) -> torch.Tensor:
        """Proportions ``θ_d ~ Dirichlet(α)`` (from log-Gamma draws, stable for small ``α``), then ``z_di ~ θ_d``."""
        shape = torch.Size(sample_shape) + self.batch_shape
        gamma = torch.distributions.Gamma(self.concentration + 1, 1.0).sample(shape + (self.num_topics,))
        uniform = torch.rand(shape + (self.num_topics,), dtype=gamma.dtype)
        log_theta = gamma.log() + uniform.log() / self.concentration  # Gamma(α) = Gamma(α + 1) U^(1/α)
        probs = torch.softmax(log_theta, -1)[..., None, :].expand(shape + self.event_shape + (self.num_topics,))
        z = torch.distributions.Categorical(probs=probs).sample()
        return torch.where(self.mask, z, torch.zeros_like(z))

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        alpha, num_topics = self.concentration, self.num_topics
        counts = topic_counts(value, self.mask, num_topics)
        length = self.mask.sum(-1).to(counts.dtype)
        return (
            torch.lgamma(num_topics * alpha)
            - torch.lgamma(num_topics * alpha + length)
            + torch.lgamma(alpha + counts).sum(-1)
            - num_topics * torch.lgamma(alpha)
        )


class TopicWords(TorchDistribution):
    """Words given their topic assignments, ``w_di ~ Categorical(π[z_di])`` with masked positions
    excluded; :class:`models.lda.TopicWords` in torch (``log_prob`` gathers ``π[z, w]``)."""

    arg_constraints = {}

    def __init__(
        self,
        topics: torch.Tensor,
        assignments: torch.Tensor,
        mask: torch.Tensor,
        validate_args: bool | None = None,
    ) -> None:
        self.topics = topics
        self.assignments = assignments
        self.mask = torch.as_tensor(mask, dtype=torch.bool)
        shape = torch.broadcast_shapes(assignments.shape, self.mask.shape)
        super().__init__(shape[:-1], shape[-1:], validate_args=validate_args)

    @constraints.dependent_property(is_discrete=True, event_dim=1)
    def support(self):
        return constraints.independent(constraints.integer_interval(0, self.topics.shape[-1] - 1), 1)

    def sample(self, sample_shape: torch.Size = _NO_SAMPLE_SHAPE) -> torch.Tensor:
        words = torch.distributions.Categorical(probs=self.topics[self.assignments.long()]).sample(sample_shape)
        return torch.where(self.mask, words, torch.zeros_like(words))

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        probs = self.topics[self.assignments.long(), value.long()]
        return torch.where(self.mask, probs.log(), torch.zeros_like(probs)).sum(-1)


def topic_word(theta: torch.Tensor, parametrisation: str = "gaussian") -> torch.Tensor:
    """The topics ``π`` (rows on the simplex) from the topic parameters ``θ`` (``(..., K, V)``)."""
    weights = theta.abs() if parametrisation == "gaussian" else theta
    return weights / weights.sum(-1, keepdim=True)


def lda_model(
    words: torch.Tensor,
    mask: torch.Tensor,
    vocab_size: int,
    num_topics: int = 30,
    alpha: float = 0.1,
    parametrisation: str = "gaussian",
    beta: float = 0.1,
    prior_mean: float = 0.1,
    batch_size: int = 5,
) -> None:
    """Semi-collapsed LDA on padded documents ``words`` (``(D, L)`` word ids) with ``mask``; the
    arguments of :func:`models.lda.lda_model`."""
    num_docs = words.shape[0]
    if parametrisation == "gaussian":
        prior = dist.Normal(prior_mean, 1.0)
    elif parametrisation == "expanded":
        prior = dist.Gamma(beta, 1.0)
    else:
        raise ValueError(f"unknown parametrisation {parametrisation!r}; choose one of {PARAMETRISATIONS}")
    theta = pyro.sample("theta", prior.expand([num_topics, vocab_size]).to_event(2))
    topics = topic_word(theta, parametrisation)
    with pyro.plate("documents", num_docs, subsample_size=min(batch_size, num_docs)):
        batch_words = pyro.subsample(words, event_dim=1)
        batch_mask = pyro.subsample(mask, event_dim=1)
        z = pyro.sample("z", CollapsedTopicAssignments(alpha, num_topics, batch_mask))
        pyro.sample("words", TopicWords(topics, z, batch_mask), obs=batch_words)


def collapsed_gibbs_sweep(
    generator: torch.Generator, z: torch.Tensor, word_probs: torch.Tensor, mask: torch.Tensor, alpha: float
) -> torch.Tensor:
    """One sequential collapsed-Gibbs sweep over the tokens of a batch of documents, as
    :func:`models.lda.collapsed_gibbs_sweep`: token ``i`` of document ``d`` is redrawn from
    ``p(z_di = k | z_d,-i, w) ∝ (n_dk^{-di} + α) π_{k,w_di}`` by inverting the CDF at a uniform of
    ``generator``; masked positions keep their value. Returns the new ``z`` (``(n, L)``)."""
    num_docs, length, num_topics = word_probs.shape
    counts = topic_counts(z, mask, num_topics).to(word_probs.dtype)
    uniforms = torch.rand((length, num_docs, 1), generator=generator, dtype=counts.dtype)
    used = torch.nonzero(mask.any(0))
    positions = int(used.max()) + 1 if len(used) else 0
    # position-major copies, so that each position's slice is contiguous
    z_t, mask_t = z.T.long().contiguous(), mask.T.contiguous()
    on_t, probs_t = mask_t.to(counts.dtype)[..., None], word_probs.transpose(0, 1).contiguous()
    for i in range(positions):
        old = z_t[i, :, None]
        counts.scatter_add_(1, old, -on_t[i])
        cdf = torch.cumsum((counts + alpha) * probs_t[i], -1)
        new = torch.searchsorted(cdf, uniforms[i] * cdf[:, -1:])  # the number of CDF entries below u·total
        new = torch.where(mask_t[i, :, None], new, old)
        counts.scatter_add_(1, new, on_t[i])
        z_t[i] = new[:, 0]
    return z_t.T.to(z.dtype)


def topic_columns(theta: torch.Tensor, words: torch.Tensor, parametrisation: str = "gaussian") -> torch.Tensor:
    """``π_{k, w_di}`` for the tokens ``words`` (``(n, L)``), shape ``(n, L, K)``, without forming all of ``π``."""
    weights = theta.abs() if parametrisation == "gaussian" else theta
    return torch.movedim(weights[:, words.long()], 0, -1) / weights.sum(-1)


def make_gibbs_fn(
    words: torch.Tensor,
    mask: torch.Tensor,
    alpha: float = 0.1,
    parametrisation: str = "gaussian",
    plate: str = "documents",
    site: str = "z",
) -> Callable[[torch.Generator, dict, dict, dict], dict]:
    """The collapsed-Gibbs conditional of the topic assignments as a ``gibbs_fn``: one sweep over the
    minibatch's documents given the topics of ``hmc_sites["theta"]`` (:func:`models.lda.make_gibbs_fn`)."""
    words, mask = torch.as_tensor(words), torch.as_tensor(mask, dtype=torch.bool)

    def gibbs_fn(generator, gibbs_sites, hmc_sites, subsample_indices):
        rows = subsample_indices[plate]
        word_probs = topic_columns(hmc_sites["theta"], words[rows], parametrisation)
        return {site: collapsed_gibbs_sweep(generator, gibbs_sites[site], word_probs, mask[rows], alpha)}

    return gibbs_fn


def make_gibbs_init(
    words: torch.Tensor,
    mask: torch.Tensor,
    parametrisation: str = "gaussian",
    plate: str = "documents",
    site: str = "z",
) -> Callable[[torch.Generator, dict, dict, dict], dict]:
    """The sweeps' starting point as a ``gibbs_init``: each token's topic drawn from
    ``p(z_di = k | w_di, π) ∝ π_{k, w_di}`` (:func:`models.lda.make_gibbs_init`)."""
    words, mask = torch.as_tensor(words), torch.as_tensor(mask, dtype=torch.bool)

    def gibbs_init(generator, gibbs_sites, hmc_sites, subsample_indices):
        rows = subsample_indices[plate]
        word_probs = topic_columns(hmc_sites["theta"], words[rows], parametrisation)
        z = torch.multinomial(word_probs.reshape(-1, word_probs.shape[-1]), 1, generator=generator)
        return {site: torch.where(mask[rows], z.reshape(word_probs.shape[:-1]), 0)}

    return gibbs_init
