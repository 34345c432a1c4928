"""Failures of the environment, not of a candidate: a missing module, kernels that cannot
compile on this platform, interpret mode off on a CPU. Such an error fails every candidate
the same way, so a sweep stops on it rather than record it as each candidate's result.

classify() is the one rule (an error text -> the environment's failure, or None when the
candidate is to blame); check() asks the same before the first candidate; the pool stops on
the first row that classify() blames on the environment, in case check() missed it.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import re

from kernels import registry
from ragtune.errors import RagtuneError, install_hint

# The install that brings a missing module, by its top-level name (pyproject's extras).
INSTALLS = {"absl": install_hint("mosaic-gpu")}
NO_ACCELERATOR = "Only interpret mode is supported on CPU backend"
_MISSING = re.compile(r"\b(?:ModuleNotFoundError|ImportError): (?:No module named '([\w.]+)')?")
_PLATFORM = re.compile(re.escape(NO_ACCELERATOR) + r"|Cannot lower pallas_call on platform")
# Rows that --retry-failed measures again besides the environment's: the worker was killed
# (timeout) or died (crash), which a loaded host or the device can cause as well as the candidate.
WORKER_LOST = ("timeout", "crash")


@dataclasses.dataclass(frozen=True)
class EnvironmentFailure:
  cause: str  # what is wrong, e.g. "No module named 'absl'"
  fix: str  # what to do, e.g. the install

  def text(self) -> str:
    return f"{self.cause}; {self.fix}"


def classify(error: str) -> EnvironmentFailure | None:
  """The environment's failure an error text shows, or None when it is the candidate's own."""
  if m := _MISSING.search(error or ""):
    module = (m.group(1) or "").split(".")[0]
    install = INSTALLS.get(module)
    fix = f"install it: {install}" if install else "install the package that provides it"
    fix += ", then run the same command again"
    return EnvironmentFailure(f"a module is missing ({error[m.start() :].split(';')[0][:200]})", fix)
  if _PLATFORM.search(error or ""):
    return EnvironmentFailure(
      "the kernels cannot compile on this platform (no GPU or TPU here)",
      "run without --no-interpret (a CPU interprets them) or on a GPU/TPU host",
    )
  return None


def retryable(status: str, error: str) -> bool:
  """Whether --retry-failed measures a row again: it failed for the environment, or its
  worker was lost (timeout, crash), not for a fault the candidate surely has."""
  return status in WORKER_LOST or (status != "ok" and classify(error) is not None)


def stop_text(what: str, failure: EnvironmentFailure) -> str:
  """The one line a sweep stops with: what failed, why, and the fix; nothing is recorded for it."""
  return f"stopped before recording {what}: {failure.cause}, which fails every candidate the same way; {failure.fix}"


def _import_module(name: str):
  return importlib.import_module(name)


def check(backends: set[str], interpret: bool, platform: str) -> None:
  """Before the first candidate: the backends' kernels can compile here (or are interpreted)
  and their modules import. Raises RagtuneError with stop_text's line."""
  for name in sorted(backends):
    backend = registry.get(name)
    if backend.unavailable():  # refused with its own reason where it matters (prepare.on_device)
      continue
    if not interpret and platform not in backend.platforms:
      failure = classify(NO_ACCELERATOR if platform == "cpu" else "Cannot lower pallas_call on platform")
      raise RagtuneError(stop_text(f"any {name} row", failure))
    package = _import_module(backend.forward.__module__)
    # A backend package may import its kernel modules only on first use: import them now.
    for info in pkgutil.iter_modules(getattr(package, "__path__", [])):
      try:
        _import_module(f"{package.__name__}.{info.name}")
      except ImportError as e:
        text = f"{type(e).__name__}: {e}"
        failure = classify(text) or EnvironmentFailure(f"a module does not import ({text})", "install it")
        raise RagtuneError(stop_text(f"any {name} row", failure)) from None
