"""Effect handlers that change how a Pyro model's subsampled plates behave.

* :class:`subsample_plates` fixes the indices of subsampled plates (the kernel's minibatch).
* :class:`full_data` runs subsampled plates on all of their data, with scale 1 (evaluation, ArviZ,
  ``Predictive``, Pyro's NUTS).
* :class:`FullDataModel` is a model wrapped in :class:`full_data`, a picklable callable (the kernels'
  :attr:`~ppl_sgmcmc.pyro.kernel.SGMCMCKernel.model`).

A ``pyro.plate(name, N, subsample_size=n)`` announces itself with a ``"sample"`` message whose
``fn`` is Pyro's internal ``_Subsample`` distribution, when the plate is *constructed*; the value
of that message becomes the plate's indices.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any, overload

import numpy as np
import torch
from pyro.poutine.messenger import Messenger
from pyro.poutine.subsample_messenger import SubsampleMessenger

__all__ = ["FullDataMessenger", "FullDataModel", "as_tensors", "full_data", "is_subsample_site", "subsample_plates"]


def is_subsample_site(msg: Mapping[str, Any]) -> bool:
    """Whether a message is the index draw of a plate with ``subsample_size < size``.

    **Example**::

        >>> import torch, pyro
        >>> def model():
        ...     pyro.plate("data", 10, subsample_size=3)
        ...     pyro.plate("full", 10)
        >>> nodes = pyro.poutine.trace(model).get_trace().nodes
        >>> is_subsample_site(nodes["data"]), is_subsample_site(nodes["full"])
        (True, False)
    """
    fn = msg["fn"]
    return (
        msg["type"] == "sample"
        and type(fn).__name__ == "_Subsample"
        and fn.subsample_size is not None
        and fn.subsample_size < fn.size
    )


class subsample_plates(Messenger):
    """Give subsampled plates the indices ``indices[name]``.

    Plates not in ``indices``, and plates whose indices the model fixes itself (``subsample=``),
    are left alone. With ``indices=None`` every subsampled plate gets ``0..n-1``: a cheap,
    RNG-free choice for prototype traces (Pyro's own draw is an O(N) ``torch.randperm``).

    :param indices: ``{plate name: index tensor of length n}``, or ``None``.

    **Example**::

        >>> import torch, pyro, pyro.distributions as dist
        >>> def model(y):
        ...     with pyro.plate("data", y.shape[0], subsample_size=2) as idx:
        ...         pyro.sample("y", dist.Normal(0.0, 1.0), obs=pyro.subsample(y, event_dim=0))
        ...     return idx
        >>> y = torch.arange(10.0)
        >>> with subsample_plates({"data": torch.tensor([7, 3])}):
        ...     trace = pyro.poutine.trace(model).get_trace(y)
        >>> trace.nodes["y"]["value"], trace.nodes["y"]["scale"]  # the minibatch, scaled by N / n
        (tensor([7., 3.]), 5.0)
        >>> with subsample_plates():
        ...     model(y)
        tensor([0, 1])
    """

    def __init__(self, indices: Mapping[str, torch.Tensor] | None = None) -> None:
        super().__init__()
        self.indices = indices
        self.fixed: dict[str, tuple[int, int]] = {}  # {name: (N, n)} of the plates this handler gave indices to

    def _pyro_sample(self, msg: dict[str, Any]) -> None:
        if msg["value"] is not None or not is_subsample_site(msg):
            return
        fn = msg["fn"]
        if self.indices is None:
            msg["value"] = torch.arange(fn.subsample_size, device=fn.device)
        elif msg["name"] in self.indices:
            msg["value"] = self.indices[msg["name"]]
        else:
            return
        self.fixed[msg["name"]] = (fn.size, fn.subsample_size)


_FULL_PLATE_CLASSES: dict[type, type] = {}


def _full_plate_class(cls: type[SubsampleMessenger]) -> type[SubsampleMessenger]:
    """A subclass of the plate class ``cls`` whose instances ignore their subsample: size ``N``,
    indices ``0..N-1`` and scale 1, whatever ``subsample_size`` or ``subsample`` they were given."""
    if cls not in _FULL_PLATE_CLASSES:

        def _indices(self: SubsampleMessenger) -> torch.Tensor:
            return torch.arange(self.size, device=self.device)

        def ignore(self: SubsampleMessenger, value: Any) -> None:
            pass

        _FULL_PLATE_CLASSES[cls] = type(
            f"FullData{cls.__name__}",
            (cls,),
            {
                "subsample_size": property(lambda self: self.size, ignore),
                "_indices": property(_indices, ignore),
                "indices": property(_indices),
                "__module__": __name__,
            },
        )
    return _FULL_PLATE_CLASSES[cls]


def _plate_under_construction() -> SubsampleMessenger | None:
    """The ``SubsampleMessenger`` (plate) whose ``__init__`` sent the current ``_Subsample`` message.

    Pyro checks ``len(indices) == subsample_size`` right after the message returns, with the
    ``subsample_size`` the model passed, so no message handler can enlarge a plate; the plate
    object itself has to change. It is found on the call stack, a few frames up.
    """
    code = SubsampleMessenger.__init__.__code__
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if frame.f_code is code:
            plate = frame.f_locals.get("self")
            return plate if isinstance(plate, SubsampleMessenger) else None
        frame = frame.f_back
    return None


class FullDataMessenger(Messenger):
    """The handler of :func:`full_data` (``full_data()`` returns one).

    **Example**::

        >>> import torch, pyro
        >>> with FullDataMessenger():
        ...     with pyro.plate("data", 5, subsample_size=2) as idx:
        ...         pass
        >>> idx
        tensor([0, 1, 2, 3, 4])
    """

    def _pyro_sample(self, msg: dict[str, Any]) -> None:
        if msg["value"] is not None or not is_subsample_site(msg):
            return
        plate = _plate_under_construction()
        if plate is None:  # pragma: no cover - a plate class that does not derive from SubsampleMessenger
            raise NotImplementedError(f"full_data: cannot find the plate object of subsampled plate {msg['name']!r}.")
        plate.__class__ = _full_plate_class(type(plate))
        fn = msg["fn"]
        # passes Pyro's length check; the plate now ignores it
        msg["value"] = torch.arange(fn.subsample_size, device=fn.device)
        # the trace shows a full plate (no subsample_size), which Pyro's HMC/NUTS accept
        msg["fn"] = type(fn)(fn.size, None, device=fn.device)


@overload
def full_data(fn: None = None) -> FullDataMessenger: ...
@overload
def full_data(fn: Callable[..., Any]) -> Callable[..., Any]: ...
def full_data(fn: Callable[..., Any] | None = None) -> FullDataMessenger | Callable[..., Any]:
    """Run every subsampled plate on all of its data: ``plate(name, N, subsample_size=n)`` behaves
    as ``plate(name, N)``, with indices ``0..N-1`` (also what ``with plate(...) as idx`` yields)
    and scale 1. ``full_data(model)`` wraps a model; ``with full_data():`` works too.

    This is the view of the model that evaluation needs: ArviZ's pointwise log-likelihood and
    observed data, posterior predictive checks (``Predictive(full_data(model), samples)``: the
    subsampled model would predict a random minibatch of rows per draw), and deterministic sites.
    The trace has no subsample site left (the plate's site is a full ``plate(name, N)``), so Pyro's
    ``NUTS(full_data(model))`` runs on all the data: the gold standard for an SG-MCMC run.

    **Example**::

        >>> import torch, pyro, pyro.distributions as dist
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        ...     with pyro.plate("data", y.shape[0], subsample_size=2):
        ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=pyro.subsample(y, event_dim=0))
        >>> tr = pyro.poutine.trace(full_data(model)).get_trace(torch.zeros(5))
        >>> tr.nodes["y"]["value"].shape, tr.nodes["y"]["scale"]
        (torch.Size([5]), 1.0)
        >>> is_subsample_site(tr.nodes["data"]), tr.nodes["data"]["fn"].subsample_size
        (False, None)
        >>> from pyro.infer import MCMC, NUTS
        >>> mcmc = MCMC(NUTS(full_data(model)), warmup_steps=20, num_samples=20, disable_progbar=True)
        >>> mcmc.run(torch.zeros(5))
        >>> mcmc.get_samples()["mu"].shape
        torch.Size([20])
    """
    messenger = FullDataMessenger()
    return messenger(fn) if fn is not None else messenger


def as_tensors(tree: Any) -> Any:
    """Turn NumPy arrays (in tuples, lists and dicts) into torch tensors; floating arrays take
    torch's default dtype, as JAX turns float64 arrays into float32 when x64 is off.

    **Example**::

        >>> import numpy as np
        >>> as_tensors((np.zeros(2), {"n": np.arange(3)}, "text"))
        (tensor([0., 0.]), {'n': tensor([0, 1, 2])}, 'text')
    """

    if isinstance(tree, np.ndarray):
        tensor = torch.as_tensor(tree)
        return tensor.to(torch.get_default_dtype()) if tensor.is_floating_point() else tensor
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        return type(tree)(as_tensors(x) for x in tree)
    if isinstance(tree, dict):
        return {k: as_tensors(v) for k, v in tree.items()}
    return tree


class FullDataModel:
    """``model`` on its full data (see :class:`full_data`), NumPy arguments turned into tensors.

    A plain callable object, so that it pickles (for Pyro's worker processes) whenever the model does.

    :param model: a Pyro model.

    **Example**::

        >>> import pickle, torch, pyro, pyro.distributions as dist
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        ...     with pyro.plate("data", y.shape[0], subsample_size=2):
        ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=pyro.subsample(y, event_dim=0))
        >>> full = FullDataModel(model)
        >>> full
        FullDataModel('model')
        >>> pyro.poutine.trace(full).get_trace(torch.zeros(5)).nodes["y"]["value"].shape
        torch.Size([5])
    """

    def __init__(self, model: Callable[..., Any]) -> None:
        self.model = model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with full_data():
            return self.model(*as_tensors(args), **as_tensors(kwargs))

    def __repr__(self) -> str:
        return f"FullDataModel({getattr(self.model, '__name__', self.model)!r})"
