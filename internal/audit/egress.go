package audit

import (
	"github.com/corralhq/corral/internal/egress"
)

// The stored form of egress events, shared by the control plane's local
// gateway and the cluster egress proxy (internal/egressd), which record
// into one audit log.

// EgressKind names an egress event in the audit log: "egress.dns" for DNS
// queries, "egress.tcp" for raw connections, "egress.connect" for tunnels
// (CONNECT, transparent TLS), "egress.http" for HTTP requests (plain, or
// read from an intercepted TLS connection).
func EgressKind(ev egress.Event) string {
	switch {
	case ev.Mode == egress.EventDNS:
		return "egress.dns"
	case ev.Mode == egress.EventRaw:
		return "egress.tcp"
	case ev.Method == "CONNECT" || ev.Method == "TLS":
		return "egress.connect"
	}
	return "egress.http"
}

// EgressData is the stored form of an egress event. Secrets lists the
// names of secrets injected, never values.
func EgressData(ev egress.Event) map[string]any {
	d := map[string]any{
		"mode": ev.Mode, "host": ev.Host, "addr": ev.Addr, "port": ev.Port, "method": ev.Method,
		"bytes_up": ev.BytesUp, "bytes_down": ev.BytesDown, "duration_ms": ev.Duration.Milliseconds(),
		"verdict": ev.Verdict, "reason": ev.Reason,
	}
	if len(ev.Secrets) > 0 {
		d["secrets"] = ev.Secrets
	}
	if ev.Intercepted {
		d["intercepted"] = true
	}
	return d
}

// SummaryData is the stored form of an egress.summary event: the window,
// how many refusals were recorded one by one and how many only counted,
// by mode, and the top names and reasons.
func SummaryData(s egress.Summary) map[string]any {
	return map[string]any{
		"window_start": s.Start.UTC(), "window_end": s.End.UTC(),
		"recorded": s.Recorded, "suppressed": s.Suppressed, "by_mode": s.ByMode,
		"top_names": s.TopNames, "top_reasons": s.TopReasons,
	}
}
