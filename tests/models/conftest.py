"""Fixtures of the model tests."""

import pytest
import torch


@pytest.fixture
def one_torch_thread():
    """torch on one thread for the test (restored afterwards): the Pyro models' tensors are small, and threads
    only add contention on 2 shared cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
