#!/usr/bin/env python
"""SGFS on MNIST 7-vs-9 logistic regression (Ahn, Korattikara & Welling, "Bayesian
Posterior Sampling via Stochastic Gradient Fisher Scoring", ICML 2012, §5.1).

Errors of the running mean and covariance against a full-data NUTS run, as a function of wall-clock
sampling time, for SGFS-f, SGFS-d and SGLD (the paper's relative errors E1 of the mean and E2 of the covariance)::

    E1(t) = Σ_i |mean_i(t) - mean*_i| / Σ_i |mean*_i|,   E2(t) = Σ_ij |C_ij(t) - C*_ij| / Σ_ij |C*_ij|

Problem (the paper's where it says, our choice where it does not):

* data: the training images of digits 7 (y = 0) and 9 (y = 1) in ``../shared/data/mnist/mnist.npz``,
  the first ``N = 10000`` of them (the paper's "10,000 data-items"); benchmarks read the shared data,
  it is not shipped;
* features: pixels / 255 times a fixed Gaussian random projection ``784 -> 50`` (seed 0), each
  projected feature standardised (ours: the paper does not give its scaling), plus an intercept:
  ``d = 51`` (the paper's "51 parameters");
* prior: ``w ~ N(0, 1/λ)`` with ``λ = 1`` on all 51 weights; minibatch ``n = 500`` (paper: 300-500);
* gold standard: NumPyro NUTS (dense mass) on the full data. Its own Monte Carlo error is reported as
  E1/E2 between the two halves of its draws (the floor below which nothing here can be resolved: the
  errors of a sampler against the reference include roughly that much of the reference's own noise).

Samplers, each from ``w = 0`` with the paper's 3000 burn-in steps (SGFS: its warm-up, with the Fisher
average forgetting over ``fisher_window`` steps), then sampling for the same wall-clock budget:

* SGFS-f, ``α = 0`` (``B = γ N Î``, the paper's ``B = γ I_N``; no injected noise, the fastest mixing);
* SGFS-d, ``α = 0``;
* SGLD at a few fixed step sizes ``h`` (the library's ``h``; the paper's SGLD ``ε = 2h``).

Every step is collected (no thinning). Timing: each sampler's burn-in and sampling loop are
``lax.scan`` loops over the kernel's own ``sample`` (``kernel.init`` then ``kernel.sample``, what
``numpyro.infer.MCMC`` runs), compiled ahead of time; the clock runs over the sampling chunks only
(each chunk's device time plus copying its draws to the host and updating the float64 running sums),
so compilation (reported) is excluded and all samplers are charged alike.

Usage (from the repository root)::

    PYTHONPATH=. .venv/bin/python benchmarks/sgfs_mnist.py            # ~3 min on 2 shared CPU cores
    PYTHONPATH=. .venv/bin/python benchmarks/sgfs_mnist.py --quick    # smoke run, ~40 s (a 900-draw NUTS reference)
    PYTHONPATH=. .venv/bin/python benchmarks/sgfs_mnist.py --budget 60 --nuts-samples 8000

Writes ``benchmarks/results/sgfs_mnist.png`` (E1, E2 against sampling seconds) and prints a Markdown
table for ``RESULTS.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see the SGFS docstring's CPU note

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from jax import lax, random  # noqa: E402
from numpyro.infer import MCMC, NUTS  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ppl_sgmcmc.numpyro import SGFS, SGLD  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MNIST = os.path.join(HERE, "..", "..", "shared", "data", "mnist", "mnist.npz")
PROJECTION_DIM = 50
LAMBDA = 1.0  # prior precision
BATCH = 500
BURN_IN = 3000
CHUNK = 500  # steps per compiled loop call (burn-in = 6 calls)


def load_data(path, num_data):
    path = os.path.abspath(path)
    if not os.path.exists(path):
        raise SystemExit(
            f"sgfs_mnist: MNIST not found at {path}. The benchmark reads the shared data set "
            "(../shared/data/mnist/mnist.npz relative to the repository: keys x_train (60000, 28, 28) uint8 and "
            "y_train); pass --data PATH to use another copy."
        )
    with np.load(path) as f:
        images, labels = f["x_train"], f["y_train"]
    keep = (labels == 7) | (labels == 9)
    images, labels = images[keep][:num_data], labels[keep][:num_data]
    pixels = images.reshape(len(images), -1).astype(np.float64) / 255.0
    projection = np.random.default_rng(0).normal(size=(pixels.shape[1], PROJECTION_DIM)) / np.sqrt(pixels.shape[1])
    features = pixels @ projection
    features = (features - features.mean(0)) / features.std(0)
    X = np.hstack([features, np.ones((len(features), 1))]).astype(np.float32)
    y = (labels == 9).astype(np.float32)
    return jnp.asarray(X), jnp.asarray(y)


def model(X, y, batch=None):
    w = numpyro.sample("w", dist.Normal(0.0, LAMBDA**-0.5).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=batch):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0)
        numpyro.sample("y", dist.Bernoulli(logits=Xb @ w), obs=yb)


def errors(mean, cov, ref_mean, ref_cov):
    e1 = np.sum(np.abs(mean - ref_mean)) / np.sum(np.abs(ref_mean))
    e2 = np.sum(np.abs(cov - ref_cov)) / np.sum(np.abs(ref_cov))
    return e1, e2


def gold_standard(X, y, num_warmup, num_samples, seed=1):
    mcmc = MCMC(NUTS(model, dense_mass=True), num_warmup=num_warmup, num_samples=num_samples, progress_bar=False)
    start = time.perf_counter()
    mcmc.run(random.PRNGKey(seed), X, y, extra_fields=("num_steps",))
    w = np.asarray(mcmc.get_samples()["w"], np.float64)
    seconds = time.perf_counter() - start
    steps = np.asarray(mcmc.get_extra_fields()["num_steps"])
    ess = numpyro.diagnostics.effective_sample_size(w[None])
    half = len(w) // 2
    floor = errors(w[:half].mean(0), np.cov(w[:half].T, bias=True), w[half:].mean(0), np.cov(w[half:].T, bias=True))
    return dict(w=w, seconds=seconds, mean_steps=float(steps.mean()), ess_min=float(ess.min()),
                ess_median=float(np.median(ess)), floor=floor)  # fmt: skip


class RunningMoments:
    """Float64 sums of ``w - shift`` and its outer products, updated chunk by chunk."""

    def __init__(self, shift):
        self.shift, self.n = shift, 0
        self.s1 = np.zeros_like(shift)
        self.s2 = np.zeros((len(shift), len(shift)))

    def add(self, draws):
        x = np.asarray(draws, np.float64) - self.shift
        self.n += len(x)
        self.s1 += x.sum(0)
        self.s2 += x.T @ x

    def moments(self):
        m = self.s1 / self.n
        return m + self.shift, self.s2 / self.n - np.outer(m, m)


def run_sampler(name, kernel, X, y, budget, ref_mean, ref_cov, num_points, seed=0):
    """Burn-in, then sampling chunks until ``budget`` seconds of sampling: the trajectory of (t, E1, E2)."""
    model_args = (X, y, BATCH)  # minibatches of n through the plate's subsample_size
    state = kernel.init(random.PRNGKey(seed), BURN_IN, None, model_args, {})
    d = ref_mean.shape[0]

    def scan(length, collect):  # collect: return the draws
        def chunk(state):
            def body(state, _):
                state = kernel.sample(state, model_args, {})
                return state, (state.z["w"] if collect else None)

            return lax.scan(body, state, None, length=length)

        return chunk

    t0 = time.perf_counter()
    chunk = jax.jit(scan(CHUNK, True)).lower(state).compile()  # one compiled loop for burn-in and sampling
    compile_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(BURN_IN // CHUNK):
        state, _ = chunk(state)
    jax.block_until_ready(state)
    burn_seconds = time.perf_counter() - t0
    rate = BURN_IN / burn_seconds
    marks = list(np.geomspace(budget / 200, budget, num_points))

    moments = RunningMoments(ref_mean)
    trajectory, elapsed, diverging = [], 0.0, 0
    while elapsed < budget:
        t0 = time.perf_counter()
        state, draws = chunk(state)
        moments.add(draws)
        elapsed += time.perf_counter() - t0
        if elapsed >= marks[0] or elapsed >= budget:
            while marks and marks[0] <= elapsed:
                marks.pop(0)
            trajectory.append((elapsed, moments.n, *errors(*moments.moments(), ref_mean, ref_cov)))
    diverging = int(state.num_diverging)
    mean, cov = moments.moments()
    finite = bool(np.all(np.isfinite(mean)))
    print(
        f"  {name:<22} compile {compile_seconds:5.1f} s, burn-in {burn_seconds:5.1f} s ({rate:,.0f} steps/s), "
        f"{moments.n:,} draws in {elapsed:5.1f} s ({moments.n / elapsed:,.0f} steps/s), "
        f"E1 {trajectory[-1][2]:.3f}, E2 {trajectory[-1][3]:.3f}, diverging {diverging}"
        + ("" if finite else ", NON-FINITE"),
        flush=True,
    )
    return dict(name=name, trajectory=np.array(trajectory), compile=compile_seconds, burn=burn_seconds,
                steps=moments.n, seconds=elapsed, diverging=diverging, d=d)  # fmt: skip


def samplers(args):
    yield "SGFS-f α=0", SGFS(model, alpha=0.0, fisher="full")
    yield "SGFS-d α=0", SGFS(model, alpha=0.0, fisher="diagonal")
    for h in args.sgld_steps:
        yield f"SGLD h={h:g}", SGLD(model, step_size=h)


def plot(results, gold, path, budget):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for column, (ax, label) in enumerate(zip(axes, ("E1 (mean)", "E2 (covariance)"))):
        for r in results:
            traj = r["trajectory"]
            ax.loglog(traj[:, 0], traj[:, 2 + column], label=r["name"], marker=".", ms=3)
        ax.axhline(gold["floor"][column], color="grey", ls="--", lw=1, label="NUTS half vs half")
        ax.set_xlabel("sampling wall-clock (s, after burn-in, compilation excluded)")
        ax.set_ylabel(label + " vs NUTS")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Logistic regression, MNIST 7 vs 9 (N={gold['N']}, d=51, n={BATCH}), budget {budget:g} s each")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small budgets and a short NUTS run")
    parser.add_argument("--budget", type=float, default=15.0, help="sampling seconds per sampler (default 15)")
    parser.add_argument("--num-data", type=int, default=10000)
    parser.add_argument("--nuts-warmup", type=int, default=500)
    parser.add_argument("--nuts-samples", type=int, default=10000)
    parser.add_argument("--sgld-steps", type=float, nargs="+", default=[3e-4, 1e-4, 3e-5])
    parser.add_argument("--points", type=int, default=40, help="error evaluations per sampler (log-spaced in time)")
    parser.add_argument("--data", default=MNIST)
    parser.add_argument("--nuts-cache", default=None, metavar="PREFIX",
                        help="save the NUTS draws to PREFIX.<settings>.npz and reuse them in later runs")
    parser.add_argument("--plot", default=os.path.join(HERE, "results", "sgfs_mnist.png"))
    args = parser.parse_args()
    if args.quick:
        args.budget, args.nuts_warmup, args.nuts_samples, args.points = 2.0, 300, 600, 10
        args.sgld_steps = args.sgld_steps[:1]
        args.plot = os.path.join(HERE, "results", "sgfs_mnist_quick.png")

    wall = time.perf_counter()
    X, y = load_data(args.data, args.num_data)
    print(f"MNIST 7 vs 9: N={X.shape[0]}, d={X.shape[1]}, n={BATCH}; jax {jax.__version__}, numpyro {numpyro.__version__}")
    cache = args.nuts_cache and f"{args.nuts_cache}.N{X.shape[0]}.w{args.nuts_warmup}.s{args.nuts_samples}.npz"
    if cache and os.path.exists(cache):
        with np.load(cache) as f:
            gold = {k: (f[k] if f[k].ndim else float(f[k])) for k in f.files}
        gold["floor"] = tuple(gold["floor"])
        print(f"  NUTS reference read from {cache} (its run took {gold['seconds']:.1f} s)")
    else:
        gold = gold_standard(X, y, args.nuts_warmup, args.nuts_samples)
        if cache:
            np.savez(cache, **gold)
    gold["N"] = X.shape[0]
    ref_mean, ref_cov = gold["w"].mean(0), np.cov(gold["w"].T, bias=True)
    print(
        f"  NUTS (dense mass) {args.nuts_warmup}+{args.nuts_samples}: {gold['seconds']:.1f} s, "
        f"{gold['mean_steps']:.1f} leapfrog steps/draw, ESS min {gold['ess_min']:.0f} median {gold['ess_median']:.0f}; "
        f"half-vs-half E1 {gold['floor'][0]:.4f}, E2 {gold['floor'][1]:.4f}; "
        f"|mean*| sum {np.abs(ref_mean).sum():.2f}, posterior sd range {np.sqrt(np.diag(ref_cov)).min():.3f}-"
        f"{np.sqrt(np.diag(ref_cov)).max():.3f}",
        flush=True,
    )
    results = []
    for name, kernel in samplers(args):
        results.append(run_sampler(name, kernel, X, y, args.budget, ref_mean, ref_cov, args.points))
    plot(results, gold, args.plot, args.budget)

    def at(traj, t, column):
        i = np.searchsorted(traj[:, 0], t)
        return traj[min(i, len(traj) - 1), column]

    marks = [args.budget / 10, args.budget / 3, args.budget]
    print()
    print("| sampler | steps/s | steps in budget | " + " | ".join(f"E1 @ {t:.3g} s" for t in marks) + " | "
          + " | ".join(f"E2 @ {t:.3g} s" for t in marks) + " | divergent steps |")  # fmt: skip
    print("|---|---:|---:|" + "---:|" * (2 * len(marks)) + "---:|")
    for r in results:
        traj = r["trajectory"]
        e1 = " | ".join(f"{at(traj, t, 2):.3f}" for t in marks)
        e2 = " | ".join(f"{at(traj, t, 3):.3f}" for t in marks)
        print(f"| {r['name']} | {r['steps'] / r['seconds']:,.0f} | {r['steps']:,} | {e1} | {e2} | {r['diverging']} |")
    print(f"| NUTS half vs half ({args.nuts_samples // 2} draws each) | | | {gold['floor'][0]:.3f} | | | "
          f"{gold['floor'][1]:.3f} | | | |")
    print(f"\nplot: {os.path.relpath(args.plot)}; total wall time {time.perf_counter() - wall:.0f} s")


if __name__ == "__main__":
    main()
