"""LDA test perplexity: SG-MCMC with a local Gibbs step vs collapsed Gibbs and online variational Bayes.

Paper 000 (Li et al., AAAI 2016), §5.1 / Table 1 and Fig. 3, on Blei's AP corpus instead of the ICML
abstracts (not available): an 80/20 split of the documents, K = 30 topics, α = 0.1, minibatches of 5
documents, D = 0.75 (thermostat diffusion of mSGNHT, friction of SGHMC), a few step sizes per method.

* mSGNHT-S, mSGNHT-E, SGHMC-S, SGHMC-E: paper 000's parametrisation ``θ_kw ~ N(0.1, 1)``, ``π ∝ |θ|``;
* SGRLD: the expanded mean ``θ_kw ~ Gamma(β, 1)``, ``π ∝ θ`` (Patterson & Teh 2013);
* ``METHOD@expanded`` (e.g. ``mSGNHT-S@expanded``): the momentum samplers on the expanded-mean model of
  SGRLD instead (sampled in ``log θ``, the Gamma prior's unconstrained space), to compare the samplers
  on one model;
* all of them: ``MCMC`` on ``models.lda.lda_model`` with the topic assignments as local Gibbs sites
  (``gibbs_sweeps`` burn-in + kept collapsed-Gibbs sweeps per step, started from ``make_gibbs_init``);
* baselines on the same split: collapsed Gibbs on the full training data from the PyPI package
  ``lda`` (its Cython sampler, driven iteration by iteration to snapshot posterior samples), and
  scikit-learn's ``LatentDirichletAllocation`` with ``learning_method="online"`` (Hoffman et al. 2010).

Every method is scored by the same function, ``models.lda.held_out_perplexity`` (document
completion, see ``models/lda.py``): the predictive probabilities of the held-out 20% of each test
document's tokens, averaged over the posterior samples of the second half of the run (online VB: its
final variational mean of the topics, a single point). The learning curve evaluates the same at
checkpoints, each from the samples of the second half of the run so far.

Run from the repository root (writes ``benchmarks/results/lda_<corpus>.json`` and a PNG)::

    python benchmarks/lda.py                       # AP, the full comparison
    python benchmarks/lda.py --corpus reuters --steps 2000 --gibbs-iterations 300   # smaller
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.infer import MCMC

# this file is named lda.py: keep its folder off the path so that `import lda` finds the PyPI package
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models import lda  # noqa: E402
from models.datasets import load_corpus  # noqa: E402

PAPER = {"mSGNHT-S": 939.67, "mSGNHT-E": 960.56, "SGHMC-S": 1004.73, "SGHMC-E": 1017.51, "SGRLD": 1154.68, "Gibbs": 907.84}
DEFAULT_STEP_SIZES = {
    "mSGNHT-S": (3e-2, 1e-2, 3e-3),
    "mSGNHT-E": (3e-2, 1e-2, 3e-3),
    "SGHMC-S": (3e-2, 1e-2, 3e-3),
    "SGHMC-E": (3e-2, 1e-2, 3e-3),
    "SGRLD": (3e-1, 1e-1, 3e-2),
}


def curve(probabilities, masks, checkpoints):
    """Perplexity at each checkpoint ``j`` (a number of samples) from the samples ``(j/2, j]``."""
    out = []
    for j in checkpoints:
        window = probabilities[j // 2 : j]
        mean = [np.mean([p[b] for p in window], axis=0) for b in range(len(masks))]
        out.append(lda.perplexity(mean, masks))
    return out


def evaluate(topic_samples, held_out, alpha, eval_sweeps, seed):
    accumulator = lda.PerplexityAccumulator(held_out, alpha, *eval_sweeps, seed=seed)
    return [accumulator.probabilities(t) for t in topic_samples]


def run_sgmcmc(method, step_size, data, args):
    name, _, parametrisation = method.partition("@")
    kernel, parametrisation = lda.make_kernel(
        name,
        step_size,
        data.train_words,
        data.train_mask,
        alpha=args.alpha,
        diffusion=args.diffusion,
        gibbs_sweeps=tuple(args.gibbs_sweeps),
        steps_per_sample=args.thin,
        parametrisation=parametrisation or None,
    )
    mcmc = MCMC(kernel, num_warmup=0, num_samples=args.steps // args.thin, progress_bar=False)
    start = time.perf_counter()
    mcmc.run(
        jax.random.PRNGKey(args.seed),
        data.train_words,
        data.train_mask,
        vocab_size=data.vocab_size,
        num_topics=args.topics,
        alpha=args.alpha,
        parametrisation=parametrisation,
        beta=args.beta,
        batch_size=args.batch_size,
    )
    theta = mcmc.get_samples()["theta"].block_until_ready()
    seconds = time.perf_counter() - start
    topics = np.asarray(lda.topic_word(theta, parametrisation))
    return topics, seconds, int(mcmc.last_state.num_diverging)


def run_gibbs(data, args):
    """Collapsed Gibbs from the ``lda`` package on all training documents; a snapshot of ``π`` (the
    package's own ``(n_kw + η)/(n_k + Vη)``) every ``gibbs_thin`` iterations."""
    import lda as lda_package

    X = load_corpus(args.corpus).matrix(data.train_documents).astype(np.int64)
    model = lda_package.LDA(
        n_topics=args.topics, n_iter=args.gibbs_iterations, alpha=args.alpha, eta=args.eta, random_state=args.seed
    )
    rng = np.random.RandomState(args.seed)
    rands = model._rands.copy()
    start = time.perf_counter()
    model._initialize(X)
    snapshots, iterations = [], []
    for it in range(1, args.gibbs_iterations + 1):
        rng.shuffle(rands)
        model._sample_topics(rands)
        if it % args.gibbs_thin == 0:
            counts = model.nzw_ + args.eta
            snapshots.append(counts / counts.sum(axis=1, keepdims=True))
            iterations.append(it)
    seconds = time.perf_counter() - start
    return np.stack(snapshots), np.asarray(iterations), seconds


def run_online_vb(data, args, batch_size):
    """scikit-learn's online VB, one ``partial_fit`` per minibatch; the normalised ``components_`` at checkpoints."""
    from sklearn.decomposition import LatentDirichletAllocation

    X = load_corpus(args.corpus).matrix(data.train_documents)
    num_docs = X.shape[0]
    model = LatentDirichletAllocation(
        n_components=args.topics,
        doc_topic_prior=args.alpha,
        topic_word_prior=args.eta,
        learning_method="online",
        learning_offset=10.0,
        learning_decay=0.7,
        total_samples=num_docs,
        batch_size=batch_size,
        random_state=args.seed,
    )
    rng = np.random.default_rng(args.seed)
    snapshots, seen = [], []
    start = time.perf_counter()
    num_seen, checkpoint = 0, max(1, args.vb_docs // 20)
    next_checkpoint = checkpoint
    while num_seen < args.vb_docs:
        for chunk in np.array_split(rng.permutation(num_docs), max(1, num_docs // batch_size)):
            model.partial_fit(X[chunk])
            num_seen += len(chunk)
            if num_seen >= next_checkpoint:
                snapshots.append(model.components_ / model.components_.sum(axis=1, keepdims=True))
                seen.append(num_seen)
                next_checkpoint += checkpoint
            if num_seen >= args.vb_docs:
                break
    seconds = time.perf_counter() - start
    return np.stack(snapshots), np.asarray(seen), seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", choices=["ap", "reuters"], default="ap")
    parser.add_argument("--methods", nargs="*", default=list(DEFAULT_STEP_SIZES) + ["Gibbs", "OnlineVB"])
    parser.add_argument("--step-sizes", nargs="*", default=[], metavar="METHOD=H1,H2", help="override, e.g. SGRLD=0.1,0.03")
    parser.add_argument("--steps", type=int, default=6000, help="SG-MCMC steps per run")
    parser.add_argument("--thin", type=int, default=100)
    parser.add_argument("--topics", type=int, default=30)
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--beta", type=float, default=0.1, help="SGRLD's Gamma(β, 1) prior")
    parser.add_argument("--eta", type=float, default=0.1, help="topic-word Dirichlet prior of the baselines")
    parser.add_argument("--diffusion", type=float, default=0.75)
    parser.add_argument("--batch-size", type=int, default=5)
    parser.add_argument("--gibbs-sweeps", type=int, nargs=2, default=(5, 5))
    parser.add_argument("--gibbs-iterations", type=int, default=1000)
    parser.add_argument("--gibbs-thin", type=int, default=50)
    parser.add_argument("--vb-batch-sizes", type=int, nargs="*", default=[5, 128])
    parser.add_argument("--vb-docs", type=int, default=None, help="documents for online VB (default: as SG-MCMC)")
    parser.add_argument("--eval-sweeps", type=int, nargs=2, default=(20, 30), metavar=("BURN_IN", "KEPT"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--plot-only", action="store_true", help="redraw the PNG and the summary from the JSON")
    args = parser.parse_args(argv)
    if args.plot_only:
        results = json.loads((args.out / f"lda_{args.corpus}.json").read_text())
        plot(results, args.out / f"lda_{args.corpus}_learning_curves.png")
        summary(results)
        return
    args.vb_docs = args.vb_docs or args.steps * args.batch_size
    step_sizes = dict(DEFAULT_STEP_SIZES)
    for item in args.step_sizes:
        method, values = item.split("=")
        step_sizes[method] = tuple(float(v) for v in values.split(","))

    corpus = load_corpus(args.corpus)
    data = lda.prepare_corpus(corpus, seed=args.seed)
    masks = [b[3] for b in data.held_out.buckets]
    print(
        f"{args.corpus}: {len(data.train_documents)} training / {len(data.test_documents)} test documents, "
        f"V = {data.vocab_size}, K = {args.topics}, {data.held_out.num_tokens} held-out tokens; "
        f"{platform.processor() or platform.machine()}, jax {jax.__version__}",
        flush=True,
    )
    uniform = lda.held_out_perplexity(
        np.full((1, args.topics, data.vocab_size), 1.0 / data.vocab_size), data.held_out, args.alpha
    )
    results = {"corpus": args.corpus, "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    results["uniform_topics"] = uniform
    results["runs"] = []
    print(f"uniform topics: perplexity {uniform:.1f}", flush=True)

    def record(method, setting, seen, probs, seconds, extra, topics):
        start = time.perf_counter()
        checkpoints = list(range(1, len(probs) + 1))
        values = curve(probs, masks, checkpoints)
        run = dict(
            method=method,
            setting=setting,
            perplexity=values[-1],
            documents_seen=[int(s) for s in seen],
            curve=values,
            seconds=seconds,
            eval_seconds=time.perf_counter() - start + extra.pop("eval_seconds", 0.0),
            top_words=lda.top_words(topics, data.vocab, 8),
            **extra,
        )
        results["runs"].append(run)
        print(
            f"{method:9s} {setting:28s} perplexity {values[-1]:8.1f}  (min over curve {min(values):8.1f})  "
            f"sampling {seconds:6.0f} s  eval {run['eval_seconds']:4.0f} s  {extra}",
            flush=True,
        )
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"lda_{args.corpus}.json").write_text(json.dumps(results, indent=1, default=float))

    for method in args.methods:
        if method.partition("@")[0] in DEFAULT_STEP_SIZES:
            for h in step_sizes.get(method, DEFAULT_STEP_SIZES[method.partition("@")[0]]):
                topics, seconds, diverging = run_sgmcmc(method, h, data, args)
                start = time.perf_counter()
                probs = evaluate(topics, data.held_out, args.alpha, args.eval_sweeps, args.seed)
                seen = np.arange(1, len(topics) + 1) * args.thin * args.batch_size
                extra = dict(diverging=diverging, step_size=h, eval_seconds=time.perf_counter() - start)
                record(method, f"h={h:g}", seen, probs, seconds, extra, topics[len(topics) // 2 :].mean(0))
        elif method == "Gibbs":
            topics, iterations, seconds = run_gibbs(data, args)
            start = time.perf_counter()
            probs = evaluate(topics, data.held_out, args.alpha, args.eval_sweeps, args.seed)
            seen = iterations * len(data.train_documents)
            extra = dict(eta=args.eta, iterations=args.gibbs_iterations, eval_seconds=time.perf_counter() - start)
            record(method, f"eta={args.eta:g}, {args.gibbs_iterations} it.", seen, probs, seconds, extra, topics[-1])
        elif method == "OnlineVB":
            for batch_size in args.vb_batch_sizes:
                topics, seen, seconds = run_online_vb(data, args, batch_size)
                start = time.perf_counter()
                probs = evaluate(topics, data.held_out, args.alpha, args.eval_sweeps, args.seed)
                # a point estimate: the curve and the result use the latest snapshot only
                values = [lda.perplexity(p, masks) for p in probs]
                run = dict(
                    method=method,
                    setting=f"batch {batch_size}",
                    perplexity=values[-1],
                    documents_seen=[int(s) for s in seen],
                    curve=values,
                    seconds=seconds,
                    eval_seconds=time.perf_counter() - start,
                    eta=args.eta,
                    top_words=lda.top_words(topics[-1], data.vocab, 8),
                )
                results["runs"].append(run)
                print(
                    f"{method:9s} {'batch ' + str(batch_size):28s} perplexity {values[-1]:8.1f}  sampling {seconds:6.0f} s",
                    flush=True,
                )
                (args.out / f"lda_{args.corpus}.json").write_text(json.dumps(results, indent=1, default=float))
        else:
            raise ValueError(f"unknown method {method!r}")

    plot(results, args.out / f"lda_{args.corpus}_learning_curves.png")
    summary(results)


def best_runs(results):
    best = {}
    for run in results["runs"]:
        if run["method"] not in best or run["perplexity"] < best[run["method"]]["perplexity"]:
            best[run["method"]] = run
    return best


def summary(results):
    best = best_runs(results)
    print("\nbest run per method (paper 000 Table 1, ICML corpus, for the ordering):")
    for method, run in sorted(best.items(), key=lambda kv: kv[1]["perplexity"]):
        paper = PAPER.get(method)
        print(
            f"  {method:9s} {run['setting']:28s} {run['perplexity']:8.1f}   {run['seconds']:6.0f} s"
            + (f"   (paper {paper})" if paper else "")
        )


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    colors = {"mSGNHT-S@expanded": "C3", "mSGNHT-E@expanded": "C1", "SGHMC-S@expanded": "C0", "SGHMC-E@expanded": "C9"}
    colors.update({"mSGNHT-S": "C3", "mSGNHT-E": "C1", "SGHMC-S": "C0", "SGHMC-E": "C9", "SGRLD": "C2", "Gibbs": "k", "OnlineVB": "C4"})
    for run in results["runs"]:
        styles = {"Gibbs": "-", "OnlineVB": ":"}
        if run["method"].endswith("@expanded"):
            styles[run["method"]] = "--"
        for ax in axes:
            ax.plot(
                run["documents_seen"],
                run["curve"],
                styles.get(run["method"], "-"),
                color=colors.get(run["method"]),
                alpha=0.9 if run is best_runs(results).get(run["method"]) else 0.35,
                label=f"{run['method']} {run['setting']}",
            )
    axes[0].set_xscale("log")
    sgmcmc_seen = max((max(r["documents_seen"]) for r in results["runs"] if r["method"] not in ("Gibbs",)), default=1)
    axes[1].set_xlim(0, sgmcmc_seen)
    finals = [r["perplexity"] for r in results["runs"]]
    axes[1].set_ylim(min(finals) * 0.95, np.percentile(finals, 80) * 1.3)
    for ax in axes:
        ax.set_xlabel("documents seen")
        ax.set_ylabel("test perplexity (document completion)")
        ax.grid(alpha=0.3)
    axes[0].set_title(f"LDA on {results['corpus'].upper()}, K = {results['args']['topics']} (log scale)")
    axes[1].set_title("the SG-MCMC range (linear scale)")
    axes[1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
