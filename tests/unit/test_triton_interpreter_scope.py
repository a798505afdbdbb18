"""Triton's interpreter is on inside the kernel tests only (tests/helpers/triton_interpreter.py).

Every test outside tests/unit/kernels also checks it through tests/conftest.py's autouse fixture; these tests hold
the mechanism itself: a copy of dsrecipes made under the interpreter leaves the process's own modules, environment
and Hydra ConfigStore as they were, and no process a test starts inherits the variable.
"""

from __future__ import annotations

import os
import sys

import pytest

from tests.helpers.environment import subprocess_env
from tests.helpers.triton_interpreter import VARIABLE, InterpretedModules, interpreted_kernels_in_this_process


def test_a_test_outside_the_kernel_tests_sees_no_interpreter():
    from dsrecipes.kernels._utils import kernel_is_interpreted
    from dsrecipes.kernels.layer_norm import _layer_norm_fwd_kernel

    assert VARIABLE not in os.environ
    assert not kernel_is_interpreted(_layer_norm_fwd_kernel)  # decorated for a GPU: on CPU the torch path runs
    assert interpreted_kernels_in_this_process() == []


@pytest.mark.skipif(not __import__("importlib").util.find_spec("triton"), reason="needs triton")
def test_the_interpreted_copy_leaves_modules_environment_and_config_store_as_they_were():
    from hydra.core.config_store import ConfigStore

    from dsrecipes.config.store import SCHEMA_NAME, compose
    from dsrecipes.kernels import layer_norm as ours

    compose([])  # our schemas are in the store
    schema = ConfigStore.instance().repo[f"{SCHEMA_NAME}.yaml"]
    with InterpretedModules().active():
        assert os.environ[VARIABLE] == "1"
        from dsrecipes.config.store import compose as copied_compose
        from dsrecipes.kernels import layer_norm as copied
        from dsrecipes.kernels._utils import kernel_is_interpreted

        assert copied is not ours and kernel_is_interpreted(copied._layer_norm_fwd_kernel)
        copied_compose([])  # the copy stores schemas of its own classes
        assert ConfigStore.instance().repo[f"{SCHEMA_NAME}.yaml"] is not schema
    assert VARIABLE not in os.environ
    assert sys.modules["dsrecipes.kernels.layer_norm"] is ours
    assert ConfigStore.instance().repo[f"{SCHEMA_NAME}.yaml"] is schema
    assert interpreted_kernels_in_this_process() == []


def test_no_process_a_test_starts_gets_the_interpreter(monkeypatch):
    monkeypatch.setenv(VARIABLE, "1")
    monkeypatch.setenv("WANDB_API_KEY", "secret")
    env = subprocess_env(OMP_NUM_THREADS="1")
    assert VARIABLE not in env and "WANDB_API_KEY" not in env
    assert env["WANDB_MODE"] == "offline" and env["HF_HUB_OFFLINE"] == "1" and env["OMP_NUM_THREADS"] == "1"
