"""dsrecipes.utils.interrupts: a signal during a checkpoint save is held back until the save is done (a second
one stops at once). The handler is called directly, as the interpreter would on SIGTERM; nothing is installed.
The end-to-end case (SIGTERM to a training run, its checkpoint complete) is tests/integration/test_reliability.py."""

import signal

import pytest

from dsrecipes.utils import interrupts


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    monkeypatch.setattr(interrupts, "_RECEIVED", [])
    monkeypatch.setattr(interrupts, "_HELD", {"depth": 0, "pending": False})


def test_a_signal_outside_a_save_stops_at_once():
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        interrupts._on_signal(signal.SIGTERM, None)
    assert interrupts.received_signal() == signal.SIGTERM


def test_a_signal_during_a_save_is_raised_when_the_save_is_done():
    finished = []
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        with interrupts.signals_held():
            with interrupts.signals_held():  # the trainer's hold around the engine's
                interrupts._on_signal(signal.SIGTERM, None)  # held: the save goes on
                finished.append("engine")
            finished.append("trainer")  # the inner exit does not raise either
    assert finished == ["engine", "trainer"]
    with interrupts.signals_held():  # raised once: a later save runs undisturbed
        pass


def test_a_second_signal_during_a_save_stops_it_now():
    with pytest.raises(KeyboardInterrupt, match="SIGINT"):
        with interrupts.signals_held():
            interrupts._on_signal(signal.SIGTERM, None)
            interrupts._on_signal(signal.SIGINT, None)
            pytest.fail("the second signal should have raised")
    assert interrupts.received_signal() == signal.SIGTERM  # the exit code still names the first


def test_an_error_inside_the_save_propagates_as_itself():
    with pytest.raises(OSError, match="disk full"):
        with interrupts.signals_held():
            interrupts._on_signal(signal.SIGTERM, None)
            raise OSError("disk full")
