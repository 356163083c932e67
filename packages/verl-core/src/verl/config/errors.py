"""Configuration problems: every one found is reported at once, each with its key and a fix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Literal, Optional, Sequence


@dataclass(frozen=True)
class ConfigProblem:
    key: str  # dotted key path, e.g. "actor.ppo_mini_batch_size"; "" for the file as a whole
    message: str  # what is wrong
    fix: str = ""  # what would fix it
    severity: Literal["error", "warning"] = "error"
    location: Optional[str] = None  # "recipes/x.yaml:12:3" when known

    def format(self) -> str:
        where = f"{self.location}: " if self.location else ""
        key = f"{self.key}: " if self.key else ""
        fix = f"\n    fix: {self.fix}" if self.fix else ""
        return f"{self.severity}: {where}{key}{self.message}{fix}"


class ConfigError(Exception):
    """Raised with every error-severity problem found; warnings ride along for display."""

    def __init__(self, problems: Iterable[ConfigProblem]):
        self.problems: List[ConfigProblem] = list(problems)
        super().__init__(self.__str__())

    @property
    def errors(self) -> List[ConfigProblem]:
        return errors(self.problems)

    def __str__(self) -> str:
        n = len(self.errors)
        head = f"{n} configuration error{'s' if n != 1 else ''}:"
        return "\n".join([head] + [p.format() for p in self.problems])


def errors(problems: Sequence[ConfigProblem]) -> List[ConfigProblem]:
    return [p for p in problems if p.severity == "error"]
