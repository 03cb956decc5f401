"""Sample the topics of semi-collapsed LDA on a bundled corpus (AP or Reuters) with an SG-MCMC kernel and
its local collapsed-Gibbs step, on either backend, and print the held-out perplexity and the top words.

Run ``python -m models.run_lda --help`` for the options; ``--backend numpyro`` (the default) samples
the NumPyro declaration (:mod:`models.lda`) with :mod:`ppl_sgmcmc.numpyro`, ``--backend pyro`` the Pyro
declaration (:mod:`models.lda_pyro`) with :mod:`ppl_sgmcmc.pyro`. The corpus is split by
:func:`models.lda_common.prepare_corpus` and scored by :func:`models.lda_evaluation.held_out_perplexity`
(document completion). The kernels (:func:`make_kernel`) are those compared by Li, Chen, Fan & Carin,
"High-Order Stochastic Gradient Thermostats for Bayesian Learning of Deep Models" (AAAI 2016), §5.1;
measured perplexities on AP are in ``benchmarks/RESULTS.md``, section "LDA on AP".

This module is the only one that imports both declarations; neither imports it.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax.numpy as jnp
import numpy as np
from jax import random

from models import lda
from models.datasets import load_corpus
from models.lda_common import PARAMETRISATIONS, prepare_corpus, top_words
from models.lda_evaluation import held_out_perplexity

if TYPE_CHECKING:
    import torch

    import ppl_sgmcmc.numpyro
    import ppl_sgmcmc.pyro

__all__ = ["BACKENDS", "KERNELS", "main", "make_kernel", "run_chain"]

KERNELS = ("mSGNHT-S", "mSGNHT-E", "SGHMC-S", "SGHMC-E", "SGRLD")
BACKENDS = ("numpyro", "pyro")


def make_kernel(
    name: str,
    step_size: float,
    words: np.ndarray | torch.Tensor,
    mask: np.ndarray | torch.Tensor,
    alpha: float = 0.1,
    diffusion: float = 0.75,
    gibbs_sweeps: tuple[int, int] = (5, 5),
    parametrisation: str | None = None,
    backend: str = "numpyro",
    **kwargs,
) -> tuple[ppl_sgmcmc.numpyro.SGMCMCKernel | ppl_sgmcmc.pyro.SGMCMCKernel, str]:
    """A kernel for LDA by name, with the collapsed-Gibbs local step: ``mSGNHT-S``, ``mSGNHT-E``,
    ``SGHMC-S``, ``SGHMC-E`` (diffusion / friction ``D``; by default on the ``"gaussian"``
    parametrisation of Li et al. 2016, or on the ``"expanded"`` mean, sampled in log space) or ``SGRLD``
    (expanded mean, in its own positive space). ``backend="pyro"`` gives the Pyro kernel on the Pyro
    declaration (:mod:`models.lda_pyro`; ``words`` and ``mask`` as tensors). Returns
    ``(kernel, parametrisation)``; other keyword arguments go to the kernel."""
    if backend == "numpyro":
        from ppl_sgmcmc.numpyro import SGHMC, SGNHT, SGRLD

        declaration = lda
    elif backend == "pyro":
        from models import lda_pyro as declaration
        from ppl_sgmcmc.pyro import SGHMC, SGNHT, SGRLD
    else:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    if parametrisation is None:
        parametrisation = "expanded" if name == "SGRLD" else "gaussian"
    elif name == "SGRLD" and parametrisation != "expanded":
        raise ValueError("SGRLD samples the expanded-mean parametrisation only")
    gibbs = dict(
        gibbs_sites=["z"],
        gibbs_fn=declaration.make_gibbs_fn(words, mask, alpha, parametrisation),
        gibbs_init=declaration.make_gibbs_init(words, mask, parametrisation),
        gibbs_sweeps=gibbs_sweeps,
    )
    model = declaration.lda_model
    integrator = "euler" if name.endswith("-E") else "splitting"
    if name.startswith("mSGNHT"):
        kernel = SGNHT(model, step_size=step_size, diffusion=diffusion, integrator=integrator, **gibbs, **kwargs)
    elif name.startswith("SGHMC"):
        kernel = SGHMC(model, step_size=step_size, friction=diffusion, integrator=integrator, **gibbs, **kwargs)
    elif name == "SGRLD":
        kernel = SGRLD(model, step_size=step_size, **gibbs, **kwargs)
    else:
        raise ValueError(f"unknown kernel {name!r}")
    return kernel, parametrisation


def run_chain(
    kernel: ppl_sgmcmc.numpyro.SGMCMCKernel | ppl_sgmcmc.pyro.SGMCMCKernel,
    backend: str,
    seed: int,
    num_warmup: int,
    num_samples: int,
    words: np.ndarray | torch.Tensor,
    mask: np.ndarray | torch.Tensor,
    **model_kwargs,
) -> tuple[np.ndarray, int]:
    """Run ``kernel`` through its PPL's ``MCMC`` (``num_warmup`` / ``num_samples`` draws); returns the
    samples of ``theta`` as a NumPy array and the number of rejected (non-finite) steps."""
    if backend == "numpyro":
        from numpyro.infer import MCMC

        mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples)
        mcmc.run(random.PRNGKey(seed), words, mask, **model_kwargs)
        return np.asarray(mcmc.get_samples()["theta"]), int(mcmc.last_state.num_diverging)
    import pyro
    import torch
    from pyro.infer import MCMC

    pyro.set_rng_seed(seed)
    mcmc = MCMC(kernel, warmup_steps=num_warmup, num_samples=num_samples)
    mcmc.run(torch.as_tensor(words), torch.as_tensor(mask), **model_kwargs)
    return mcmc.get_samples()["theta"].numpy(), kernel.diagnostics()["num_diverging"]


def main(argv: Sequence[str] | None = None) -> None:
    """The command line (``python -m models.run_lda --help``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", choices=["ap", "reuters"], default="reuters")
    parser.add_argument("--kernel", choices=KERNELS, default="mSGNHT-S")
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="numpyro",
        help="the model's declaration and kernels: NumPyro (models.lda) or Pyro (models.lda_pyro; slower: "
        "its Gibbs sweeps run in a Python loop)",
    )
    parser.add_argument(
        "--parametrisation",
        choices=PARAMETRISATIONS,
        default="expanded",
        help="topic parameters of the momentum kernels: 'expanded' (default; the expanded mean, sampled in log "
        "space) or 'gaussian' (Li et al. 2016's N(0.1, 1), whose posterior topics are nearly flat on these "
        "corpora; see benchmarks/RESULTS.md). SGRLD always uses 'expanded'.",
    )
    parser.add_argument("--step-size", type=float, default=None, help="default: 1e-2 (gaussian: 3e-3; SGRLD: 1e-2)")
    parser.add_argument("--topics", type=int, default=30)
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--beta", type=float, default=0.1, help="Gamma(β, 1) prior of the expanded mean (SGRLD)")
    parser.add_argument("--diffusion", type=float, default=0.75, help="D of SGNHT, friction of SGHMC")
    parser.add_argument("--batch-size", type=int, default=5)
    parser.add_argument("--gibbs-sweeps", type=int, nargs=2, default=(3, 2), metavar=("BURN_IN", "KEPT"))
    parser.add_argument("--num-warmup", type=int, default=2000)
    parser.add_argument("--num-samples", type=int, default=2000)
    parser.add_argument("--thinning", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    corpus = load_corpus(args.corpus)
    data = prepare_corpus(corpus)
    print(
        f"{args.corpus}: {len(data.train_documents)} training / {len(data.test_documents)} test documents, "
        f"V = {data.vocab_size}, K = {args.topics}; {data.held_out.num_tokens} held-out tokens"
    )
    parametrisation = "expanded" if args.kernel == "SGRLD" else args.parametrisation
    step_size = args.step_size or (3e-3 if parametrisation == "gaussian" else 1e-2)
    words, mask = data.train_words, data.train_mask
    if args.backend == "pyro":
        import torch

        torch.set_num_threads(1)  # per-token Gibbs updates on small tensors: threads only add overhead
        words, mask = torch.as_tensor(words), torch.as_tensor(mask)
    kernel, parametrisation = make_kernel(
        args.kernel,
        step_size,
        words,
        mask,
        args.alpha,
        args.diffusion,
        tuple(args.gibbs_sweeps),
        parametrisation=parametrisation,
        backend=args.backend,
        steps_per_sample=args.thinning,
    )
    start = time.perf_counter()
    theta, rejected = run_chain(
        kernel,
        args.backend,
        args.seed,
        args.num_warmup // args.thinning,
        args.num_samples // args.thinning,
        words,
        mask,
        vocab_size=data.vocab_size,
        num_topics=args.topics,
        alpha=args.alpha,
        parametrisation=parametrisation,
        beta=args.beta,
        batch_size=args.batch_size,
    )
    topics = lda.topic_word(jnp.asarray(theta), parametrisation)
    seconds = time.perf_counter() - start
    value = held_out_perplexity(topics, data.held_out, args.alpha, seed=args.seed)
    uniform = held_out_perplexity(jnp.full((1, args.topics, data.vocab_size), 1.0 / data.vocab_size), data.held_out, args.alpha)
    print(
        f"{args.kernel} ({parametrisation}), h = {step_size:g}: {args.num_warmup + args.num_samples} steps "
        f"({(args.num_warmup + args.num_samples) * args.batch_size} documents seen) in {seconds:.0f} s; "
        f"({args.backend}); rejected steps: {rejected}"
    )
    print(f"held-out perplexity (document completion, {len(topics)} samples): {value:.1f}  (uniform topics: {uniform:.0f})")
    print("\ntop words of the posterior-mean topics:")
    for k, words in enumerate(top_words(topics.mean(0), data.vocab)):
        print(f"  {k:2d}: {' '.join(words)}")


if __name__ == "__main__":
    main()
