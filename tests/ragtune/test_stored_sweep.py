"""Which stored sweep a bare `ragtune sweep SHAPES -o DIR` runs (ragtune.run.resume): the
unfinished bare one if there is one, else the latest unfinished one, else the latest
finished one; only this shapes file's. Each case stores sweeps with resume.save, oldest
first, and names the one expected."""

import pytest

from ragtune.run import resume
from ragtune.run.resume import SweepFlags

BARE = SweepFlags()
NARROW = SweepFlags(ops=("fwd",))
CHEAP = SweepFlags(max_candidates=2)
DONE, OPEN = True, False


def _folder(tmp_path, *sweeps, other=()):
  """A results folder holding `sweeps` ((flags, finished), oldest first) of one shapes file,
  and `other` of another; returns (folder, shapes file)."""
  out = tmp_path / "out"
  out.mkdir(parents=True)
  shapes, elsewhere = tmp_path / "shapes.yaml", tmp_path / "other.yaml"
  shapes.write_text("problems: []\n")
  elsewhere.write_text("problems: []\n# another file\n")
  for path, stored in ((elsewhere, other), (shapes, sweeps)):
    for flags, finished in stored:
      resume.save(out, path, flags, finished=finished)
  return out, shapes


@pytest.mark.parametrize(
  "sweeps,expected",
  [
    # Two unfinished: the bare one, whether it is the older or the newer.
    pytest.param([(BARE, OPEN), (NARROW, OPEN)], BARE, id="two-open-bare-older"),
    pytest.param([(NARROW, OPEN), (BARE, OPEN)], BARE, id="two-open-bare-newer"),
    # Two unfinished with options, no bare one: the latest.
    pytest.param([(NARROW, OPEN), (CHEAP, OPEN)], CHEAP, id="two-open-flagged-a"),
    pytest.param([(CHEAP, OPEN), (NARROW, OPEN)], NARROW, id="two-open-flagged-b"),
    # A finished bare sweep is not "the unfinished bare one": the unfinished one goes on.
    pytest.param([(BARE, DONE), (NARROW, OPEN)], NARROW, id="bare-done-older"),
    pytest.param([(NARROW, OPEN), (BARE, DONE)], NARROW, id="bare-done-newer"),
    # An unfinished sweep before a later finished one.
    pytest.param([(NARROW, OPEN), (CHEAP, DONE)], NARROW, id="open-before-done"),
    # All finished: the latest, bare or not.
    pytest.param([(NARROW, DONE), (CHEAP, DONE)], CHEAP, id="all-done-a"),
    pytest.param([(BARE, DONE), (NARROW, DONE)], NARROW, id="all-done-bare-older"),
    pytest.param([(NARROW, DONE), (BARE, DONE)], BARE, id="all-done-bare-newer"),
    # Saving again makes a sweep the latest.
    pytest.param([(NARROW, OPEN), (CHEAP, OPEN), (NARROW, OPEN)], NARROW, id="saved-again"),
  ],
)
def test_the_sweep_a_bare_command_runs(tmp_path, sweeps, expected):
  out, shapes = _folder(tmp_path, *sweeps)
  assert resume.stored_sweep(out, shapes).flags == expected


def test_another_files_sweeps_do_not_count(tmp_path):
  out, shapes = _folder(tmp_path, (NARROW, OPEN), (CHEAP, DONE), other=[(BARE, OPEN)])
  assert resume.stored_sweep(out, shapes).flags == NARROW
  empty, shapes = _folder(tmp_path / "b", other=[(BARE, OPEN)])
  assert resume.stored_sweep(empty, shapes) is None


def test_options_name_their_own_sweep_whatever_the_devices(tmp_path):
  out, shapes = _folder(tmp_path, (NARROW, OPEN), (BARE, OPEN))
  assert resume.stored_sweep(out, shapes, SweepFlags(ops=("fwd",), devices="0,1")).flags == NARROW
  assert resume.stored_sweep(out, shapes, CHEAP) is None


def test_a_bare_command_resumes_the_bare_sweep_of_two_unfinished(tmp_path):
  """What the user sees: the bare sweep resumes silently, on the devices given now; with the
  bare one finished, the narrow one resumes and says so."""
  out, shapes = _folder(tmp_path, (BARE, OPEN), (NARROW, OPEN))
  assert resume.resolve(shapes, out, SweepFlags(devices="1")) == (SweepFlags(devices="1"), None)
  out, shapes = _folder(tmp_path / "b", (BARE, DONE), (NARROW, OPEN))
  flags, note = resume.resolve(shapes, out, SweepFlags())
  assert flags == NARROW and note.startswith(f"resuming the unfinished sweep of {shapes} with its options --op fwd")
