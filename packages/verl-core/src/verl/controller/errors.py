"""WorkerError: an exception raised in a worker method, as the driver sees it (role, ranks, method, traceback)."""

from __future__ import annotations

import pickle
import re
from collections.abc import Mapping, Sequence

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Ray's header names the process: "ray::Cls.method() (pid=.., ip=.., actor_id=.., repr=<.. at 0x..>)".
_RAY_PROCESS = re.compile(r"\(pid=\d+[^)]*\)")
# Ray underlines its header with caret-only lines that point at nothing.
_RAY_HEADER_CARETS = re.compile(r"(ray::\S+\(\) \(pid=[^\n]*\n)(?:[ \t]*\^+[ \t]*\n)+")


class WorkerError(RuntimeError):
    """A worker method failed on one or more ranks.

    The message names the role, the method, the failed ranks and holds each worker's traceback text
    (ranks whose tracebacks are the same are shown once). `causes` maps a failed rank to the original
    exception object when it could be recovered (None when the worker process died).
    """

    def __init__(
        self,
        role: str,
        method: str,
        tracebacks: Mapping[int, str],
        causes: Mapping[int, BaseException | None] | None = None,
        world_size: int | None = None,
        unfinished: Sequence[int] = (),
    ) -> None:
        self.role, self.method = role, method
        self.tracebacks = dict(sorted(tracebacks.items()))
        self.causes = dict(causes or {})
        self.world_size = world_size
        self.unfinished = tuple(unfinished)
        super().__init__(self._message())

    @property
    def ranks(self) -> list[int]:
        return list(self.tracebacks)

    def _message(self) -> str:
        of = f" (of {self.world_size})" if self.world_size is not None else ""
        ranks = ", ".join(map(str, self.ranks))
        noun = "rank" if len(self.ranks) == 1 else "ranks"
        lines = [f"role '{self.role}': method '{self.method}' failed on {noun} {ranks}{of}"]
        if self.unfinished:
            waiting = "rank" if len(self.unfinished) == 1 else "ranks"
            lines.append(
                f"{waiting} {', '.join(map(str, self.unfinished))} had not finished when this was raised "
                "(they may be waiting on a collective with a failed rank)"
            )
        for same_ranks, text in _group_same(self.tracebacks):
            label = f"rank {same_ranks[0]}" if len(same_ranks) == 1 else f"ranks {', '.join(map(str, same_ranks))}"
            lines += ["", f"--- {label}: worker traceback ---", text.rstrip()]
        return "\n".join(lines)

    def __reduce__(self):
        causes = {rank: cause for rank, cause in self.causes.items() if _picklable(cause)}
        args = (self.role, self.method, self.tracebacks, causes, self.world_size, self.unfinished)
        return (type(self), args)


def clean_traceback(text: str) -> str:
    """Ray's error text without terminal colours and the caret lines under its `ray::Cls.method() (pid=...)` header."""
    return _RAY_HEADER_CARETS.sub(r"\1", _ANSI.sub("", text)).strip()


def _group_same(tracebacks: Mapping[int, str]) -> list[tuple[list[int], str]]:
    """Ranks grouped by traceback text, ignoring which process raised it (pid, ip and actor id differ)."""
    groups: dict[str, tuple[list[int], str]] = {}
    for rank, text in tracebacks.items():
        key = _RAY_PROCESS.sub("", text).strip()
        groups.setdefault(key, ([], text))[0].append(rank)
    return list(groups.values())


def _picklable(obj: object) -> bool:
    try:
        pickle.dumps(obj)
    except (pickle.PicklingError, TypeError, AttributeError):
        return False
    return True
