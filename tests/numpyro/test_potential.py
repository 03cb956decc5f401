"""The NumPyro targets' gradients with respect to the flat position (:mod:`ppl_sgmcmc.numpyro.potential`)."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.flatten_util import ravel_pytree

from ppl_sgmcmc.numpyro.potential import ModelTarget, ravel_into, value_and_flat_grad


def mlp(X, y, batch_size=10):
    w1 = numpyro.sample("w1", dist.Normal(0.0, 1.0).expand([X.shape[1], 8]).to_event(2))
    b1 = numpyro.sample("b1", dist.Normal(0.0, 1.0).expand([8]).to_event(1))
    w2 = numpyro.sample("w2", dist.Normal(0.0, 1.0).expand([8]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=batch_size):
        Xb, yb = numpyro.subsample(X, event_dim=1), numpyro.subsample(y, event_dim=0)
        numpyro.sample("y", dist.Normal(jnp.tanh(Xb @ w1 + b1) @ w2, 1.0), obs=yb)


def _tree():
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    return {"a": jax.random.normal(keys[0], (3, 4)), "b": jax.random.normal(keys[1], ()), "c": jax.random.normal(keys[2], (5,))}


def _energy(z):
    return jnp.sum(jnp.sin(z["a"]) ** 2) + z["b"] ** 4 + jnp.sum(z["c"] * jnp.arange(5.0))


def test_value_and_flat_grad_is_the_gradient_through_ravel_pytree():
    flat, unravel = ravel_pytree(_tree())
    expected = jax.value_and_grad(lambda x: _energy(unravel(x)))(flat)
    got = jax.jit(value_and_flat_grad, static_argnums=(0, 2))(_energy, flat, unravel)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-6)
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-6)
    # vectorised chains: a batch of positions
    flats = flat + jnp.arange(4.0)[:, None]
    batched = jax.vmap(lambda x: value_and_flat_grad(_energy, x, unravel)[1])(flats)
    np.testing.assert_allclose(batched, jax.vmap(jax.grad(lambda x: _energy(unravel(x))))(flats), rtol=1e-6)


def test_ravel_into_lays_leaves_out_like_ravel_pytree():
    tree = _tree()
    flat, _ = ravel_pytree(tree)
    np.testing.assert_array_equal(ravel_into(tree, jnp.full_like(flat, jnp.nan)), flat)
    one = {"w": jnp.arange(6.0).reshape(2, 3)}
    np.testing.assert_array_equal(ravel_into(one, jnp.zeros(6)), jnp.arange(6.0))


def test_the_compiled_gradient_has_no_concatenate():
    """XLA:CPU fuses the backward pass's last operations into a concatenate of the leaves' gradients (the
    transpose of ``ravel_pytree``'s unravel) and runs that fusion element by element: a Bayesian network's step
    took ten times the hand-written one. The targets write each leaf's gradient into place instead."""
    rng = np.random.default_rng(0)
    X, y = jnp.asarray(rng.normal(size=(50, 3))), jnp.asarray(rng.normal(size=50))
    target = ModelTarget(mlp, (X, y), {}, jax.random.PRNGKey(0), True, "SGLD")
    z = {"w1": jnp.zeros((3, 8)), "b1": jnp.zeros(8), "w2": jnp.zeros(8)}
    flat, unravel = ravel_pytree(z)
    batch, _ = target.draw(jax.random.PRNGKey(1), target.init_batch(jax.random.PRNGKey(2)))

    def gradient(x, batch):
        return target.gradient(x, unravel, batch, (X, y), {}).grad

    hlo = jax.jit(gradient).lower(flat, batch).compile().as_text()
    assert "concatenate(" not in hlo
    expected = jax.grad(lambda x: sum(target._energies(unravel(x), batch, (X, y), {})))(flat)
    np.testing.assert_allclose(gradient(flat, batch), expected, rtol=1e-5)
