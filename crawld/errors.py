"""Reading nested exceptions: requests wraps urllib3's, which wrap
http.client's and the socket's; what happened is usually a few levels down."""

from __future__ import annotations

from typing import Iterator


def exception_chain(exc: BaseException, limit: int = 32) -> Iterator[BaseException]:
    """``exc`` and every exception it carries (in ``args``, ``reason``,
    ``__cause__``, ``__context__``), outermost first, each once."""
    todo: list[BaseException] = [exc]
    seen: set[int] = set()
    while todo and len(seen) < limit:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend(a for a in e.args if isinstance(a, BaseException))
        reason = getattr(e, "reason", None)
        if isinstance(reason, BaseException):
            todo.append(reason)
        for nxt in (e.__cause__, e.__context__):
            if nxt is not None:
                todo.append(nxt)
