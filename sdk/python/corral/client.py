"""The corral client: one server, one API key; sandboxes, tasks,
snapshots and templates."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from ._http import DEFAULT_TIMEOUT, Transport, quote
from .errors import NotFoundError
from .models import Record

# Seconds for calls that copy a sandbox's files or wait for admission.
SLOW_TIMEOUT = 600.0


class Client:
    """A client of one corral server.

    Configuration comes from the arguments, else the environment, as for
    the CLI: ``url`` (``CORRAL_URL``, default ``http://127.0.0.1:7420``),
    ``api_key`` (``CORRAL_API_KEY``; for a local server without one, the
    admin key in ``CORRAL_DATA``/admin.key, default /var/lib/corral),
    ``ca_file`` (``CORRAL_CA_FILE``: a PEM file of CAs to trust for an
    ``https://`` server, instead of the system's). ``timeout`` bounds each
    REST call in seconds (command streams have their own). A Client is
    safe to share between threads.
    """

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, *,
                 ca_file: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT,
                 data_dir: Optional[str] = None) -> None:
        self._t = Transport(url, api_key, ca_file=ca_file, timeout=timeout, data_dir=data_dir)

    @property
    def url(self) -> str:
        """The server URL."""
        return self._t.url

    def __repr__(self) -> str:
        return f"corral.Client({self._t.url!r})"

    # -- sandboxes --------------------------------------------------------

    def sandbox(self, *args: Any, **kwargs: Any):
        """Creates a sandbox with this client: ``Sandbox(*args, client=self, **kwargs)``."""
        from .sandbox import Sandbox
        return Sandbox(*args, client=self, **kwargs)

    def connect(self, sandbox_id: str):
        """Returns a :class:`Sandbox` for a sandbox that exists (created
        elsewhere); :class:`SandboxNotFound` if it does not."""
        from .sandbox import Sandbox
        return Sandbox.connect(sandbox_id, client=self)

    def get_sandbox(self, sandbox_id: str) -> Record:
        """The sandbox object, running or ended (GET /v1/sandboxes/{id})."""
        from .sandbox import sandbox_not_found
        try:
            return Record(self._t.call("GET", "/v1/sandboxes/" + quote(sandbox_id)))
        except NotFoundError as e:
            raise sandbox_not_found(e) from None

    def list_sandboxes(self, state: Optional[str] = None,
                       metadata: Optional[Mapping[str, str]] = None) -> List[Record]:
        """Sandboxes, newest first; state is ``running``, ``paused``,
        ``ended`` or ``all`` (default: running and paused); metadata keeps
        those with all these pairs."""
        q: Dict[str, Any] = {"state": state}
        for k, v in (metadata or {}).items():
            q["metadata." + k] = v
        out = self._t.call("GET", "/v1/sandboxes", query=q) or {}
        return [Record(s) for s in out.get("sandboxes") or []]

    def kill_sandbox(self, sandbox_id: str) -> Record:
        """Kills a sandbox and returns it ended; :class:`SandboxNotFound`
        if it is unknown or already ended."""
        from .sandbox import sandbox_not_found
        try:
            return Record(self._t.call("DELETE", "/v1/sandboxes/" + quote(sandbox_id), timeout=SLOW_TIMEOUT))
        except NotFoundError as e:
            raise sandbox_not_found(e) from None

    # -- tasks ------------------------------------------------------------

    def create_task(self, **budgets: Any):
        """Creates a task: ``Task(client=self, **budgets)``."""
        from .tasks import Task
        return Task(client=self, **budgets)

    def get_task(self, task_id: str):
        """Returns the task ``task_id`` (:class:`NotFoundError` if unknown)."""
        from .tasks import Task
        return Task.get(task_id, client=self)

    def list_tasks(self, state: Optional[str] = None) -> List[Record]:
        """Tasks; state is ``open``, ``tripped``, ``ended`` or ``all``
        (default: open and tripped)."""
        out = self._t.call("GET", "/v1/tasks", query={"state": state}) or {}
        return [Record(t) for t in out.get("tasks") or []]

    # -- snapshots and templates -------------------------------------------

    def list_snapshots(self, sandbox: Optional[str] = None, name: Optional[str] = None) -> List[Record]:
        """Snapshots, newest first, of one sandbox or name when given."""
        out = self._t.call("GET", "/v1/snapshots", query={"sandbox": sandbox, "name": name}) or {}
        return [Record(s) for s in out.get("snapshots") or []]

    def get_snapshot(self, snapshot_id: str) -> Record:
        """The snapshot ``snapshot_id``."""
        return Record(self._t.call("GET", "/v1/snapshots/" + quote(snapshot_id)))

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Deletes a snapshot (hidden at once, its files removed when
        nothing uses them)."""
        self._t.call("DELETE", "/v1/snapshots/" + quote(snapshot_id))

    def list_templates(self, name: Optional[str] = None) -> List[Record]:
        """Templates the caller may use (published ones and its team's)."""
        out = self._t.call("GET", "/v1/templates", query={"name": name}) or {}
        return [Record(t) for t in out.get("templates") or []]

    def get_template(self, ref: str) -> Record:
        """The template ``NAME`` (its current version) or ``NAME:VERSION``."""
        return Record(self._t.call("GET", "/v1/templates/" + quote(ref)))

    def delete_template(self, ref: str) -> None:
        """Deletes template version ``NAME:VERSION`` (:class:`ConflictError`
        while in use)."""
        self._t.call("DELETE", "/v1/templates/" + quote(ref))
