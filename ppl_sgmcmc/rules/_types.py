"""The types of the rules and of the algorithm layer's hooks (:class:`ppl_sgmcmc.algorithms.Algorithm`).

``Array``, the rules' array type, is a ``jax.Array`` or a ``torch.Tensor``: the rules use only the array-API subset
the two share (through :func:`array_api_compat.array_namespace`), so the same lines run on both. It is a union and
not the array-API ``Protocol`` or a ``TypeVar``: neither library publishes types for the array-API standard (its
namespace, from ``array_namespace``, is untyped), so a ``Protocol`` of the standard would be checked against
nothing; and a ``TypeVar`` over the two would have to thread one array type through every hook and state, where
the states (``NamedTuple`` s shared by both backends) hold whichever array their backend made. The union names
exactly the two types a backend passes, which is what the type checker can verify at the hooks' boundary. Its cost:
in ``x * y`` of two arrays the checker also tries a ``jax.Array`` with a ``torch.Tensor``, which cannot occur (a
chain's arrays are its backend's); the strict modules turn that error code (``operator``) off in
``pyproject.toml``. At run time ``Array`` is ``Any``: the rules import neither library.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

if TYPE_CHECKING:
    import jax
    import torch

    from ppl_sgmcmc.rules import StochasticGradient

    Array: TypeAlias = jax.Array | torch.Tensor
else:
    Array = Any

#: A step count ``i``: a Python ``int`` (Pyro's loop over steps) or an integer scalar array (NumPyro's compiled
#: step, where ``i`` is traced).
StepIndex: TypeAlias = "int | Array"
#: A scalar the hooks compute with: a Python number, or a 0-d array where it is traced or read from a state (a
#: step size, a temperature, a noise scale ``c``).
Scalar: TypeAlias = "float | Array"
#: A flag per step: a Python ``bool``, or a boolean array where the step is traced.
Flag: TypeAlias = "bool | Array"
#: ``grad_fn``: the stochastic gradient at a flat position (see :mod:`ppl_sgmcmc.rules`).
GradFn: TypeAlias = "Callable[[Array], StochasticGradient]"

#: A rule's auxiliary state: its module's own ``NamedTuple`` of arrays (``sgld.SGLDState``, ``psgld.PSGLDState``,
#: ...). :class:`~ppl_sgmcmc.algorithms.Algorithm` is generic in it, so that an algorithm's hooks receive the state
#: of its own rule, with its fields.
RuleStateT = TypeVar("RuleStateT", bound="tuple[Any, ...]")


class RuleModule(Protocol):
    """A module of :mod:`ppl_sgmcmc.rules` as :class:`~ppl_sgmcmc.algorithms.Algorithm` calls it (its ``rule``).

    ``init`` and ``step`` take, besides the arguments below, the hyper-parameters they declare as keywords, which
    differ between rules: hence ``Callable[..., ...]``. ``init(position, noise, **hyper)`` returns the rule's state;
    ``step(position, state, grad_fn, noise, step_size, **hyper)`` returns ``(position, state, gradient)``. The
    state's type is the rule module's own ``NamedTuple`` (``Any`` here: a module protocol cannot be generic in it;
    the algorithm's class names it, :data:`RuleStateT`).
    """

    #: What the rule reads from the gradient: ``"gradient"``, ``"score"`` or ``"per_example"``.
    NEEDS: str
    init: Callable[..., Any]
    step: Callable[..., tuple[Array, Any, StochasticGradient]]


#: A hyper-parameter's schedule: its value at the 0-based step index ``t`` (see :mod:`ppl_sgmcmc.schedules`).
Schedule: TypeAlias = "Callable[[StepIndex], Scalar]"

_RuleStateT_co = TypeVar("_RuleStateT_co", bound="tuple[Any, ...]", covariant=True)


class ChainState(Protocol[_RuleStateT_co]):
    """What the algorithm layer reads from a backend's chain state (each backend's ``SGMCMCState``), for the
    progress line: the step count, the minibatch energy, the step size in force, the count of rejected steps and the
    rule's state."""

    @property
    def i(self) -> StepIndex: ...
    @property
    def potential_energy(self) -> Scalar: ...
    @property
    def step_size(self) -> Scalar: ...
    @property
    def num_diverging(self) -> Scalar: ...
    @property
    def rule_state(self) -> _RuleStateT_co: ...


class Target(Protocol):
    """What the algorithm layer reads from a backend's stochastic potential of a model (its ``ModelTarget``, or a
    ``PotentialTarget`` around a ``potential_fn``), in its checks: the subsampled plates, the data size, the latent
    sites' supports (the backend's constraint objects), and the switch to per-datum scores."""

    #: ``{plate name: (N, n)}``: each subsampled plate's size and subsample size.
    @property
    def plate_sizes(self) -> Mapping[str, tuple[int, int]]: ...
    #: ``N`` of the largest subsampled plate (1 without one).
    @property
    def data_size(self) -> int: ...
    #: Whether the data's rows are read from the host a minibatch at a time (NumPyro's ``streaming.streamed``), so that
    #: a full-data gradient reads every row from there.
    @property
    def streamed(self) -> bool: ...
    #: ``{site: support}``, in the backend's constraints (``Any``: NumPyro's or Pyro's constraint classes).
    @property
    def latent_supports(self) -> Mapping[str, Any]: ...
    def enable_per_example_scores(self) -> None:
        """Compute the ``n×d`` per-datum scores with every gradient (``NEEDS = "per_example"``)."""
