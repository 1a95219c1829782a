"""Tasks: an agent session with budgets and a circuit breaker."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ._http import quote
from .models import Record


class Task:
    """A task: the sandboxes and tool calls of one agent run, with
    budgets and a circuit breaker (docs/brakes.md).

    ``Task(max_calls=20, max_tokens=100_000)`` creates one; give it to
    ``Sandbox(task=...)``. Zero or omitted budgets take the server's
    defaults. When a budget is spent, calls in the task's sandboxes raise
    :class:`BudgetExhausted`; repeated near-identical calls raise
    :class:`LoopDetected`. Used as a context manager the task is ended on
    exit (its sandboxes are killed).
    """

    def __init__(self, *, agent: Optional[str] = None, max_calls: Optional[int] = None,
                 max_duration_s: Optional[int] = None, max_tokens: Optional[int] = None,
                 max_sandboxes: Optional[int] = None, max_cpu_seconds: Optional[float] = None,
                 on_trip: Optional[str] = None, artifacts: Optional[List[str]] = None,
                 no_loop_check: Optional[bool] = None, client=None,
                 url: Optional[str] = None, api_key: Optional[str] = None,
                 _info: Optional[Dict[str, Any]] = None) -> None:
        from .client import Client
        self._client = client or Client(url, api_key)
        if _info is not None:
            self._info = Record(_info)
            return
        body = {k: v for k, v in {
            "agent": agent, "max_calls": max_calls, "max_duration_s": max_duration_s,
            "max_tokens": max_tokens, "max_sandboxes": max_sandboxes,
            "max_cpu_seconds": max_cpu_seconds, "on_trip": on_trip, "artifacts": artifacts,
            "no_loop_check": no_loop_check,
        }.items() if v is not None}
        self._info = Record(self._client._t.call("POST", "/v1/tasks", body))

    @classmethod
    def get(cls, task_id: str, client=None) -> "Task":
        """The task ``task_id``."""
        from .client import Client
        client = client or Client()
        return cls(client=client, _info=client._t.call("GET", "/v1/tasks/" + quote(task_id)))

    def __repr__(self) -> str:
        return f"<corral.Task {self.id} {self.state}>"

    def __enter__(self) -> "Task":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.state != "ended":
            self.end()

    @property
    def id(self) -> str:
        """The task's id."""
        return self._info.get("id", "")

    @property
    def info(self) -> Record:
        """The task object as last fetched (budgets, usage, breaker, ...)."""
        return self._info

    @property
    def state(self) -> str:
        """``open``, ``tripped`` (a breaker is open) or ``ended``, as last fetched."""
        return self._info.get("state", "")

    @property
    def budgets(self) -> Record:
        return Record(self._info.get("budgets") or {})

    @property
    def usage(self) -> Record:
        """What the task spent: ``calls``, ``tokens``, ``cpu_seconds``, ``sandboxes_created``."""
        return Record(self._info.get("usage") or {})

    @property
    def breaker(self) -> Record:
        """The breaker: ``open``, ``code``, ``budget``, ``reason``, ``at``."""
        return Record(self._info.get("breaker") or {})

    def refresh(self) -> "Task":
        """Fetches the task again."""
        self._info = Record(self._client._t.call("GET", "/v1/tasks/" + quote(self.id)))
        return self

    def report_tokens(self, tokens: int) -> "Task":
        """Adds model tokens the agent spent to the task's count; past
        ``max_tokens`` the breaker opens and the next call is refused."""
        self._info = Record(self._client._t.call("POST", "/v1/tasks/" + quote(self.id) + "/tokens",
                                                 {"tokens": int(tokens)}))
        return self

    def change(self, *, reset: bool = False, **budgets: Any) -> "Task":
        """An operator's change: new budgets (``max_calls=100``, ...) and,
        with ``reset=True``, the breaker closed."""
        body = {k: v for k, v in budgets.items() if v is not None}
        if reset:
            body["reset"] = True
        self._info = Record(self._client._t.call("PATCH", "/v1/tasks/" + quote(self.id), body))
        return self

    def end(self) -> "Task":
        """Ends the task: its sandboxes are killed, further calls refused
        with :class:`TaskEnded`."""
        self._info = Record(self._client._t.call("DELETE", "/v1/tasks/" + quote(self.id)))
        return self
