#!/usr/bin/env python
"""Bayesian neural networks on MNIST: three experiments of the SG-MCMC papers, with the models of
``models/bnn.py`` (NumPyro) and ``models/bnn_pyro.py`` (Pyro).

``fig4``
    Li, Chen, Fan & Carin, "High-Order Stochastic Gradient Thermostats for Bayesian Learning of Deep Models"
    (AAAI 2016), Fig. 4: mSGNHT with the symmetric-splitting integrator (mSGNHT-S) against Euler (mSGNHT-E) on
    ReLU networks of 100 units per hidden layer, depths 2, 3 and 4 (layers of weights: 1, 2 and 3 hidden layers),
    ``D = 5``, ``h = 1e-4`` halved at epoch 20, minibatch 100, ``N(0, 1)`` priors. Test accuracy of the model
    average of the draws so far (one draw per epoch) and the training NLL of the last draw, per epoch.
``santa``
    Chen, Carlson, Gan, Li & Carin, "Bridging the Gap between Stochastic Gradient MCMC and Stochastic
    Optimization" (AISTATS 2016), Table 2 (FNN-400: two hidden layers of 400 ReLU units): Santa, SGLD and
    mSGNHT-S through ``MCMC`` and Adam and RMSprop (optax, on the same minibatch potential divided by ``N``)
    for the same number of minibatch gradients, each at the step sizes of :data:`SANTA_GRID`, on the training
    images less the last 10 %; each method's step size is the one with the lowest error on those 10 %, and
    its test error is reported: that of the model average of the draws kept (one per epoch after the first
    half; Santa: its last point, the mode it estimates; optimisers: the last iterate).
``speed``
    One SGLD step of FNN-400 on MNIST (d = 478 410, minibatch 100) through ``MCMC`` against a hand-written
    ``lax.scan`` (NumPyro) and a hand-written torch loop (Pyro) doing the same gradient work (draw 100 indices,
    the gradient of the subsampled potential ``-log p(θ) - (N/n) Σ log p(y_i | x_i, θ)``, the SGLD update),
    timed side by side in one process after a compiled warm-up, alternating, per step as the difference between
    runs of 2S and S steps (per-run costs cancel; the NumPyro ``MCMC`` runs continue the chain from its last state,
    as a resumed run does); ratio = hand-written time / ``MCMC`` time.

Data: ``../shared/data/mnist/mnist.npz`` (60 000 / 10 000 images, pixels / 255). Usage (repository root)::

    .venv/bin/python -m benchmarks.bnn_mnist --part fig4 --epochs 40      # the paper's 24 000 steps
    .venv/bin/python -m benchmarks.bnn_mnist --part santa --epochs 10
    .venv/bin/python -m benchmarks.bnn_mnist --part speed            # NumPyro; --part speed-pyro: Pyro
    .venv/bin/python -m benchmarks.bnn_mnist --part fig4 --epochs 4 --rows 10000   # a subset, on 2 shared cores
    .venv/bin/python -m benchmarks.bnn_mnist --quick          # every part, 1 epoch on a 6000-image subset

Writes ``benchmarks/results/bnn_mnist_<part>.json`` and the plot ``benchmarks/results/bnn_mnist_fig4.png``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from numpyro.infer import MCMC, init_to_uniform

import ppl_sgmcmc.numpyro
from models import bnn
from models.datasets import load_mnist
from ppl_sgmcmc.numpyro import SGLD, SGNHT, Santa
from ppl_sgmcmc.rules.santa import annealing

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "mnist" / "mnist.npz"
RESULTS = Path(__file__).resolve().parent / "results"
BATCH = 100
ROUNDS = 3  # timing rounds of the speed part
ROWS = 60000  # training images used (--rows)
INIT = init_to_uniform(radius=0.1)  # small weights: U(-2, 2) (NumPyro's default) saturates a 784-input layer


def _data(quick: bool):
    X, y, X_test, y_test = load_mnist(DATA)
    rows = 6000 if quick else ROWS
    return X[:rows], y[:rows], X_test[: 2000 if quick else None], y_test[: 2000 if quick else None]


def _accuracy(samples, X, y) -> float:
    return float((bnn.predict_proba(samples, X).argmax(-1) == y).mean())


def _nll(samples, X, y) -> float:
    probabilities = bnn.predict_proba(samples, X)
    return float(-jnp.mean(jnp.log(probabilities[jnp.arange(len(y)), y] + 1e-12)))


def _draws(samples, start, stop):
    """The draws ``start:stop`` of every site."""
    return {name: value[start:stop] for name, value in samples.items()}


def _run(kernel, X, y, epochs, hidden, seed=0):
    """One draw per epoch (``steps_per_sample`` = steps per epoch), no warm-up draws; returns samples and seconds."""
    mcmc = MCMC(kernel, num_warmup=0, num_samples=epochs, progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), X, y, hidden=hidden, batch_size=BATCH)
    jax.block_until_ready(mcmc.get_samples())
    return mcmc.get_samples(), time.perf_counter() - start


def fig4(epochs: int, quick: bool) -> dict:
    X, y, X_test, y_test = _data(quick)
    per_epoch = X.shape[0] // BATCH
    halve = 20 * per_epoch

    def step_size(t):
        return jnp.where(t < halve, 1e-4, 5e-5)

    out = {"epochs": epochs, "train_rows": int(X.shape[0]), "runs": {}}
    for depth in (2, 3, 4):
        hidden = (100,) * (depth - 1)
        for integrator in ("splitting", "euler"):
            kernel = SGNHT(bnn.classifier, step_size=step_size, diffusion=5.0, integrator=integrator,
                           steps_per_sample=per_epoch, init_strategy=INIT)  # fmt: skip
            samples, seconds = _run(kernel, X, y, epochs, hidden)
            accuracy = [_accuracy(_draws(samples, 0, e + 1), X_test, y_test) for e in range(epochs)]
            nll = [_nll(_draws(samples, e, e + 1), X, y) for e in range(epochs)]
            out["runs"][f"depth{depth}-{integrator}"] = {"test_accuracy": accuracy, "train_nll": nll, "seconds": seconds}
            print(f"depth {depth} {integrator:9s} acc {accuracy[-1]:.4f} nll {nll[-1]:.4f} ({seconds:.0f} s)", flush=True)
    _plot_fig4(out)
    return out


def _plot_fig4(out: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(12, 6), sharex=True)
    for column, depth in enumerate((2, 3, 4)):
        for integrator, style in (("splitting", "-"), ("euler", "--")):
            run = out["runs"][f"depth{depth}-{integrator}"]
            epochs = np.arange(1, len(run["test_accuracy"]) + 1)
            label = "mSGNHT-S" if integrator == "splitting" else "mSGNHT-E"
            axes[0, column].plot(epochs, run["test_accuracy"], style, marker="o", label=label)
            axes[1, column].plot(epochs, run["train_nll"], style, marker="o", label=label)
        axes[0, column].set_title(f"depth {depth} (ReLU, 100 units)")
        axes[1, column].set_xlabel("epoch")
    axes[0, 0].set_ylabel("test accuracy (model average)")
    axes[1, 0].set_ylabel("training NLL (last draw)")
    axes[0, 0].legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "bnn_mnist_fig4.png", dpi=100)


#: The step sizes (optimisers: learning rates) each method of the Santa table tries; the one with the lowest
#: validation error is reported (Santa's ``h`` is the square root of the paper's learning rate ``η``).
SANTA_GRID = {
    "Santa": (1e-4, 3e-5, 1e-5),
    "SGLD": (1e-5, 3e-6, 1e-6),
    "mSGNHT-S": (1e-4, 3e-5, 1e-5),
    "Adam": (1e-3, 3e-4, 1e-4),
    "RMSprop": (1e-3, 3e-4, 1e-4),
}


def santa(epochs: int, quick: bool) -> dict:
    """The Santa table: every method at every step size of :data:`SANTA_GRID` for ``epochs`` epochs on the
    training images less the last 10 %, which choose each method's step size (validation error); the test
    error is that of the chosen run."""
    X, y, X_test, y_test = _data(quick)
    split = X.shape[0] * 9 // 10
    X, y, X_valid, y_valid = X[:split], y[:split], X[split:], y[split:]
    per_epoch = X.shape[0] // BATCH
    hidden = (400, 400)
    kept = max(1, epochs // 2)
    out = {"epochs": epochs, "train_rows": int(X.shape[0]), "validation_rows": int(X_valid.shape[0]), "runs": {}}

    def samplers(h):
        return {
            "Santa": Santa(bnn.classifier, step_size=h, inverse_temperature=annealing(), num_exploration=per_epoch * kept,
                           steps_per_sample=per_epoch, init_strategy=INIT),  # fmt: skip
            "SGLD": SGLD(bnn.classifier, step_size=h, steps_per_sample=per_epoch, init_strategy=INIT),
            "mSGNHT-S": SGNHT(bnn.classifier, step_size=h, steps_per_sample=per_epoch, init_strategy=INIT),
        }

    for name, grid in SANTA_GRID.items():
        for h in grid:
            if name in ("Adam", "RMSprop"):
                optimiser = {"Adam": optax.adam, "RMSprop": optax.rmsprop}[name](h)
                estimate, seconds = _optimise(optimiser, X, y, epochs * per_epoch, hidden)
            else:
                samples, seconds = _run(samplers(h)[name], X, y, epochs, hidden)
                # Santa: its last point, the mode it estimates; samplers: the model average of the kept draws
                estimate = _draws(samples, epochs - (1 if name == "Santa" else kept), epochs)
            run = {"method": name, "step_size": h, "seconds": seconds,
                   "validation_error": 1 - _accuracy(estimate, X_valid, y_valid),
                   "test_error": 1 - _accuracy(estimate, X_test, y_test)}  # fmt: skip
            out["runs"][f"{name}@{h:g}"] = run
            print(f"{name:9s} h {h:g}: validation error {run['validation_error']:.4f}, test error "
                  f"{run['test_error']:.4f} ({seconds:.0f} s)", flush=True)  # fmt: skip
    out["chosen"] = {
        name: min((r for r in out["runs"].values() if r["method"] == name), key=lambda r: r["validation_error"])
        for name in SANTA_GRID
    }
    for name, run in out["chosen"].items():
        print(f"{name:9s} chosen h {run['step_size']:g}: test error {run['test_error']:.4f}", flush=True)
    return out


def _log_posterior_per_datum(params, Xb, yb, size):
    """``(log p(θ) + (N/n) Σ log p(y_i | x_i, θ)) / N``: the optimisers' objective (the same potential / N)."""
    log_prior = sum(jnp.sum(-0.5 * w**2) for w in jax.tree.leaves(params))
    log_lik = jnp.sum(jax.nn.log_softmax(bnn.forward(params, Xb))[jnp.arange(yb.shape[0]), yb])
    return (log_prior + size / yb.shape[0] * log_lik) / size


