"""corral: the Python SDK of corral, a self-hosted sandbox runtime for AI
agents. Standard library only.

    from corral import Sandbox

    with Sandbox(timeout=120) as sb:                  # killed on exit
        r = sb.commands.run("python3 -c 'print(6*7)'")
        print(r.stdout)                              # 42

Configuration: ``CORRAL_URL`` (default http://127.0.0.1:7420),
``CORRAL_API_KEY``, ``CORRAL_CA_FILE``; or ``Client(url, api_key)``.
See docs/python.md.
"""

from ._http import DEFAULT_URL, StreamBroken
from .client import Client
from .errors import (APIError, AuthenticationError, BrakeError, BudgetExhausted, CapacityExceeded,
                     CommandExitError, CommandTimeout, ConflictError, CorralError, ForbiddenError,
                     InvalidArgument, LoopDetected, NotFoundError, SandboxNotFound, TaskEnded,
                     TooManyStreams, UnavailableError)
from .models import (CodeContext, CommandResult, EntryInfo, Execution, ExecutionError, Logs, Record,
                     Result)
from .sandbox import CommandHandle, Commands, Files, Sandbox
from .tasks import Task
from . import tools

__version__ = "0.1.0"

__all__ = [
    "Client", "Sandbox", "Task", "Commands", "CommandHandle", "Files", "tools",
    "CommandResult", "EntryInfo", "Execution", "ExecutionError", "Result", "Logs", "CodeContext",
    "Record", "DEFAULT_URL",
    "CorralError", "APIError", "AuthenticationError", "ForbiddenError", "NotFoundError",
    "SandboxNotFound", "ConflictError", "InvalidArgument", "CapacityExceeded", "TooManyStreams",
    "BrakeError", "BudgetExhausted", "LoopDetected", "TaskEnded", "UnavailableError",
    "CommandExitError", "CommandTimeout", "StreamBroken",
]
