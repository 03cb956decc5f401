"""Semi-collapsed latent Dirichlet allocation, declared as an ordinary NumPyro model and sampled by
SG-MCMC with a local Gibbs step for the topic assignments, as in Li, Chen, Fan & Carin, "High-Order
Stochastic Gradient Thermostats for Bayesian Learning of Deep Models" (AAAI 2016), §5.1, after
Patterson & Teh, "Stochastic Gradient Riemannian Langevin Dynamics on the Probability Simplex"
(NeurIPS 2013).

**The model.** ``K`` topics over a vocabulary of ``V`` words; ``D`` documents in a plate subsampled
to ``batch_size`` documents per step. The per-document topic proportions ``Dirichlet(α)`` are
integrated out analytically (:class:`CollapsedTopicAssignments`), the per-token topic assignments
``z`` are a discrete latent site, the words are observed given ``z`` (:class:`TopicWords`). The
topic parameters come in two parametrisations (:data:`models.lda_common.PARAMETRISATIONS`):

* ``"gaussian"`` (Li et al. 2016, after Ding, Fang, Babbush, Chen, Skeel & Neven, "Bayesian Sampling
  Using Stochastic Gradient Thermostats", NeurIPS 2014; for SGNHT and SGHMC):
  ``θ_kw ~ N(0.1, 1)``, ``π_kw = |θ_kw| / Σ_w |θ_kw|``;
* ``"expanded"`` (the expanded mean of Patterson & Teh 2013; for SGRLD, which moves ``θ`` itself, and
  for SGNHT/SGHMC, which move ``log θ``): ``θ_kw ~ Gamma(β, 1)``, ``π_kw = θ_kw / Σ_w θ_kw``, so that
  ``π_k ~ Dirichlet(β)``, the model collapsed Gibbs samples with ``η = β``.

On corpora whose vocabulary is larger than the tokens per topic (AP, Reuters) the posterior of the
``"gaussian"`` model has nearly flat topics (its ``|θ|`` acts like a Dirichlet prior of concentration
about 1 per word), so its perplexity stays far above collapsed Gibbs whatever the sampler; use the
``"expanded"`` model with ``β = 0.1``. The measurements are in ``benchmarks/RESULTS.md``, section
"LDA on AP". The same model declared in Pyro is :mod:`models.lda_pyro`.

The kernels sample ``θ`` with ``z`` as local Gibbs sites (:mod:`ppl_sgmcmc.numpyro.gibbs`):
:func:`make_gibbs_fn` is the collapsed-Gibbs conditional of ``z`` given ``π``, and the stochastic
gradient is the Fisher-identity estimate ``(D/|S|) Σ_d E_{z_d|w_d,π}[∇ log p(w_d, z_d | θ)]`` averaged
over the kept sweeps::

    kernel = SGNHT(lda_model, step_size=1e-3, diffusion=0.75, gibbs_sites=["z"],
                   gibbs_fn=make_gibbs_fn(words, mask, alpha=0.1), gibbs_init=make_gibbs_init(words, mask),
                   gibbs_sweeps=(5, 5))
    MCMC(kernel, num_warmup=..., num_samples=...).run(key, words, mask, vocab_size=V)

**Documents** are rows of a padded ``(D, L)`` array of word ids with a boolean ``mask`` (tokens first,
padding after; :func:`models.lda_common.pad_documents`, :func:`models.lda_common.prepare_corpus`).
Each Gibbs sweep loops over token positions only up to the longest document of the minibatch, so
padding to the corpus' longest document costs memory, not time.

**Elsewhere:** the held-out perplexity by document completion is :mod:`models.lda_evaluation`; the
command line (``python -m models.run_lda --help``, either backend) is :mod:`models.run_lda`.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from jax import lax, random
from jax.scipy.special import gammaln
from jax.typing import ArrayLike
from numpyro.distributions import constraints

from models.lda_common import PARAMETRISATIONS

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


# --- distributions ----------------------------------------------------------------------------------
def topic_counts(z: ArrayLike, mask: ArrayLike, num_topics: int) -> jax.Array:
    """``n_dk``: the number of unmasked tokens of each document assigned to each topic, shape ``(..., K)``."""
    return jnp.sum(jax.nn.one_hot(z, num_topics) * mask[..., None], axis=-2)


class CollapsedTopicAssignments(dist.Distribution):
    """The topic assignments ``z_d = (z_d1..z_dL)`` of a document whose topic proportions
    ``Dirichlet(α 1_K)`` are integrated out (a Dirichlet-multinomial sequence)::

        log p(z_d) = log Γ(Kα) - log Γ(Kα + L_d) + Σ_k [log Γ(α + n_dk) - log Γ(α)]

    with ``n_dk`` the tokens of ``d`` assigned to ``k`` and ``L_d`` the document's length; masked
    (padding) positions count for nothing and are sampled as 0.

    :param concentration: ``α > 0`` (a scalar).
    :param int num_topics: ``K``.
    :param mask: boolean ``(..., L)``; batch shape ``mask.shape[:-1]``, event shape ``(L,)``.
    """

    arg_constraints = {"concentration": constraints.positive}
    pytree_data_fields = ("concentration", "mask")
    pytree_aux_fields = ("num_topics",)

    def __init__(
        self, concentration: ArrayLike, num_topics: int, mask: ArrayLike, *, validate_args: bool | None = None
    ) -> None:
        self.concentration = jnp.asarray(concentration, dtype=jnp.result_type(float))
        self.num_topics = int(num_topics)
        self.mask = jnp.asarray(mask, dtype=bool)
        super().__init__(self.mask.shape[:-1], self.mask.shape[-1:], validate_args=validate_args)

    @constraints.dependent_property(is_discrete=True, event_dim=1)
    def support(self):
        return constraints.independent(constraints.integer_interval(0, self.num_topics - 1), 1)

    def sample(self, key: jax.Array, sample_shape: tuple[int, ...] = ()) -> jax.Array:
        """Proportions ``θ_d ~ Dirichlet(α)`` (drawn in log space, stable for small ``α``), then ``z_di ~ θ_d``."""
        key_theta, key_z = random.split(key)
        shape = sample_shape + self.batch_shape
        log_theta = random.loggamma(key_theta, self.concentration, shape + (self.num_topics,))
        z = random.categorical(key_z, log_theta[..., None, :], shape=shape + self.event_shape)
        return jnp.where(self.mask, z, 0)

    def log_prob(self, value: ArrayLike) -> jax.Array:
        alpha, num_topics = self.concentration, self.num_topics
        counts = topic_counts(value, self.mask, num_topics)
        length = jnp.sum(self.mask, axis=-1)
        return (
            gammaln(num_topics * alpha)
            - gammaln(num_topics * alpha + length)
            + jnp.sum(gammaln(alpha + counts), axis=-1)
            - num_topics * gammaln(alpha)
        )


class TopicWords(dist.Distribution):
    """Words given their topic assignments: ``w_di ~ Categorical(π[z_di])``, masked positions excluded.

    ``log_prob`` gathers ``π[z, w]`` (it never forms the ``(..., L, V)`` table of ``π[z]``).

    :param topics: ``π``, shape ``(K, V)``, rows on the simplex.
    :param assignments: ``z``, integer ``(..., L)``.
    :param mask: boolean, the shape of ``assignments``.
    """

    arg_constraints = {}
    pytree_data_fields = ("topics", "assignments", "mask")

    def __init__(
        self, topics: jax.Array, assignments: jax.Array, mask: ArrayLike, *, validate_args: bool | None = None
    ) -> None:
        self.topics = topics
        self.assignments = assignments
        self.mask = jnp.asarray(mask, dtype=bool)
        batch_shape = jnp.broadcast_shapes(jnp.shape(assignments), self.mask.shape)
        super().__init__(batch_shape[:-1], batch_shape[-1:], validate_args=validate_args)

    @constraints.dependent_property(is_discrete=True, event_dim=1)
    def support(self):
        return constraints.independent(constraints.integer_interval(0, self.topics.shape[-1] - 1), 1)

    def sample(self, key: jax.Array, sample_shape: tuple[int, ...] = ()) -> jax.Array:
        logits = jnp.log(self.topics)[self.assignments]
        words = random.categorical(key, logits, shape=sample_shape + self.batch_shape + self.event_shape)
        return jnp.where(self.mask, words, 0)

    def log_prob(self, value: ArrayLike) -> jax.Array:
        return jnp.sum(jnp.where(self.mask, jnp.log(self.topics[self.assignments, value]), 0.0), axis=-1)


# --- the model --------------------------------------------------------------------------------------
def topic_word(theta: ArrayLike, parametrisation: str = "gaussian") -> jax.Array:
    """The topics ``π`` (rows on the simplex) from the topic parameters ``θ`` (``(..., K, V)``)."""
    weights = jnp.abs(theta) if parametrisation == "gaussian" else theta
    return weights / jnp.sum(weights, axis=-1, keepdims=True)


def lda_model(
    words: ArrayLike,
    mask: ArrayLike,
    vocab_size: int,
    num_topics: int = 30,
    alpha: float = 0.1,
    parametrisation: str = "gaussian",
    beta: float = 0.1,
    prior_mean: float = 0.1,
    batch_size: int = 5,
) -> None:
    """Semi-collapsed LDA on padded documents ``words`` (``(D, L)`` word ids) with ``mask``.

    :param int vocab_size: ``V``.
    :param int num_topics: ``K``.
    :param float alpha: ``α``, the Dirichlet concentration of the (collapsed) topic proportions.
    :param str parametrisation: ``"gaussian"``: ``θ_kw ~ N(prior_mean, 1)``, ``π ∝ |θ|`` (Li et al. 2016);
        ``"expanded"``: ``θ_kw ~ Gamma(beta, 1)``, ``π ∝ θ`` (Patterson & Teh's expanded mean).
    :param int batch_size: documents per minibatch (the plate's ``subsample_size``).
    """
    num_docs = words.shape[0]
    if parametrisation == "gaussian":
        prior = dist.Normal(prior_mean, 1.0)
    elif parametrisation == "expanded":
        prior = dist.Gamma(beta, 1.0)
    else:
        raise ValueError(f"unknown parametrisation {parametrisation!r}; choose one of {PARAMETRISATIONS}")
    theta = numpyro.sample("theta", prior.expand([num_topics, vocab_size]).to_event(2))
    topics = topic_word(theta, parametrisation)
    with numpyro.plate("documents", num_docs, subsample_size=min(batch_size, num_docs)):
        batch_words = numpyro.subsample(words, event_dim=1)
        batch_mask = numpyro.subsample(mask, event_dim=1)
        z = numpyro.sample("z", CollapsedTopicAssignments(alpha, num_topics, batch_mask))
        numpyro.sample("words", TopicWords(topics, z, batch_mask), obs=batch_words)


# --- collapsed Gibbs ----------------------------------------------------------------------------------
def collapsed_gibbs_sweep(
    rng_key: jax.Array, z: jax.Array, word_probs: jax.Array, mask: jax.Array, alpha: float
) -> jax.Array:
    """One sequential collapsed-Gibbs sweep over the tokens of a batch of documents.

    Token ``i`` of document ``d`` is redrawn from ``p(z_di = k | z_d,-i, w) ∝ (n_dk^{-di} + α) π_{k,w_di}``,
    positions in order, all documents at once. ``word_probs[d, i, k] = π_{k, w_di}``; masked positions
    keep their value and count for nothing. The loop stops at the last unmasked position of the batch.

    :return: the new ``z`` (same shape, ``(n, L)``).
    """
    num_docs, length, num_topics = word_probs.shape
    counts = topic_counts(z, mask, num_topics)
    uniforms = random.uniform(rng_key, (length, num_docs), dtype=counts.dtype)
    positions = jnp.max(jnp.where(mask, jnp.arange(1, length + 1), 0))
    z_t, mask_t, probs_t = z.T, mask.T, jnp.swapaxes(word_probs, 0, 1)

    def body(i, carry):
        z_t, counts = carry
        old, on = z_t[i], mask_t[i]
        counts = counts - jax.nn.one_hot(old, num_topics, dtype=counts.dtype) * on[:, None]
        cdf = jnp.cumsum((counts + alpha) * probs_t[i], axis=-1)
        new = jnp.sum(cdf < uniforms[i][:, None] * cdf[:, -1:], axis=-1)
        new = jnp.where(on, jnp.minimum(new, num_topics - 1), old).astype(z_t.dtype)
        counts = counts + jax.nn.one_hot(new, num_topics, dtype=counts.dtype) * on[:, None]
        return z_t.at[i].set(new), counts

    z_t, _ = lax.fori_loop(0, positions, body, (z_t, counts))
    return z_t.T


def topic_columns(theta: jax.Array, words: ArrayLike, parametrisation: str = "gaussian") -> jax.Array:
    """``π_{k, w_di}`` for the tokens ``words`` (``(n, L)``), shape ``(n, L, K)``, without forming all of ``π``."""
    weights = jnp.abs(theta) if parametrisation == "gaussian" else theta
    norms = jnp.sum(weights, axis=-1)
    return jnp.moveaxis(weights[:, words], 0, -1) / norms


def make_gibbs_fn(
    words: ArrayLike,
    mask: ArrayLike,
    alpha: float = 0.1,
    parametrisation: str = "gaussian",
    plate: str = "documents",
    site: str = "z",
) -> Callable[[jax.Array, dict, dict, dict], dict]:
    """The collapsed-Gibbs conditional of the topic assignments, as a ``gibbs_fn`` for the kernels'
    ``gibbs_sites=["z"]`` option: one sweep (:func:`collapsed_gibbs_sweep`) over the minibatch's
    documents given the topics of ``hmc_sites["theta"]``. ``words`` and ``mask`` are the full padded
    corpus given to the model; the minibatch's rows are taken by ``subsample_indices[plate]``."""
    words, mask = jnp.asarray(words), jnp.asarray(mask, dtype=bool)

    def gibbs_fn(rng_key, gibbs_sites, hmc_sites, subsample_indices):
        rows = subsample_indices[plate]
        batch_words, batch_mask = words[rows], mask[rows]
        word_probs = topic_columns(hmc_sites["theta"], batch_words, parametrisation)
        return {site: collapsed_gibbs_sweep(rng_key, gibbs_sites[site], word_probs, batch_mask, alpha)}

    return gibbs_fn


def make_gibbs_init(
    words: ArrayLike, mask: ArrayLike, parametrisation: str = "gaussian", plate: str = "documents", site: str = "z"
) -> Callable[[jax.Array, dict, dict, dict], dict]:
    """The starting point of the sweeps, as a ``gibbs_init`` for the kernels: each token's topic drawn
    from ``p(z_di = k | w_di, π) ∝ π_{k, w_di}`` (the conditional under uniform document proportions),
    independently. The model's prior draw is a poor start at small ``α``: it puts each document on one
    or two random topics, which the collapsed sweeps leave only at a cost ``α`` per token."""
    words, mask = jnp.asarray(words), jnp.asarray(mask, dtype=bool)

    def gibbs_init(rng_key, gibbs_sites, hmc_sites, subsample_indices):
        rows = subsample_indices[plate]
        word_probs = topic_columns(hmc_sites["theta"], words[rows], parametrisation)
        z = random.categorical(rng_key, jnp.log(word_probs))
        return {site: jnp.where(mask[rows], z, 0)}

    return gibbs_init
