"""Progress bars for long runs (tqdm, from the `lab` extra); silent when disabled or missing."""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any, Protocol


class Progress(Protocol):
    def update(self, n: int = 1) -> Any: ...

    def set_postfix_str(self, text: str) -> Any: ...

    def close(self) -> Any: ...


class _Silent:
    def update(self, n: int = 1) -> None:
        return None

    def set_postfix_str(self, text: str) -> None:
        return None

    def close(self) -> None:
        return None


class Bar:
    """`with Bar(total, "profile x") as bar: bar.update()`."""

    def __init__(self, total: int, desc: str, *, enabled: bool = True, unit: str = "req") -> None:
        self._bar: Progress = _Silent()
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._bar = tqdm(
                total=total,
                desc=desc,
                unit=unit,
                file=sys.stderr,
                leave=False,
                dynamic_ncols=True,
                mininterval=0.5,
            )

    def update(self, n: int = 1) -> None:
        self._bar.update(n)

    def note(self, text: str) -> None:
        self._bar.set_postfix_str(text)

    def __enter__(self) -> Bar:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._bar.close()
