"""A flag a signal handler raises must never deadlock its own thread (noded.util.signalflag):
``noded run --sim`` hung at a third SIGTERM, its handler's ``Event.set`` waiting on the lock
the interrupted ``Event.set`` held."""

import subprocess
import sys

# The main thread sets and clears the flag in a loop while a timer's signal, every 50 µs,
# raises it from a handler: whatever bytecode the handler lands on, it must return.
HAMMER = '''
import signal, sys, threading, time
from noded.util.signalflag import SignalFlag

flag = SignalFlag() if sys.argv[1] == "SignalFlag" else threading.Event()
signal.signal(signal.SIGALRM, lambda *_: flag.set())
signal.setitimer(signal.ITIMER_REAL, 0.00005, 0.00005)
end = time.monotonic() + 3
while time.monotonic() < end:
    flag.set()
    flag.clear()
    flag.wait(0)
signal.setitimer(signal.ITIMER_REAL, 0)
print("done")
'''


def run(kind: str):
    return subprocess.run([sys.executable, "-c", HAMMER, kind], capture_output=True, text=True, timeout=30)


def test_a_handler_raising_the_flag_wherever_the_main_thread_is_never_deadlocks():
    p = run("SignalFlag")
    assert p.returncode == 0 and p.stdout == "done\n", p.stderr


def test_the_flag_wakes_a_waiter_in_another_thread_and_stays_raised_until_cleared():
    import threading
    import time

    from noded.util.signalflag import SignalFlag

    flag, woke = SignalFlag(), []
    waiter = threading.Thread(target=lambda: woke.append(flag.wait(10)))
    waiter.start()
    flag.set()
    waiter.join(5)
    assert woke == [True] and flag.is_set() and flag.wait(0)
    flag.clear()
    began = time.monotonic()
    assert not flag.is_set() and flag.wait(0.05) is False and time.monotonic() - began >= 0.04
    flag.set()
    flag.set()  # twice: one wake-up, no error
    assert flag.wait(0)
    flag.close()
