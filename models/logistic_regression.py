"""Bayesian logistic regression on a9a with SG-MCMC: the README's main job.

The model is that of Li, Chen, Fan & Carin, "High-Order Stochastic Gradient Thermostats for Bayesian
Learning of Deep Models" (AAAI 2016), §5.3 / Table 2: weights ``w ~ N(0, 10 I)``, labels
``y_i ~ Bernoulli(sigmoid(x_iᵀ w))``, the likelihood in a plate subsampled to ``batch_size`` rows.

Run ``python -m models.logistic_regression --help`` for the options. The defaults are the library's: four
chains of mSGNHT-S with no step size given, so the warm-up finds an approximate mode, builds a dense Laplace
preconditioner there (a9a's one-hot feature groups leave directions that only the prior identifies, sd ~3,
next to directions with sd ~0.01) and tunes the step size from the gradient noise it measures (SVRG's
variance-reduced gradient, SGNHT's and SGHMC's default with a tuned step size); 20 000
warm-up and 600 000 kept steps per chain, thinned by 300 inside the kernel. The run prints the tuned step
sizes and noise ratios, the test accuracy next to the one Li et al. report (:data:`PAPER_ACCURACY`), an
ArviZ summary and PSIS-LOO, and writes the InferenceData (netCDF) and a trace plot (PNG).
``benchmarks/a9a_vs_nuts.py`` compares these defaults with full-data NUTS.

PSIS-LOO needs the pointwise log-likelihood of every training row at every draw: 4 × 2000 × 32 561 float32,
1 GB, which compression shrinks by a fifth at best (the values are all mantissa). The job computes it (peak
memory about 2.2 GB; :func:`loo` works through it a chunk of rows at a time) and by default leaves it out of
the netCDF file (posterior, sample statistics, observed data: 4 MB); ``--log-likelihood`` writes it too,
byte-shuffled and zlib-compressed (0.8 GB), for ``az.loo`` or ``az.compare`` on the file.
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.typing import ArrayLike

from models.datasets import load_a9a

PAPER_ACCURACY = {  # Li, Chen, Fan & Carin (AAAI 2016), Table 2: test accuracy on a9a
    ("SGNHT", "splitting"): 0.8495,
    ("SGNHT", "euler"): 0.8472,
    ("SGHMC", "splitting"): 0.8456,
    ("SGHMC", "euler"): 0.8451,
}


def model(X: ArrayLike, y: ArrayLike | None = None, batch_size: int = 100) -> None:
    """Bayesian logistic regression with a ``N(0, 10)`` prior, minibatched over the rows of ``X``."""
    w = numpyro.sample("w", dist.Normal(0.0, 10**0.5).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=batch_size):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Bernoulli(logits=Xb @ w), obs=yb)


def predictive_accuracy(w: jax.Array, X: ArrayLike, y: ArrayLike, rows: int = 2048) -> float:
    """Accuracy of the posterior predictive ``mean_s sigmoid(x w_s) > 1/2`` on ``(X, y)``, ``rows`` rows of ``X`` at
    a time (a ``rows × draws`` matrix in memory, not ``N × draws``: 0.5 GB for a9a's test set and 8000 draws)."""
    correct = 0
    for start in range(0, len(X), rows):
        probability = jax.nn.sigmoid(X[start : start + rows] @ w.T).mean(axis=1)
        correct += int(jnp.sum((probability > 0.5) == y[start : start + rows]))
    return correct / len(X)


def held_out_log_likelihood(draws: jax.Array, X: ArrayLike, y: ArrayLike) -> np.ndarray:
    """The log-likelihood of all of ``(X, y)`` at each draw ``(chains, draws, d)``, one chain at a time."""
    sign = jnp.where(jnp.asarray(y) == 1, 1.0, -1.0)
    return np.stack([np.asarray(jnp.sum(jax.nn.log_sigmoid(sign * (chain @ X.T)), axis=-1)) for chain in draws])


def loo(idata: Any, observations: int = 2048) -> Any:
    """``arviz.loo(idata, pointwise=True)``, the same numbers, computed ``observations`` data points at a time.

    ``arviz.loo`` holds several transformed copies of the whole pointwise log-likelihood at once (1 GB each here:
    the job's peak memory, about 4 GB); PSIS smooths each data point's importance ratios on its own, so chunks of
    data points give the same pointwise values, and the totals are summed over all of them at once, as ArviZ sums
    them. The relative efficiency ``reff`` is ArviZ's, from the posterior."""
    import arviz as az
    import xarray as xr
    from arviz.stats.stats_utils import ELPDData, logsumexp, wrap_xarray_ufunc

    (name,) = idata.log_likelihood.data_vars
    log_likelihood = idata.log_likelihood[name]
    (dim,) = [d for d in log_likelihood.dims if d not in ("chain", "draw")]
    n_samples = log_likelihood.sizes["chain"] * log_likelihood.sizes["draw"]
    ess = az.ess(idata.posterior, method="mean")  # arviz.loo's reff (more than one chain)
    reff = np.hstack([ess[v].values.flatten() for v in ess.data_vars]).mean() / n_samples
    loo_i, pareto_k, lppd_i, caught = [], [], [], {}
    for start in range(0, log_likelihood.sizes[dim], observations):
        chunk = log_likelihood.isel({dim: slice(start, start + observations)})
        with warnings.catch_warnings(record=True) as raised:  # ArviZ's warnings: each once, below
            warnings.simplefilter("always")
            part = az.loo(az.InferenceData(log_likelihood=chunk.to_dataset()), pointwise=True, reff=reff)
        caught.update({(str(w.message), w.category): None for w in raised})
        loo_i.append(part.loo_i)
        pareto_k.append(part.pareto_k)
        lppd_i.append(wrap_xarray_ufunc(  # arviz.loo's lppd, per data point
            logsumexp, chunk.stack(__sample__=("chain", "draw")), func_kwargs={"b_inv": n_samples},
            ufunc_kwargs={"n_dims": 1, "ravel": False}, input_core_dims=[["__sample__"]],
        ).values)  # fmt: skip
        del chunk, part
    loo_i, pareto_k = xr.concat(loo_i, dim), xr.concat(pareto_k, dim)
    elpd = loo_i.values.sum()
    se = (loo_i.size * np.var(loo_i.values)) ** 0.5
    p_loo = np.sum(np.concatenate(lppd_i)) - elpd
    for message, category in caught:
        warnings.warn(message, category, stacklevel=2)
    good_k = min(1 - 1 / np.log10(n_samples), 0.7)
    return ELPDData(
        data=[elpd, se, p_loo, n_samples, loo_i.size, bool(np.any(pareto_k.values > good_k)), loo_i, pareto_k, "log",
              good_k],  # fmt: skip
        index=["elpd_loo", "se", "p_loo", "n_samples", "n_data_points", "warning", "loo_i", "pareto_k", "scale",
               "good_k"],  # fmt: skip
    )


def main(argv: Sequence[str] | None = None) -> None:
    """The command line (``python -m models.logistic_regression --help``)."""
    import arviz as az
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ppl_sgmcmc import numpyro as sg

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel", choices=["SGNHT", "SGHMC"], default="SGNHT")
    parser.add_argument("--integrator", choices=["splitting", "euler"], default="splitting")
    parser.add_argument("--step-size", type=float, default=None,
                        help="a fixed step size (default: tuned during the warm-up)")
    parser.add_argument("--diagonal-mass", action="store_true",
                        help="a diagonal preconditioner instead of the dense one")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--num-warmup", type=int, default=20_000, help="warm-up steps")
    parser.add_argument("--num-samples", type=int, default=600_000, help="steps after the warm-up")
    parser.add_argument("--thinning", type=int, default=300,
                        help="keep every k-th step (the kernel's steps_per_sample); --num-warmup and "
                             "--num-samples count steps and are rounded down to multiples of k")
    parser.add_argument("--num-chains", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("outputs"))
    parser.add_argument("--log-likelihood", action="store_true",
                        help="also write the pointwise log-likelihood on the training data (chains × draws × 32561 "
                             "float32, ~0.8 GB compressed; the PSIS-LOO printed is computed from it either way)")
    args = parser.parse_args(argv)

    X, y, X_test, y_test = load_a9a()
    print(f"a9a: {X.shape[0]} training rows, {X_test.shape[0]} test rows, {X.shape[1]} features")
    # thinning inside the kernel: the same steps and draws as MCMC(thinning=k), with one pass of
    # numpyro's progress-bar loop per kept draw instead of per step
    options = {"adapt_mass_matrix": True, "dense_mass": not args.diagonal_mass}
    kernel = getattr(sg, args.kernel)(
        model, step_size=args.step_size, integrator=args.integrator, steps_per_sample=args.thinning, **options
    )
    mcmc = sg.MCMC(  # NumPyro's MCMC, with the end-of-run verdict (ppl_sgmcmc.verdict)
        kernel,
        num_warmup=args.num_warmup // args.thinning,
        num_samples=args.num_samples // args.thinning,
        num_chains=args.num_chains,
        chain_method="vectorized",
    )
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(args.seed), X, y, batch_size=args.batch_size, extra_fields=("potential_energy",))
    w = mcmc.get_samples()["w"].block_until_ready()
    seconds = time.perf_counter() - start

    accuracy = predictive_accuracy(w, X_test, y_test)
    paper = PAPER_ACCURACY[(args.kernel, args.integrator)]
    steps = ", ".join(f"{h:.3g}" for h in jnp.atleast_1d(mcmc.last_state.step_size).tolist())
    ratio = mcmc.get_extra_fields()["noise_ratio"]
    label = f"{args.kernel}-{args.integrator}, minibatch {args.batch_size}"
    print(f"\n{label}: {seconds:.1f} s for {args.num_chains} chains × {args.num_warmup + args.num_samples} steps")
    tuned = "given" if args.step_size is not None else "tuned in the warm-up"
    print(f"step size per chain ({tuned}): {steps}; noise ratio median {float(jnp.median(ratio)):.2f}")
    print(f"test accuracy {accuracy:.2%}   (Li et al. 2016, Table 2: {paper:.2%})")
    print(f"rejected non-finite steps: {int(mcmc.last_state.num_diverging.sum())}")
    verdict = mcmc.last_verdict
    print(f"verdict: {'passed' if verdict.ok else 'FAILED'} (largest R-hat {verdict.rhat:.3f} on {verdict.rhat_of}, "
          f"smallest ESS bulk {verdict.ess_bulk:.0f} / tail {verdict.ess_tail:.0f}, drift {verdict.drift:.2f} s.e.)")

    idata = sg.to_inference_data(mcmc)
    summary = az.summary(idata, var_names=["w"])
    print("\nArviZ summary, first 8 of 123 weights:")
    print(summary.head(8).to_string())
    print(f"over all weights: min ess_bulk {summary.ess_bulk.min():.0f}, max r_hat {summary.r_hat.max():.3f}")
    # what the data identify, the predictions: their convergence too
    draws = mcmc.get_samples(group_by_chain=True)["w"]
    test_lpd = az.convert_to_dataset({"test_log_likelihood": held_out_log_likelihood(draws, X_test, y_test)})
    print(
        "test-set log-likelihood per draw (identified by the data): "
        f"r_hat {float(az.rhat(test_lpd).test_log_likelihood):.3f}, "
        f"ess_bulk {float(az.ess(test_lpd).test_log_likelihood):.0f}"
    )
    print("\nPSIS-LOO on the full training data:")
    print(loo(idata))

    args.out.mkdir(parents=True, exist_ok=True)
    netcdf = args.out / "logistic_regression_a9a.nc"
    log_likelihood = idata.log_likelihood if args.log_likelihood else None
    del idata.log_likelihood  # 1 GB: the posterior, sample stats and observed data are a few MB
    idata.to_netcdf(netcdf)
    if log_likelihood is not None:  # float32, bytes shuffled before zlib: 0.8 GB, against 0.97 GB with zlib alone
        encoding = {name: {"zlib": True, "complevel": 4, "shuffle": True} for name in log_likelihood.data_vars}
        log_likelihood.to_netcdf(netcdf, mode="a", group="log_likelihood", engine="h5netcdf", encoding=encoding)
        del log_likelihood
    az.plot_trace(idata, var_names=["w"], coords={"w_dim_0": [0, 1, 2, 3]}, compact=False)
    plt.tight_layout()
    png = args.out / "logistic_regression_a9a_trace.png"
    plt.savefig(png, dpi=80)
    print(f"\nwrote {netcdf} ({netcdf.stat().st_size / 2**20:.0f} MiB) and {png}")


if __name__ == "__main__":
    main()
