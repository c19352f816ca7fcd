"""SIGTERM as an ordinary exit, for the deployment tests: `finally` blocks
run and clean up what the test started (a second SIGTERM is ignored, so
that cleanup is not cut short).

    on_sigterm.exit_cleanly()
"""

import signal
import sys


def _terminate(*_):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit("terminated")


def exit_cleanly():
    signal.signal(signal.SIGTERM, _terminate)
