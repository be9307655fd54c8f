"""Errors for bad input: each names the file, line or key it is about (exit code 2), and the
exit codes every command and every training rank uses."""

from __future__ import annotations

from dataclasses import dataclass

EXIT_OK, EXIT_FAILED, EXIT_INPUT = 0, 1, 2  # finished (or stopped on request); failed; invalid input


@dataclass
class Problem:
    message: str
    file: str | None = None
    line: int | None = None
    key: str | None = None

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = self.file + (f":{self.line}" if self.line else "")
        if self.key:
            where = f"{where}: {self.key}" if where else self.key
        return f"{where}: {self.message}" if where else self.message


class InputError(Exception):
    """One or more problems with user input. ``str()`` lists them all, one per line."""

    def __init__(self, problems: list[Problem] | Problem | str):
        if isinstance(problems, str):
            problems = [Problem(problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems: list[Problem] = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))
