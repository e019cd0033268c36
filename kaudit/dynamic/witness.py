"""The parent's own clock on a timing job's trials (`kaudit.dynamic.timing`).

The timing job measures in the kernel's process, where a hostile kernel can reach everything: it
can find the job's list of per-trial times (with `gc`, or in the frames of its caller) and rewrite
it, or do its real work where no timer runs (between two trials). So the parent keeps a witness:
a Unix socket (`SOCK_SEQPACKET`) in a folder of its own that the job connects to before the
kernel file is imported, and on which it marks the start and the end of each alternating trial
(`harness/timing_job.py`). The operating system stamps each mark as it is sent
(`SO_TIMESTAMPNS`), so the stamps say when the job sent it, however late the parent reads it; the
kernel can add marks or keep the job's from arriving, but not change a stamp.

From the stamps and the job's reported times, `judge_trials`:
- KD405 (error) when the marks are not exactly the ones the trials make (missing, extra, out of
  order, while the job did connect): something else wrote to the socket or took it over;
- KD405 (error) when a model's reported trial times differ from the brackets the stamps show by
  more than FORGED_SLACK_MS and FORGED_SHARE of the bracket (median over the trials): an honest
  report lies inside its bracket, within the few microseconds the two marks take, so the times
  were rewritten after they were measured;
- KD405 (warning) when the time between two of the candidate's trials exceeds the time between two
  of the reference's (medians; the trials alternate in pairs, RC CR RC ..., so both occur) by more
  than MOVED_SLACK_MS and MOVED_SHARE of the candidate's own trial time: what happens between
  trials is the same for both models (fresh inputs, the flush, synchronisation, freeing outputs of
  the same size), so the candidate did work where no timer runs, before its trials or after them.
  A warning: it is measured on a shared machine, and an honest kernel may free more after its calls.
"""

from __future__ import annotations

import os
import socket
import statistics
import struct
import threading
import time
from pathlib import Path
from typing import Any

from kaudit.dynamic import scratch
from kaudit.dynamic.judge import Adder
from kaudit.findings import Level

#: Linux's SO_TIMESTAMPNS (asm-generic, also x86 and arm); Python's socket module lacks it
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
#: a reported time may differ from its bracket by this much (the marks' own cost, a preemption;
#: honest fixtures on a busy 2-core CPU: 5 to 30 us)
FORGED_SLACK_MS, FORGED_SHARE = 0.1, 0.2
#: the candidate's time between trials may exceed the reference's by this much (honest fixtures
#: on a busy 2-core CPU: up to 0.1 ms, a Triton kernel under the interpreter)
MOVED_SLACK_MS, MOVED_SHARE = 0.25, 0.5
#: seconds the reader waits for the last marks once the job has ended
DRAIN_TIMEOUT = 10.0
#: seconds between two reads of the socket: the job's socket buffer holds ~250 marks, so a job
#: sends marks without waiting unless it makes 60 trials in this time
POLL_S = 0.002
MARK_BYTES = 64
#: marks kept at most (an honest job sends four per trial, at most 1,200 by default): a kernel
#: flooding the socket fills no more of kaudit's memory, and its marks no longer match
MAX_MARKS = 100_000
#: the longest path a Unix socket address holds (108 bytes with the final NUL on Linux)
SOCKET_PATH_BYTES = 100


class Unavailable(OSError):
    """No witness socket here (no Unix sockets, or no kernel timestamps on them)."""