def _init_params(key, sizes):
    params = {}
    for layer, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        key, k1, k2 = jax.random.split(key, 3)
        params[f"layers.{layer}.weight"] = jax.random.uniform(k1, (b, a), minval=-0.1, maxval=0.1)
        params[f"layers.{layer}.bias"] = jax.random.uniform(k2, (b,), minval=-0.1, maxval=0.1)
    return params


def _optimise(optimiser, X, y, steps, hidden):
    X, y = jnp.asarray(X), jnp.asarray(y)
    params = _init_params(jax.random.PRNGKey(0), bnn.layer_sizes(X.shape[1], hidden, 10))

    def body(carry, key):
        params, state = carry
        idx = jax.random.randint(key, (BATCH,), 0, X.shape[0])
        grads = jax.grad(lambda p: -_log_posterior_per_datum(p, X[idx], y[idx], X.shape[0]))(params)
        updates, state = optimiser.update(grads, state, params)
        return (optax.apply_updates(params, updates), state), None

    run = jax.jit(lambda p, keys: jax.lax.scan(body, (p, optimiser.init(p)), keys)[0][0])
    start = time.perf_counter()
    params = jax.block_until_ready(run(params, jax.random.split(jax.random.PRNGKey(1), steps)))
    return jax.tree.map(lambda a: a[None], params), time.perf_counter() - start


