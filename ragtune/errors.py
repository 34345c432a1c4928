def install_hint(*extras: str) -> str:
  """The one form every message gives for installing extras: the README's, from the checkout."""
  return f"python3 -m pip install -e '.[{','.join(extras)}]'"


class RagtuneError(Exception):
  """A user-facing error: the CLI prints its message on one line and exits non-zero."""
