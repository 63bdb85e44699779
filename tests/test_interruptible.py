"""run_interruptible: a signal ends a long measurement by winding it down,
never by an exception thrown into whatever the main thread was running.

The subprocess tests that send real signals live beside the commands that use
this (test_capacity.py, test_sweep.py); these check the handler's contract
in-process, on the main thread, where pytest runs its tests."""

from __future__ import annotations

import signal
import threading

import pytest

from ernie_tui.cli.interruptible import run_interruptible


@pytest.fixture
def sigint_at_default():
    """Ctrl-C is caught only where SIGINT is at Python's default; a test run
    started in the background (as CI's is) inherits it ignored."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_the_installed_handler_only_records_so_no_exception_lands_in_threadings_lock_code(sig, capsys,
                                                                                           sigint_at_default):
    # On an H200 a deadline's SIGTERM reached the main thread inside
    # Event.wait, while it took its Condition's lock back; the handler raised
    # there, the lock was then released twice ("RuntimeError: release unlocked
    # lock") and the search died with its levels instead of winding down.
    # Whatever instant the signal comes at, its handler must not raise: run
    # it here as the interpreter would, and the measurement must still wind
    # down through `cancel` and hand back what it kept.
    cancel = threading.Event()
    handler_raised: list[BaseException] = []

    def work() -> str:
        try:
            signal.getsignal(sig)(sig, None)
        except BaseException as exc:  # noqa: BLE001  the defect under test
            handler_raised.append(exc)
            raise
        assert cancel.wait(10), "the main thread never asked the work to wind down"
        return "levels kept"

    assert run_interruptible(work, cancel, name="t", on_interrupt="ending the running level") == "levels kept"
    assert not handler_raised
    how = "interrupted" if sig == signal.SIGINT else f"ended by {signal.Signals(sig).name}"
    assert f"ernie-tui: {how}: ending the running level" in capsys.readouterr().err


def test_the_handlers_before_it_are_back_afterwards_and_an_ignored_sigint_stays_ignored():
    # A job started in the background has SIGINT ignored: Ctrl-C at the
    # terminal is not meant for it, and catching it would change that.
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    seen: dict[int, object] = {}
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        def work() -> int:
            seen.update({s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)})
            return 7

        assert run_interruptible(work, threading.Event(), name="t", on_interrupt="x") == 7
        assert seen[signal.SIGINT] is signal.SIG_IGN
        assert callable(seen[signal.SIGTERM]) and seen[signal.SIGTERM] is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, old_int)
    assert {s: signal.getsignal(s) for s in before} == before


def test_the_works_own_error_is_raised_on_the_main_thread():
    def work() -> None:
        raise ValueError("the server went away")

    with pytest.raises(ValueError, match="went away"):
        run_interruptible(work, threading.Event(), name="t", on_interrupt="x")