def hand_sgld_step(X, y, h: float):
    """A hand-written SGLD step ``(params, key) -> params`` on FNN weights (a dict of arrays): ``randint``
    indices, the gradient of ``-log p(θ) - (N/n) Σ log p(y_i | x_i, θ)``, ``θ - h ∇ + sqrt(2h) ξ`` leaf by leaf."""
    size = X.shape[0]

    def step(params, key):
        k_idx, k_noise = jax.random.split(key)
        idx = jax.random.randint(k_idx, (BATCH,), 0, size)
        grads = jax.grad(lambda p: -size * _log_posterior_per_datum(p, X[idx], y[idx], size))(params)
        leaves, tree = jax.tree.flatten(params)
        noise = [jax.random.normal(k, a.shape) for k, a in zip(jax.random.split(k_noise, len(leaves)), leaves)]
        return jax.tree.map(lambda p, g, e: p - h * g + jnp.sqrt(2 * h) * e, params, grads, tree.unflatten(noise))

    return step


def speed(quick: bool, steps: int) -> dict:
    """Seconds per step, ``MCMC`` and hand-written ``lax.scan``, NumPyro, FNN-400, minibatch 100."""
    X, y, _, _ = _data(quick)
    X, y = jnp.asarray(X), jnp.asarray(y)
    hidden, h = (400, 400), 1e-5
    out = {"steps": steps, "d": bnn.num_weights(784, hidden, 10), "numpyro": {}}
    # --- NumPyro: MCMC with steps_per_sample = steps and 1 or 2 draws, against the hand-written scan.
    # MCMC's per-run start (kernel.init: the model's trace, the first gradient) is not a per-step cost: each timed
    # run continues the chain from the last state (`post_warmup_state`), as a resumed run does. NumPyro traces and
    # compiles its loop again at every run; with JAX's persistent compilation cache (a temporary directory) the
    # compilation is read back, and the trace costs the same for 1 and 2 draws, so it cancels in the difference
    jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp())
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    model = partial(bnn.classifier, hidden=hidden, batch_size=BATCH)  # shapes by closure: jit_model_args below
    kernel = SGLD(model, step_size=h, steps_per_sample=steps, init_strategy=INIT)
    # ppl_sgmcmc's MCMC: under numpyro.infer.MCMC the loop holds the health report's host callback, which JAX
    # does not persist
    mcmc = ppl_sgmcmc.numpyro.MCMC(kernel, num_warmup=0, num_samples=1, progress_bar=False, jit_model_args=True)
    mcmc.run(jax.random.PRNGKey(1), X, y)

    def mcmc_steps(count):
        mcmc.num_samples = count
        mcmc.post_warmup_state = mcmc.last_state
        mcmc.run(mcmc.last_state.rng_key, X, y)
        jax.block_until_ready(mcmc.get_samples())

    step = hand_sgld_step(X, y, h)
    scan = jax.jit(lambda p, keys: jax.lax.scan(lambda p, k: (step(p, k), None), p, keys)[0])
    params = _init_params(jax.random.PRNGKey(0), bnn.layer_sizes(784, hidden, 10))

    def scan_steps(count):
        jax.block_until_ready(scan(params, jax.random.split(jax.random.PRNGKey(2), count * steps)))

    for count in (1, 2):  # compile
        mcmc_steps(count)
        scan_steps(count)
    compiles = _count_compiles()
    # alternate the two, ROUNDS times each, and keep each one's fastest: on a shared machine the other jobs'
    # load then hits both alike
    out["numpyro"] = _alternate({"mcmc_s_per_step": mcmc_steps, "scan_s_per_step": scan_steps}, steps)
    out["numpyro"]["ratio"] = out["numpyro"]["scan_s_per_step"] / out["numpyro"]["mcmc_s_per_step"]
    out["numpyro"]["compilations_while_timed"] = compiles["compiles"]
    print("numpyro", out["numpyro"], flush=True)
    return out


