"""A --builder module that kills any worker importing it (the parent, which only checks
that it imports, is spared): a problem that can never be set up in a worker. The signal is
$FAULT_SIGNAL's (default SIGSEGV)."""

import os
import signal

from ragtune.device import measure

if "RAGTUNE_DEVICE_INDEX" in os.environ:  # set in workers only
  os.kill(os.getpid(), signal.Signals[os.environ.get("FAULT_SIGNAL", "SIGSEGV")])

build = measure.build_op
