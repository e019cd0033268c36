"""The wait of a gated job (`runner.Job.gated`) for the parent's go. Standard library only: the
plain jobs loaded by path (the timing run) load it by path too."""

import json
import os
import time

#: seconds between looks for the parent's go (`wait_for_go`)
GO_POLL = 0.002


def wait_for_go(path: str) -> dict:
    """Wait until the parent lets a gated job go on (`runner.Job.gated`: the file `path`, written
    whole before it appears) and return what it granted."""
    while not os.path.exists(path):
        time.sleep(GO_POLL)
    with open(path, encoding="utf-8") as file:
        return json.load(file)