def _count_compiles() -> dict[str, int]:
    """A counter of the compilations the persistent cache did not have, from now on (``jax.monitoring``):
    ``{"compiles": n}``."""
    counts = {"compiles": 0}

    def listener(event: str, **_) -> None:
        if event == "/jax/compilation_cache/cache_misses":
            counts["compiles"] += 1

    jax.monitoring.register_event_listener(listener)
    return counts


def speed_pyro(quick: bool, steps: int) -> dict:
    """:func:`speed`'s comparison on the Pyro backend (a part of its own, so that each fits a time limit)."""
    X, y, _, _ = _data(quick)
    out = {"steps": steps, "d": bnn.num_weights(784, (400, 400), 10), "pyro": _speed_pyro(X, y, (400, 400), 1e-5, steps)}
    print("pyro", out["pyro"], flush=True)
    return out


def _alternate(runs: dict, steps: int) -> dict[str, float]:
    """Seconds per step of each ``runs[label](count)`` (``count`` = 1 or 2 blocks of ``steps`` steps): the
    difference of the two, so that per-run costs cancel; the runs alternate, :data:`ROUNDS` times, and each
    keeps its fastest, so that a shared machine's load hits all alike."""
    times: dict[str, dict[int, float]] = {label: {1: float("inf"), 2: float("inf")} for label in runs}
    for _ in range(ROUNDS):
        for label, fn in runs.items():
            for count in (1, 2):
                start = time.perf_counter()
                fn(count)
                times[label][count] = min(times[label][count], time.perf_counter() - start)
    return {label: (t[2] - t[1]) / steps for label, t in times.items()}


