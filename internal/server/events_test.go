package server

import (
	"testing"

	"github.com/corralhq/corral/internal/egress"
)

func TestEventKind(t *testing.T) {
	tests := []struct {
		ev   egress.Event
		want string
	}{
		{egress.Event{Mode: egress.EventDNS, Method: "DNS A"}, "egress.dns"},
		{egress.Event{Mode: egress.EventRaw, Method: "TCP"}, "egress.tcp"},
		{egress.Event{Mode: egress.EventExplicit, Method: "CONNECT"}, "egress.connect"},
		{egress.Event{Mode: egress.EventTransparent, Method: "TLS"}, "egress.connect"},
		{egress.Event{Mode: egress.EventTransparent, Method: "GET"}, "egress.http"},
		{egress.Event{Mode: egress.EventExplicit, Method: "POST", Intercepted: true}, "egress.http"},
	}
	for _, tc := range tests {
		if got := eventKind(tc.ev); got != tc.want {
			t.Errorf("eventKind(%s %s) = %s, want %s", tc.ev.Mode, tc.ev.Method, got, tc.want)
		}
	}
	d := eventData(egress.Event{Secrets: []string{"gh"}, Intercepted: true})
	if d["intercepted"] != true || len(d["secrets"].([]string)) != 1 {
		t.Fatalf("eventData = %v", d)
	}
}