class Witness:
    """The socket a timing job marks its trials on; `marks()` once the job has ended.

        with Witness() as witness:
            job = replace(job, args={**job.args, "marks": witness.path},
                          visible=(*job.visible, witness.folder))
            ... run the job ...
            marks = witness.marks()
    """

    def __init__(self) -> None:
        self.folder = str(scratch.folder())
        self.path = os.path.join(self.folder, "s")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._done, self._closed = threading.Event(), threading.Event()
        self._marks: list[tuple[str, int]] = []
        self.connected = False
        try:
            _bind(self._listener, self.path)
            self._listener.listen(1)
            _stamped(self._listener)
        except OSError as exc:
            self.close()
            raise Unavailable(f"no witness socket: {exc}") from exc
        self._reader = threading.Thread(target=self._read, name="witness", daemon=True)
        self._reader.start()

    def __enter__(self) -> Witness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def marks(self) -> list[tuple[str, int]]:
        """The marks the job sent, with their stamps in nanoseconds; call once the job ended."""
        self._done.set()
        self._reader.join(DRAIN_TIMEOUT)
        return list(self._marks)

    def judge(self, add: Adder, info: dict, metrics: dict) -> bool:
        """`judge_trials` on the marks, once the job has ended (a job that could not connect,
        before any code of the kernel ran, leaves its trials unwitnessed: said in `metrics`)."""
        marks = self.marks()
        if not self.connected:
            metrics["witness"] = "the timing job could not connect: its trials are unwitnessed"
            return False
        return judge_trials(add, info, marks, metrics)

    def close(self) -> None:
        self._done.set()
        self._closed.set()
        self._listener.close()
        scratch.remove(Path(self.folder))

    def _read(self) -> None:
        """Drains the socket every POLL_S without waiting on it: a reader woken by each mark
        would take the CPU from the job inside its trials, on a busy machine."""
        channel = None
        self._listener.setblocking(False)
        try:
            while not self._closed.is_set():
                ended = self._done.is_set()  # before draining: what the job sent is all there
                if channel is None:
                    try:
                        channel, _ = self._listener.accept()
                    except BlockingIOError:
                        if ended:
                            return
                        time.sleep(POLL_S)
                        continue
                    self._listener.close()  # one connection: the job's, made first
                    channel.setblocking(False)
                    _stamped(channel)
                    self.connected = True
                if not self._drain(channel) or ended:
                    return
                time.sleep(POLL_S)
        except OSError:
            return  # closed under it
        finally:
            if channel is not None:
                channel.close()

    def _drain(self, channel: socket.socket) -> bool:
        """Read every mark there is; False once the job closed its end (or sent too many)."""
        while True:
            try:
                data, ancillary, _, _ = channel.recvmsg(MARK_BYTES, socket.CMSG_SPACE(16))
            except BlockingIOError:
                return True
            if not data or len(self._marks) >= MAX_MARKS:
                return False
            self._marks.append((data.decode("ascii", "replace"), _stamp(ancillary)))


def _bind(listener: socket.socket, path: str) -> None:
    """Bind to `path`, through the folder's descriptor (/proc/self/fd/N/NAME) when the path is
    longer than a socket address holds (a deep TMPDIR); the job connects the same way."""
    if len(path.encode()) < SOCKET_PATH_BYTES:
        listener.bind(path)
        return
    folder = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
    try:
        listener.bind(f"/proc/self/fd/{folder}/{os.path.basename(path)}")
    finally:
        os.close(folder)


def _stamped(channel: socket.socket) -> None:
    channel.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)


def _stamp(ancillary: list) -> int:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            seconds, nanoseconds = struct.unpack("@qq", data[:16])
            return seconds * 1_000_000_000 + nanoseconds
    return -1  # unstamped: refused as a mark that does not belong


def expected_marks(trials: int) -> list[str]:
    """The marks of `trials` alternating trials (`_robust` in the timing job)."""
    marks = []
    for t in range(trials):
        for name in ("reference", "candidate") if t % 2 == 0 else ("candidate", "reference"):
            marks += [f"{t} {name} start", f"{t} {name} end"]
    return marks


