"""How a sweep runs: the killable child processes that its workers, verify and the device probe run in."""
