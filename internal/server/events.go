package server

import (
	"github.com/corralhq/corral/internal/audit"
	"github.com/corralhq/corral/internal/egress"
)

// eventKind, eventData and summaryData are audit's (one stored form for
// the local gateway and the cluster egress proxy).
func eventKind(ev egress.Event) string            { return audit.EgressKind(ev) }
func eventData(ev egress.Event) map[string]any    { return audit.EgressData(ev) }
func summaryData(s egress.Summary) map[string]any { return audit.SummaryData(s) }