def _speed_pyro(X, y, hidden, h, steps) -> dict:
    import pyro
    import torch
    from pyro.infer import MCMC as PyroMCMC
    from pyro.infer.autoguide import init_to_uniform as pyro_init_to_uniform

    from models import bnn_pyro
    from ppl_sgmcmc.pyro import SGLD as PyroSGLD

    Xt, yt = torch.as_tensor(X), torch.as_tensor(y).long()
    size = Xt.shape[0]
    pyro.set_rng_seed(0)
    model = bnn_pyro.BNNClassifier(784, hidden=hidden, batch_size=BATCH)

    def run_mcmc(count):
        kernel = PyroSGLD(model, step_size=h, steps_per_sample=count, init_strategy=pyro_init_to_uniform(radius=0.1))
        PyroMCMC(kernel, warmup_steps=0, num_samples=1, disable_progbar=True).run(Xt, yt)

    sizes = bnn.layer_sizes(784, hidden, 10)
    params = [torch.empty(b, a).uniform_(-0.1, 0.1) for a, b in zip(sizes[:-1], sizes[1:])]
    params = [t for w in params for t in (w, torch.empty(w.shape[0]).uniform_(-0.1, 0.1))]
    names = [f"layers.{layer}.{kind}" for layer in range(len(sizes) - 1) for kind in ("weight", "bias")]

    def run(count):
        flat = torch.cat([p.ravel() for p in params])
        shapes = [p.shape for p in params]
        numels = [p.numel() for p in params]
        for _ in range(count):
            theta = flat.detach().requires_grad_()
            parts = {n: t.view(s) for n, t, s in zip(names, theta.split(numels), shapes)}
            idx = torch.randint(0, size, (BATCH,))
            log_lik = torch.log_softmax(bnn_pyro.forward(parts, Xt[idx]), -1)[torch.arange(BATCH), yt[idx]].sum()
            energy = 0.5 * (theta * theta).sum() - size / BATCH * log_lik
            (grad,) = torch.autograd.grad(energy, theta)
            flat = (theta - h * grad + (2 * h) ** 0.5 * torch.randn_like(theta)).detach()
        return flat

    run_mcmc(20)  # traces and compiles the potential (each new kernel traces again: a per-run cost, cancelled below)
    run(20)
    out = _alternate({"mcmc_s_per_step": lambda count: run_mcmc(count * steps),
                      "loop_s_per_step": lambda count: run(count * steps)}, steps)  # fmt: skip
    out["ratio"] = out["loop_s_per_step"] / out["mcmc_s_per_step"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("fig4", "santa", "speed", "speed-pyro", "all"), default="all")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--speed-steps", type=int, default=500)
    parser.add_argument("--rows", type=int, default=60000, help="the first ROWS training images (default: all)")
    parser.add_argument("--quick", action="store_true", help="1 epoch on 6000 training images; 100 speed steps")
    args = parser.parse_args()
    global ROWS
    ROWS = args.rows
    epochs = 1 if args.quick else args.epochs
    steps = 100 if args.quick else args.speed_steps
    RESULTS.mkdir(exist_ok=True)
    suffix = "_quick" if args.quick else ""
    meta = {"jax_backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()]}
    parts = ("fig4", "santa", "speed", "speed-pyro") if args.part == "all" else (args.part,)
    for part in parts:
        runs = {"fig4": lambda: fig4(epochs, args.quick), "santa": lambda: santa(epochs, args.quick),
                "speed": lambda: speed(args.quick, steps), "speed-pyro": lambda: speed_pyro(args.quick, steps)}  # fmt: skip
        result = runs[part]()
        result["train_rows"] = 6000 if args.quick else ROWS
        (RESULTS / f"bnn_mnist_{part}{suffix}.json").write_text(json.dumps({**meta, **result}, indent=1))


if __name__ == "__main__":
    main()