def judge_trials(add: Adder, info: dict, marks: list[tuple[str, int]], metrics: dict) -> bool:
    """KD405 from the marks of a robust timing run (see the module docstring); True when the
    reported times cannot be used. What it saw goes into `metrics["witness"]`."""
    trials = int(info.get("trials", 0))
    reported = {name: info.get(name) or [] for name in ("reference", "candidate")}
    labels = [label for label, _ in marks]
    if labels != expected_marks(trials) or any(stamp < 0 for _, stamp in marks) or \
            any(len(reported[name]) != trials for name in reported):
        add("KD405", f"tampering: the timing run's trial marks on kaudit's own clock do not "
            f"match its trials: {len(marks)} marks for {trials} trials of each model (expected "
            f"{4 * trials}), first difference at {_first_difference(labels, trials)}: something "
            "else wrote to the job's channel to kaudit, or took it over", reason="timing-marks")
        return True
    brackets, gaps = _brackets(marks)
    seen: dict[str, Any] = {"trials": trials}
    forged = []
    for name in ("candidate", "reference"):
        walls = [float(t["wall"]) for t in reported[name]]
        observed = brackets[name]
        drift = statistics.median(w - o for w, o in zip(walls, observed))
        bracket = statistics.median(observed)
        seen[name] = {"reported_ms": round(statistics.median(walls), 6),
                      "bracket_ms": round(bracket, 6), "drift_ms": round(drift, 6)}
        if abs(drift) > max(FORGED_SLACK_MS, FORGED_SHARE * bracket):
            forged.append((name, statistics.median(walls), bracket))
    metrics["witness"] = seen
    if forged:
        add("KD405", "tampering: the timing run reported times its trials did not take: " +
            "; ".join(f"the {name}'s median {reported_ms:.4g} ms, while kaudit's clock saw its "
                      f"trials take {bracket:.4g} ms" for name, reported_ms, bracket in forged) +
            " (marks stamped by the operating system as the job sent them): the per-trial times "
            "were rewritten after they were measured", reason="timing-forged",
            forged=[name for name, _, _ in forged])
        return True
    between = _between(gaps)
    seen["between_ms"] = {k: round(v, 6) for k, v in between.items()}
    extra = between["candidate-candidate"] - between["reference-reference"]
    candidate = seen["candidate"]["bracket_ms"]
    if extra > max(MOVED_SLACK_MS, MOVED_SHARE * candidate):
        add("KD405", f"work outside the timed calls: {extra:.4g} ms more pass between two of the "
            f"candidate's trials than between two of the reference's (medians), against "
            f"{candidate:.4g} ms inside its timed calls: the kernel may do its work where the "
            f"timer does not run (a finaliser, a hook between calls); counting it, its trials "
            f"would take {candidate + extra:.4g} ms", level=Level.WARNING,
            reason="timing-moved-work", outside_ms=round(extra, 6))
    return False


def _first_difference(labels: list[str], trials: int) -> str:
    expected = expected_marks(trials)
    for index, (got, want) in enumerate(zip(labels, expected)):
        if got != want:
            return f"mark {index + 1} ({got[:40]!r} for {want!r})"
    if len(labels) == len(expected):
        return "the trial counts"
    return f"mark {min(len(labels), len(expected)) + 1} (" + (
        f"{labels[len(expected)][:40]!r} more" if len(labels) > len(expected)
        else f"{expected[len(labels)]!r} missing") + ")"


def _brackets(marks: list[tuple[str, int]]) -> tuple[dict, list]:
    """Per model, each trial's bracket (ms, in trial order); and the trials in order as (model,
    start ns, end ns)."""
    brackets: dict[str, list[float]] = {"reference": [], "candidate": []}
    order = []
    for (label, start), (_, end) in zip(marks[::2], marks[1::2]):
        name = label.split()[1]
        brackets[name].append((end - start) / 1e6)
        order.append((name, start, end))
    return brackets, order


def _between(order: list[tuple[str, int, int]]) -> dict[str, float]:
    """Median milliseconds between two trials, by the models before and after: the trials
    alternate in pairs (RC CR RC ...), so each of the four kinds of gap occurs."""
    gaps: dict[str, list[float]] = {}
    for (first, _, end), (second, start, _) in zip(order, order[1:]):
        gaps.setdefault(f"{first}-{second}", []).append((start - end) / 1e6)
    return {f"{a}-{b}": statistics.median(gaps[f"{a}-{b}"]) if gaps.get(f"{a}-{b}") else 0.0
            for a in ("candidate", "reference") for b in ("candidate", "reference")}
