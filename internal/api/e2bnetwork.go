package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/corralhq/corral/internal/sandbox"
)

// e2bNetworkConfig is E2B's SandboxNetworkConfig (create) and
// SandboxNetworkUpdateConfig (updateNetwork).
type e2bNetworkConfig struct {
	AllowOut            []string        `json:"allowOut"`
	DenyOut             []string        `json:"denyOut"`
	Rules               json.RawMessage `json:"rules"`
	EgressProxy         json.RawMessage `json:"egressProxy"`
	AllowPublicTraffic  *bool           `json:"allowPublicTraffic"`
	MaskRequestHost     *string         `json:"maskRequestHost"`
	HTTPSPorts          json.RawMessage `json:"httpsPorts"`
	AllowInternetAccess *bool           `json:"allow_internet_access"`
}

func present(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s != "" && s != "null" && s != "{}" && s != "[]"
}

// e2bPolicy maps E2B's network options onto corral's egress policy:
//
//   - network.allowOut (IPs, CIDRs, domains, *.domains) → mode allow with
//     those entries (E2B: allow beats deny; everything else is denied).
//   - allow_internet_access false, or denyOut containing 0.0.0.0/0 → none.
//   - otherwise (internet access asked for or left to the default) → the
//     server's E2BInternet mode, "none" unless the operator chose
//     "all-public".
//
// Header-transform rules, a custom egress proxy and denyOut of specific
// ranges have no corral equivalent and are refused with a reason.
//
// nc is the body's network object, nil when it has none (parsed with the
// body by parseJSON, so that a value of the wrong kind is refused naming
// its path, network.allowOut).
func e2bPolicy(internet *bool, nc *e2bNetworkConfig, internetMode string) (string, []string, error) {
	if nc == nil {
		nc = &e2bNetworkConfig{}
	}
	if internet == nil {
		internet = nc.AllowInternetAccess
	}
	if present(nc.Rules) {
		return "", nil, errors.New("network.rules (header transforms) are not supported by corral; register a corral secret for the host instead (docs/e2b.md)")
	}
	if present(nc.EgressProxy) {
		return "", nil, errors.New("network.egressProxy is not supported by corral: egress always goes through corral's own proxy")
	}
	if len(nc.AllowOut) > 0 {
		return "allow", slices.Clone(nc.AllowOut), nil
	}
	denyAll := slices.Contains(nc.DenyOut, "0.0.0.0/0") || slices.Contains(nc.DenyOut, "::/0")
	if (internet != nil && !*internet) || denyAll {
		return "none", nil, nil
	}
	if len(nc.DenyOut) > 0 {
		return "", nil, errors.New("network.denyOut of specific ranges is not supported by corral (it is default-deny): list what the sandbox may reach in allowOut")
	}
	if internetMode == "" {
		internetMode = "none"
	}
	return internetMode, nil, nil
}

// e2bPublicTraffic returns network.allowPublicTraffic of an E2B create
// body (nil when absent: the server's default).
func e2bPublicTraffic(nc *e2bNetworkConfig) *bool {
	if nc == nil {
		return nil
	}
	return nc.AllowPublicTraffic
}

// e2bUpdateNetwork serves PUT /sandboxes/{id}/network: the body replaces
// the sandbox's whole network configuration (omitted fields are cleared).
func (s *Server) e2bUpdateNetwork(w http.ResponseWriter, r *http.Request) {
	sb, ok := s.e2bRunning(w, r)
	if !ok {
		return
	}
	var nc e2bNetworkConfig
	if !e2bBody(w, r, &nc) {
		return
	}
	mode, allow, err := e2bPolicy(nil, &nc, s.cfg.E2BInternet)
	if err != nil {
		e2bError(w, http.StatusBadRequest, err.Error())
		return
	}
	if _, err := s.mgr.SetNetwork(r.Context(), sb.ID, sandbox.NetworkRequest{Mode: mode, Allow: allow}); err != nil {
		var inv *sandbox.InvalidError
		switch {
		case errors.As(err, &inv):
			e2bError(w, http.StatusBadRequest, inv.Msg)
		case errors.Is(err, sandbox.ErrNotFound):
			e2bError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q not found", sb.ID))
		case errors.Is(err, sandbox.ErrConflict):
			e2bError(w, http.StatusConflict, err.Error())
		case errors.Is(err, sandbox.ErrNetworkUnavailable):
			e2bError(w, http.StatusServiceUnavailable, err.Error())
		default:
			s.e2bWriteErr(w, r, err)
		}
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
