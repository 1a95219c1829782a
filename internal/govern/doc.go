// Package govern is corral's coordination layer: tasks, budgets, breakers,
// loop detection, admission.
//
// Every limit has a ceiling and every ceiling a fallback: a [LoopDetector]
// watches the recent tool calls of one task and says when the agent repeats
// itself (a "loop_suspected" warning, then "loop_detected", which opens the
// task's breaker), and [Admission] bounds how many sandboxes run at once,
// globally and per agent, refusing the excess with a [CapacityError]
// ("capacity_exceeded") that carries a Retry-After. The components here are
// pure: they keep their state in memory, take the time from an injected
// clock and record nothing themselves; callers write the audit events.
package govern
