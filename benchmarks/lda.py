"""LDA test perplexity: SG-MCMC with a local Gibbs step vs collapsed Gibbs and online variational Bayes.

The experiment of Li, Chen, Fan & Carin, "High-Order Stochastic Gradient Thermostats for Bayesian
Learning of Deep Models" (AAAI 2016), §5.1 / Table 1 and Fig. 3, on Blei's AP corpus instead of the ICML
abstracts (not available): an 80/20 split of the documents, K = 30 topics, α = 0.1, minibatches of 5
documents, D = 0.75 (thermostat diffusion of mSGNHT, friction of SGHMC), a few step sizes per method.

* mSGNHT-S, mSGNHT-E, SGHMC-S, SGHMC-E: Li et al.'s parametrisation ``θ_kw ~ N(0.1, 1)``, ``π ∝ |θ|``;
* SGRLD: the expanded mean ``θ_kw ~ Gamma(β, 1)``, ``π ∝ θ`` (Patterson & Teh, "Stochastic Gradient
  Riemannian Langevin Dynamics on the Probability Simplex", NeurIPS 2013);
* ``METHOD@expanded`` (e.g. ``mSGNHT-S@expanded``): the momentum samplers on the expanded-mean model of
  SGRLD instead (sampled in ``log θ``, the Gamma prior's unconstrained space), to compare the samplers
  on one model;
* all of them: ``MCMC`` on ``models.lda.lda_model`` with the topic assignments as local Gibbs sites
  (``gibbs_sweeps`` burn-in + kept collapsed-Gibbs sweeps per step, started from ``make_gibbs_init``);
* baselines on the same split: collapsed Gibbs on the full training data from the PyPI package
  ``lda`` (its Cython sampler, driven iteration by iteration to snapshot posterior samples), and
  scikit-learn's ``LatentDirichletAllocation`` with ``learning_method="online"`` (Hoffman, Blei & Bach,
  "Online Learning for Latent Dirichlet Allocation", NeurIPS 2010).

Every method is scored by the same function, ``models.lda_evaluation.held_out_perplexity`` (document
completion, see ``models/lda_evaluation.py``): the predictive probabilities of the held-out 20% of each test
document's tokens, averaged over the posterior samples of the second half of the run (online VB: its
final variational mean of the topics, a single point). The learning curve evaluates the same at
checkpoints, each from the samples of the second half of the run so far.

Run from the repository root (writes ``benchmarks/results/lda_<corpus>.json`` and a PNG)::

    python benchmarks/lda.py                       # AP, the full comparison
    python benchmarks/lda.py --corpus reuters --steps 2000 --gibbs-iterations 300   # smaller
    # several runs (e.g. longer ones written with --out elsewhere) merged into lda_<corpus>_all.json,
    # the PNG and a Markdown table of every run; every run keeps its steps, thinning and command
    python benchmarks/lda.py --plot-only --inputs benchmarks/results/lda_ap.json long/lda_ap.json
    python benchmarks/lda.py --plot-only           # redraw from lda_<corpus>_all.json (or lda_<corpus>.json)

The recorded AP runs and what they show: ``benchmarks/RESULTS.md``, "LDA on AP".
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
from pathlib import Path

import jax
import numpy as np
from numpyro.infer import MCMC

# this file is named lda.py: keep its folder off the path so that `import lda` finds the PyPI package
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models import lda, lda_common, lda_evaluation, run_lda  # noqa: E402
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
        out.append(lda_common.perplexity(mean, masks))
    return out


def evaluate(topic_samples, held_out, alpha, eval_sweeps, seed):
    accumulator = lda_evaluation.PerplexityAccumulator(held_out, alpha, *eval_sweeps, seed=seed)
    return [accumulator.probabilities(t) for t in topic_samples]


def run_sgmcmc(method, step_size, data, args):
    name, _, parametrisation = method.partition("@")
    kernel, parametrisation = run_lda.make_kernel(
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


def build_parser():
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
    parser.add_argument(
        "--plot-only",
        action="store_true",
        help="redraw the PNG and the summary from saved JSON (default input: lda_<corpus>_all.json if it "
        "exists, else lda_<corpus>.json, in --out)",
    )
    parser.add_argument(
        "--inputs",
        nargs="*",
        type=Path,
        default=[],
        help="with --plot-only: JSON files of several runs to merge into --out/lda_<corpus>_all.json",
    )
    return parser


def command_line(run_args):
    """The command that reproduces a run from its saved ``args`` (the options that differ from the defaults)."""
    parser = build_parser()
    words = ["python", "benchmarks/lda.py"]
    for action in parser._actions:
        dest = action.dest
        if dest in ("help", "plot_only", "inputs", "out") or dest not in run_args:
            continue
        value, default = run_args[dest], action.default
        if dest == "vb_docs" and value == run_args["steps"] * run_args["batch_size"]:
            continue  # the default: as many documents as the SG-MCMC runs see
        if value == default or (isinstance(default, (list, tuple)) and list(default) == list(value)):
            continue
        flag = action.option_strings[-1]
        words += [flag] + ([str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)])
    out = Path(run_args.get("out") or parser.get_default("out"))
    if out.resolve() != parser.get_default("out").resolve():
        root = Path(__file__).resolve().parents[1]
        words += ["--out", str(out.resolve().relative_to(root) if out.resolve().is_relative_to(root) else out)]
    return " ".join(words)


def _rounded(obj, digits=6):
    if isinstance(obj, dict):
        return {k: _rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_rounded(v, digits) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(f"{float(obj):.{digits}g}")
    return obj


def dump_json(results, path):
    """``indent=1`` JSON, floats to 6 significant digits, each list of numbers or strings on one line
    (curves, top words)."""
    text = json.dumps(_rounded(results), indent=1, default=float, ensure_ascii=False)
    text = re.sub(r"\[\s*([^\[\]{}]*?)\s*\]", lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",\n")) + "]", text)
    path.write_text(text + "\n")


def merge(paths):
    """The runs of several result files in one: each run gets its ``steps``, ``thin`` and ``source``
    (an index into ``sources``, which keeps each file's ``args`` and the command that made it). The
    top-level ``args`` are those of the first file (corpus, K, α, minibatch: the same in all)."""
    merged, sources = None, []
    for path in paths:
        results = json.loads(Path(path).read_text())
        if "sources" in results:  # an earlier merge: keep its sources and tags
            offset = len(sources)
            sources += results["sources"]
            for run in results["runs"]:
                run["source"] += offset
        else:
            sources.append(dict(file=str(path), command=command_line(results["args"]), args=results["args"]))
            for run in results["runs"]:
                run.setdefault("steps", results["args"]["steps"])
                run.setdefault("thin", results["args"]["thin"])
                run["source"] = len(sources) - 1
        if merged is None:
            merged = {k: v for k, v in results.items() if k != "runs"}
            merged["runs"] = []
        elif (results["corpus"], results["uniform_topics"]) != (merged["corpus"], merged["uniform_topics"]):
            raise ValueError(f"{path}: another corpus or split than {paths[0]}")
        merged["runs"] += results["runs"]
    merged["sources"] = sources
    return merged


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.plot_only:
        merged_path = args.out / f"lda_{args.corpus}_all.json"
        inputs = args.inputs or [merged_path if merged_path.exists() else args.out / f"lda_{args.corpus}.json"]
        results = merge(inputs)
        args.out.mkdir(parents=True, exist_ok=True)
        if args.inputs:
            dump_json(results, merged_path)
            print(f"wrote {merged_path}")
        plot(results, args.out / f"lda_{args.corpus}_learning_curves.png")
        summary(results)
        return
    args.vb_docs = args.vb_docs or args.steps * args.batch_size
    step_sizes = dict(DEFAULT_STEP_SIZES)
    for item in args.step_sizes:
        method, values = item.split("=")
        step_sizes[method] = tuple(float(v) for v in values.split(","))

    corpus = load_corpus(args.corpus)
    data = lda_common.prepare_corpus(corpus, seed=args.seed)
    masks = [b[3] for b in data.held_out.buckets]
    print(
        f"{args.corpus}: {len(data.train_documents)} training / {len(data.test_documents)} test documents, "
        f"V = {data.vocab_size}, K = {args.topics}, {data.held_out.num_tokens} held-out tokens; "
        f"{platform.processor() or platform.machine()}, jax {jax.__version__}",
        flush=True,
    )
    uniform = lda_evaluation.held_out_perplexity(
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
            top_words=lda_common.top_words(topics, data.vocab, 8),
            **extra,
        )
        results["runs"].append(run)
        print(
            f"{method:9s} {setting:28s} perplexity {values[-1]:8.1f}  (min over curve {min(values):8.1f})  "
            f"sampling {seconds:6.0f} s  eval {run['eval_seconds']:4.0f} s  {extra}",
            flush=True,
        )
        args.out.mkdir(parents=True, exist_ok=True)
        dump_json(results, args.out / f"lda_{args.corpus}.json")

    for method in args.methods:
        if method.partition("@")[0] in DEFAULT_STEP_SIZES:
            for h in step_sizes.get(method, DEFAULT_STEP_SIZES[method.partition("@")[0]]):
                topics, seconds, diverging = run_sgmcmc(method, h, data, args)
                start = time.perf_counter()
                probs = evaluate(topics, data.held_out, args.alpha, args.eval_sweeps, args.seed)
                seen = np.arange(1, len(topics) + 1) * args.thin * args.batch_size
                extra = dict(diverging=diverging, step_size=h, steps=args.steps, thin=args.thin)
                extra["eval_seconds"] = time.perf_counter() - start
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
                values = [lda_common.perplexity(p, masks) for p in probs]
                run = dict(
                    method=method,
                    setting=f"batch {batch_size}",
                    perplexity=values[-1],
                    documents_seen=[int(s) for s in seen],
                    curve=values,
                    seconds=seconds,
                    eval_seconds=time.perf_counter() - start,
                    eta=args.eta,
                    top_words=lda_common.top_words(topics[-1], data.vocab, 8),
                )
                results["runs"].append(run)
                print(
                    f"{method:9s} {'batch ' + str(batch_size):28s} perplexity {values[-1]:8.1f}  sampling {seconds:6.0f} s",
                    flush=True,
                )
                dump_json(results, args.out / f"lda_{args.corpus}.json")
        else:
            raise ValueError(f"unknown method {method!r}")

    plot(results, args.out / f"lda_{args.corpus}_learning_curves.png")
    summary(results)


BASELINES = ("Gibbs", "OnlineVB")
ORDER = ("mSGNHT-S", "mSGNHT-E", "SGHMC-S", "SGHMC-E", "SGRLD", "Gibbs", "OnlineVB")
COLORS = {"mSGNHT-S": "C3", "mSGNHT-E": "C1", "SGHMC-S": "C0", "SGHMC-E": "C9", "SGRLD": "C2", "Gibbs": "k", "OnlineVB": "C4"}


def parametrisation(method):
    """``"gaussian"`` (Li et al. 2016's ``θ ~ N(0.1, 1)``, ``π ∝ |θ|``), ``"expanded"`` or ``"-"`` (baselines)."""
    if method in BASELINES:
        return "-"
    return "expanded" if method.endswith("@expanded") or method == "SGRLD" else "gaussian"


def best_runs(results, key=lambda run: run["method"]):
    """The run with the lowest final perplexity for each method (or each ``key``)."""
    best = {}
    for run in results["runs"]:
        k = key(run)
        if k not in best or run["perplexity"] < best[k]["perplexity"]:
            best[k] = run
    return best


def _sort_key(run):
    base = run["method"].partition("@")[0]
    return (
        {"gaussian": 0, "expanded": 1, "-": 2}[parametrisation(run["method"])],
        ORDER.index(base) if base in ORDER else len(ORDER),
        run.get("steps", 0) if base not in BASELINES else 0,
        -run.get("step_size", 0.0),
        run["setting"],
    )


def summary(results):
    """Every run as a Markdown table (the best run of each method in bold) and the best run per method."""
    best = best_runs(results)
    gibbs = best.get("Gibbs", {}).get("perplexity")
    print(
        "\n| method | parametrisation | step size | steps (documents seen) | perplexity | vs Gibbs | wall-clock (s) "
        "| rejected steps |\n|---|---|---:|---:|---:|---:|---:|---:|"
    )
    for run in sorted(results["runs"], key=_sort_key):
        method = run["method"]
        seen = f"{run['documents_seen'][-1]:,}"
        if method == "Gibbs":
            cells = ["collapsed Gibbs (`lda`)", f"collapsed, η = {run['eta']:g}", "", f"{run['iterations']:,} sweeps ({seen})"]
        elif method == "OnlineVB":
            cells = ["online VB (scikit-learn)", f"minibatch {run['setting'].split()[-1]}, η = {run['eta']:g}", "", f"({seen})"]
        else:
            model = {"gaussian": "Gaussian (paper 000)", "expanded": "expanded mean"}[parametrisation(method)]
            cells = [method.partition("@")[0], model, f"{run['step_size']:g}", f"{run['steps']:,} ({seen})"]
        bold = "**" if best[method] is run else ""
        cells.append(f"{bold}{run['perplexity']:.1f}{bold}")
        cells.append("0" if method == "Gibbs" else f"{100 * (run['perplexity'] / gibbs - 1):+.1f}%" if gibbs else "")
        cells.append(f"{run['seconds']:.0f}")
        if "diverging" in run:
            rate = run["diverging"] / run["steps"]
            cells.append(f"{run['diverging']:,}" + (f" ({100 * rate:.0f}%)" if run["diverging"] else ""))
        else:
            cells.append("")
        print("| " + " | ".join(cells) + " |")
    print("\nbest run per method (paper 000 Table 1 is on the ICML corpus: compare the ordering):")
    for method, run in sorted(best.items(), key=lambda kv: kv[1]["perplexity"]):
        paper = PAPER.get(method)
        rel = f"  {100 * (run['perplexity'] / gibbs - 1):+5.1f}% vs Gibbs" if gibbs else ""
        steps = f"{run['steps']} steps" if "steps" in run and method not in BASELINES else ""
        print(
            f"  {method:18s} {run['setting']:22s} {steps:12s} {run['perplexity']:8.1f}{rel}   {run['seconds']:6.0f} s"
            + (f"   (paper {paper})" if paper else "")
        )


def plot(results, path):
    """Perplexity against documents seen (Li et al. 2016, Fig. 3), one panel per parametrisation: Li et al.'s
    Gaussian model on the left, the expanded mean (with SGRLD) on the right. Each method's best run is
    bold and labelled; where a method also has runs of another length, the best of those is labelled
    too (medium line); the other step sizes are faint. Runs longer than the shortest have dot markers.
    Collapsed Gibbs (its curve over the sweeps and its final value across the panel) and online VB
    (its curves and its best final value) are the reference lines of both panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    best = best_runs(results)
    best_by_length = best_runs(results, key=lambda run: (run["method"], run.get("steps")))
    sgmcmc_steps = sorted({run["steps"] for run in results["runs"] if run["method"] not in BASELINES and "steps" in run})
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.6), sharey=True)
    panels = [
        ("gaussian", "paper 000's model: θ ~ N(0.1, 1), π ∝ |θ|"),
        ("expanded", f"expanded mean: θ ~ Gamma({results['args']['beta']:g}, 1), π ∝ θ"),
    ]
    for ax, (model, title) in zip(axes, panels):
        runs = [r for r in results["runs"] if parametrisation(r["method"]) == model]
        entries = []  # (legend position, line): methods in paper 000's order, each method's best first
        for run in sorted(runs, key=lambda r: (best[r["method"]] is r, best_by_length[(r["method"], r.get("steps"))] is r)):
            method, base = run["method"], run["method"].partition("@")[0]
            long = len(sgmcmc_steps) > 1 and run["steps"] > sgmcmc_steps[0]
            rejected = run["diverging"] / run["steps"]
            style = dict(color=COLORS.get(base), marker="o" if long else None, markersize=3, markevery=3)
            label = f"{base} h={run['step_size']:g}, {run['steps']:,} steps: {run['perplexity']:.0f}"
            label += f" ({100 * rejected:.0f}% rejected)" if rejected >= 0.005 else ""
            order = (ORDER.index(base), best[method] is not run)
            if best[method] is run:
                (line,) = ax.plot(run["documents_seen"], run["curve"], linewidth=2.4, label=label, zorder=4, **style)
                entries.append((order, line))
            elif best_by_length[(method, run.get("steps"))] is run:
                (line,) = ax.plot(run["documents_seen"], run["curve"], linewidth=1.2, alpha=0.8, label=label, zorder=3, **style)
                entries.append((order, line))
            else:
                ax.plot(run["documents_seen"], run["curve"], linewidth=0.8, alpha=0.3, zorder=2, **style)
        for run in results["runs"]:
            if run["method"] == "Gibbs":
                ax.plot(run["documents_seen"], run["curve"], color="k", linewidth=1.6, zorder=4)
            elif run["method"] == "OnlineVB":
                ax.plot(run["documents_seen"], run["curve"], ":", color=COLORS["OnlineVB"], linewidth=1.2, alpha=0.7)
        if "Gibbs" in best:
            g = best["Gibbs"]
            label = f"collapsed Gibbs, {g['setting']} ({g['documents_seen'][-1]:,} documents): {g['perplexity']:.0f}"
            line = ax.axhline(g["perplexity"], color="k", linestyle="--", linewidth=1.0, zorder=1, label=label)
            entries.append(((len(ORDER), 0), line))
        if "OnlineVB" in best:
            v = best["OnlineVB"]
            label = f"online VB, {v['setting']} (dotted: its curves): {v['perplexity']:.0f}"
            line = ax.axhline(v["perplexity"], color=COLORS["OnlineVB"], linestyle="--", linewidth=1.0, zorder=1, label=label)
            entries.append(((len(ORDER), 1), line))
        if "uniform_topics" in results:
            ax.axhline(results["uniform_topics"], color="0.6", linewidth=0.8, zorder=1)
            ax.text(1.1e3, results["uniform_topics"] * 0.97, "uniform topics", color="0.4", fontsize=7.5, va="top")
        ax.set_xscale("log")
        xlabel = f"documents seen (SG-MCMC: {results['args']['batch_size']} per step"
        if "Gibbs" in best:
            xlabel += f"; Gibbs: {best['Gibbs']['documents_seen'][-1] // best['Gibbs']['iterations']:,} per sweep"
        ax.set_xlabel(xlabel + ")")
        ax.set_title(title, fontsize=10.5)
        ax.grid(alpha=0.3, which="both")
        entries.sort(key=lambda entry: entry[0])
        ax.legend(handles=[line for _, line in entries], fontsize=7.4, loc="upper right", framealpha=0.9)
    finals = [r["perplexity"] for r in results["runs"]]
    axes[0].set_yscale("log")
    axes[0].set_ylim(min(finals) * 0.92, results.get("uniform_topics", max(finals)) * 1.08)
    low, high = axes[0].get_ylim()
    ticks = (1000, 1500, 2000, 2500, 3000, 3500, 4000, 5000, 6000, 8000, 10000, 12000)
    axes[0].set_yticks([t for t in ticks if low <= t <= high])
    axes[0].yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:,.0f}"))
    axes[0].yaxis.set_minor_formatter(NullFormatter())
    axes[0].set_ylabel("test perplexity (document completion)")
    fig.suptitle(
        f"LDA on {results['corpus'].upper()}, K = {results['args']['topics']}, α = {results['args']['alpha']}, "
        f"minibatch {results['args']['batch_size']} documents; each point averages the posterior samples of the "
        "second half of the run so far; faint: other step sizes",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    try:  # a 256-colour palette: the same picture at about half the size
        from PIL import Image

        with Image.open(path) as image:
            image = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
        image.save(path, optimize=True)
    except ImportError:
        pass
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
