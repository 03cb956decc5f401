"""The array type of the rules: a ``jax.Array`` or a ``torch.Tensor`` (the rules use only their shared
array-API subset)."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jax
    import torch

    Array = jax.Array | torch.Tensor
else:
    Array = Any
