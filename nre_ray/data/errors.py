"""Errors about bad input data, written for the person who has to fix the data.

A :class:`Problem` points at one place in one input file (``FILE:LINE: field: message``);
a :class:`DataError` carries one or more of them and renders the first few, followed by a
hint line that says what to do next.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MAX_SHOWN = 20
"""How many problems ``str(DataError)`` lists before summarising the rest."""

ROW_HINT = (
    "Fix the rows listed above in the input file(s), "
    "or pass --on-bad-rows skip to leave bad rows out (they are counted and reported)."
)
"""The hint used when :class:`DataError` is given none: the problems are about rows."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input, located as precisely as we can.

    Attributes:
        file: the file as the user named it ("" when unknown).
        line: 1-based physical line in ``file`` where the offending record starts,
            or ``None`` for problems with the whole file.
        field: the column / field concerned (``"head_offset"``, ``"relation"``, ...) or ``None``.
        message: what is wrong, ideally with what was expected and what was found.
    """

    file: str
    line: int | None
    field: str | None
    message: str

    def __str__(self) -> str:
        """Render as ``FILE:LINE: field: message``, leaving out the parts that are unknown."""
        location = self.file or ""
        if self.line is not None:
            location = f"{location}:{self.line}" if location else f"line {self.line}"
        parts = [part for part in (location, self.field) if part]
        parts.append(self.message)
        return ": ".join(parts)


class DataError(Exception):
    """Bad input data (a missing file, a bad header, bad rows, ...).

    ``str(err)`` lists the first :data:`MAX_SHOWN` problems, one per line, then
    ``... and N more problems`` when there are more, then a hint line saying what to do
    (by default: fix the rows, or pass ``--on-bad-rows skip``).
    """

    def __init__(
        self, problems: Iterable[Problem] | Problem, hint: str | None = None, total: int | None = None
    ) -> None:
        """Create the error from the problems found (a single :class:`Problem` is accepted too).

        ``total``: how many problems there are in all, when ``problems`` holds only the first of them (a large input
        need not keep every problem to report them; ``self.total`` is never less than ``len(problems)``).
        """
        if isinstance(problems, Problem):
            problems = [problems]
        self.problems: list[Problem] = list(problems)
        self.hint: str = ROW_HINT if hint is None else hint
        self.total: int = max(total or 0, len(self.problems))
        super().__init__(self._render())

    def __reduce__(self) -> tuple[type[DataError], tuple[list[Problem], str, int]]:
        """Pickle by problems, hint and total, so the error survives a trip through Ray workers."""
        return (type(self), (self.problems, self.hint, self.total))

    def __str__(self) -> str:
        """The rendered report (see the class docstring)."""
        return self._render()

    def _render(self) -> str:
        lines = [str(problem) for problem in self.problems[:MAX_SHOWN]]
        more = self.total - min(len(self.problems), MAX_SHOWN)
        if more > 0:
            lines.append(f"... and {more} more problem{'s' if more != 1 else ''}")
        if not lines:
            lines.append("bad input data")
        if self.hint:
            lines.append(self.hint)
        return "\n".join(lines)
