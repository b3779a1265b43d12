"""Shared fixtures. TRITON_INTERPRET must be set before any kernel module is imported."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest  # noqa: E402
import torch  # noqa: E402

from backend.model.checkpoint import load_checkpoint  # noqa: E402
from backend.model.tasks import task_set  # noqa: E402

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def loaded():
    """The shipped tiny checkpoint, fp32."""
    return load_checkpoint()


@pytest.fixture(scope="session")
def heldout_prompts():
    """36 held-out task prompts (values never seen in training), 4 of each of the 9 task families."""
    return [t.prompt for t in task_set("heldout", 4)]


@pytest.fixture
def engine(loaded):
    from backend.engine.engine import Engine
    return Engine(loaded, num_slots=4096, check_invariants=True)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny random models: one intra-op thread is fastest and does not contend with other work."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
