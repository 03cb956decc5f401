import pyro
import pytest
import torch

from tests.pyro.models import logistic_data as _logistic_data

# The per-step work is tiny (a few dozen small tensor operations): threads only add contention on
# the shared 2-core test machine.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _fresh_pyro_state():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    yield


@pytest.fixture(scope="session")
def logistic_data():
    return _logistic_data()
