// Package egressd is corral's egress proxy as a service of its own, for
// sandboxes that run elsewhere than the control plane (the kube driver's
// Pods): `corral egress-proxy`, a Deployment in the cluster. It serves
// the same internal/egress explicit proxy (HTTP and CONNECT, TLS
// interception to inject secrets) and DNS filter as the local gateway,
// and differs from it in one place only, the lookup of who is asking: a
// source Pod IP is mapped to a sandbox by a watch of the sandbox Pods
// (kube.PodIPs), and the sandbox's policy and secrets are read from the
// control plane's shared store on every request, by the same rules the
// control plane uses (sandbox.EgressClient). The store stays the one
// source of truth: a network change or a kill takes effect on the next
// request. Every attempt is recorded in the store's audit log. Whatever
// cannot be looked up (an address no Running sandbox Pod has, a store
// that does not answer) is refused, never let through.
package egressd

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/corralhq/corral/internal/audit"
	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
)

// Defaults.
const (
	// ProxyPort is the explicit proxy's port (the sandboxes' HTTP_PROXY).
	ProxyPort = 3128
	// DNSPort is the DNS filter's port (UDP and TCP).
	DNSPort = 53
	// DefaultStoreTimeout bounds one policy lookup in the store.
	DefaultStoreTimeout = 3 * time.Second
)

// Pods maps a source address to the sandbox whose Pod has it
// (*kube.PodIPs): the sandbox id, or "" and why not.
type Pods interface {
	Lookup(addr netip.Addr) (sandbox, reason string)
}

// Config configures a [Server].
type Config struct {
	// Pods identifies the sandbox behind a source address. Required.
	Pods Pods
	// Store is the control plane's store (shared PostgreSQL): sandbox
	// records and secrets. Required.
	Store *store.Store
	// Audit records every egress attempt (in Store). Required.
	Audit *audit.Log
	// CA, when set, lets the proxy intercept TLS to a host a sandbox has
	// a secret for (the sandbox must trust it).
	CA *egress.CA
	// Resolver resolves names (nil: Go's resolver of /etc/resolv.conf).
	Resolver egress.Resolver
	// UpstreamRoots verifies upstream TLS when intercepting (nil: system).
	UpstreamRoots *x509.CertPool
	// Limits are the per-sandbox caps (zero fields: defaults).
	Limits egress.Limits
	// StoreTimeout bounds one lookup in the store (default
	// DefaultStoreTimeout).
	StoreTimeout time.Duration
	// Log receives the proxy's and filter's lines (wrap it with
	// egress.NewSlogHandler).
	Log *slog.Logger
}

// Server is the egress proxy and DNS filter of sandboxes identified by
// their Pod IPs.
type Server struct {
	cfg     Config
	proxy   *egress.Proxy
	dns     *egress.DNSFilter
	summary *egress.Summarizer
	http    *http.Server
}

// New returns a server with cfg; Serve serves it.
func New(cfg Config) (*Server, error) {
	if cfg.Pods == nil || cfg.Store == nil || cfg.Audit == nil {
		return nil, errors.New("egressd: needs the Pod lookup, the store and the audit log")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Resolver == nil {
		cfg.Resolver = &net.Resolver{PreferGo: true}
	}
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = DefaultStoreTimeout
	}
	s := &Server{cfg: cfg}
	al := cfg.Audit
	s.summary = egress.NewSummarizer(egress.SummaryConfig{Log: cfg.Log,
		OnSummary: func(sm egress.Summary) { al.Record(sm.Sandbox, "egress.summary", audit.SummaryData(sm)) }})
	onEvent := func(ev egress.Event) { al.Record(ev.Sandbox, audit.EgressKind(ev), audit.EgressData(ev)) }
	s.proxy = egress.NewProxy(egress.ProxyConfig{
		Client: s.Client, Resolver: cfg.Resolver, CA: cfg.CA, UpstreamRoots: cfg.UpstreamRoots,
		Log: cfg.Log, OnEvent: onEvent, Summary: s.summary,
	})
	s.dns = egress.NewDNSFilter(egress.DNSFilterConfig{
		Policy: func(a netip.Addr) (egress.Policy, string, bool) {
			c, _ := s.Client(a)
			if c.Refused != "" {
				cfg.Log.Warn("egress dns refused", "client", a, "sandbox", c.ID, "reason", c.Refused)
				return egress.Policy{}, c.ID, false
			}
			return c.Policy, c.ID, true
		},
		Resolver: cfg.Resolver, Log: cfg.Log, OnEvent: onEvent, Summary: s.summary,
	})
	s.http = s.proxy.Server("")
	return s, nil
}

// Client is the proxy's lookup: the sandbox whose Running Pod has addr,
// with its policy, secrets and caps as the store has them now. It never
// fails open: an address without a Running sandbox Pod, a sandbox whose
// record is missing or not running, and a store that does not answer
// within StoreTimeout all give a Client whose Refused says why (and whose
// ID names the sandbox when it is known), which the proxy refuses and
// audits.
func (s *Server) Client(addr netip.Addr) (egress.Client, bool) {
	id, why := s.cfg.Pods.Lookup(addr)
	if id == "" {
		return egress.Client{Refused: why}, true
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.StoreTimeout)
	defer cancel()
	rec, err := s.cfg.Store.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return egress.Client{ID: id, Refused: fmt.Sprintf("source %s is sandbox %s, which has no record", addr, id)}, true
	}
	if err != nil {
		return egress.Client{ID: id, Refused: "the policy store is unreachable: " + err.Error()}, true
	}
	c, err := sandbox.EgressClient(ctx, s.cfg.Store, rec, s.cfg.Limits)
	if err != nil {
		if ctx.Err() != nil || store.IsUnavailable(err) {
			return egress.Client{ID: id, Refused: "the policy store is unreachable: " + err.Error()}, true
		}
		return egress.Client{ID: id, Refused: err.Error()}, true
	}
	return c, true
}

// Forget drops the per-sandbox state (caps, refusal summaries) of a
// sandbox whose Pod is gone.
func (s *Server) Forget(id string) {
	s.proxy.Forget(id)
	s.summary.Forget(id)
}

// Serve serves the explicit proxy on proxy and the DNS filter on dnsUDP
// and dnsTCP (both nil: no DNS filter) until ctx ends or one fails, then
// closes them.
func (s *Server) Serve(ctx context.Context, proxy net.Listener, dnsUDP net.PacketConn, dnsTCP net.Listener) error {
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := s.http.Serve(proxy); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("egressd: proxy: %w", err)
		}
	}()
	dctx, stopDNS := context.WithCancel(ctx)
	defer stopDNS()
	if dnsUDP != nil || dnsTCP != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.dns.Serve(dctx, dnsUDP, dnsTCP); err != nil && dctx.Err() == nil {
				errc <- fmt.Errorf("egressd: dns: %w", err)
			}
		}()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	stopDNS() // the filter closes its own sockets
	s.http.Close()
	proxy.Close()
	wg.Wait()
	s.summary.Close()
	return err
}
