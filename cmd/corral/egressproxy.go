package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/corralhq/corral/internal/audit"
	"github.com/corralhq/corral/internal/egress"
	"github.com/corralhq/corral/internal/egressd"
	"github.com/corralhq/corral/internal/runtime/kube"
	"github.com/corralhq/corral/internal/server"
	"github.com/corralhq/corral/internal/store"
)

// egressProxyOptions are `corral egress-proxy`'s flags.
type egressProxyOptions struct {
	store, kubeconfig, namespace string
	listen, dnsListen            string
	caDir, resolver, upstreamCA  string
	limits                       egress.Limits
	logLevel                     slog.Level
}

// newEgressProxyCmd is `corral egress-proxy`: the egress proxy and DNS
// filter of the kube driver's sandboxes, run in the cluster as a
// Deployment of its own (deploy/kubernetes/egress.yaml,
// docs/kubernetes.md#egress).
func newEgressProxyCmd() *cobra.Command {
	o := egressProxyOptions{logLevel: slog.LevelInfo}
	cmd := &cobra.Command{
		Use:   "egress-proxy --store postgres://...",
		Short: "Run the egress proxy and DNS filter of sandbox Pods (--driver kube --kube-egress)",
		Long: `Run corral's egress proxy (explicit HTTP proxy with CONNECT, TLS interception
to inject secrets) and DNS filter for the sandbox Pods of the kube driver.
A request's sandbox is the one whose Running Pod has the source IP (a
watch of the sandbox Pods: get, list and watch on Pods of --kube-namespace);
its policy and secrets are read from the control plane's store (--store,
the same PostgreSQL the control planes share) on every request, and every
attempt is recorded in its audit log. Anything it cannot look up is
refused.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.store == "" {
				return usageError(cmd, "--store is required (the control plane's store, postgres://...)")
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: o.logLevel}))
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runEgressProxy(ctx, o, log)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.store, "store", "", "the control plane's store: postgres://USER@HOST:PORT/DB?... (password in PGPASSWORD or ~/.pgpass)")
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (empty: the in-cluster service account)")
	f.StringVar(&o.namespace, "kube-namespace", server.DefaultKubeNamespace, "namespace of the sandbox Pods")
	f.StringVar(&o.listen, "listen", ":"+strconv.Itoa(egressd.ProxyPort), "address of the explicit proxy (the sandboxes' HTTP_PROXY)")
	f.StringVar(&o.dnsListen, "dns-listen", ":"+strconv.Itoa(egressd.DNSPort), "address of the DNS filter, UDP and TCP (empty: none)")
	f.StringVar(&o.caDir, "ca-dir", "", "directory of the egress CA (ca.pem, ca-key.pem; from a Secret) to intercept TLS to hosts a sandbox has a secret for (empty: no interception, HTTPS is tunnelled and gets no secret)")
	f.StringVar(&o.resolver, "egress-resolver", "", "DNS server HOST:PORT for names sandboxes may reach (default: the Pod's resolver)")
	f.StringVar(&o.upstreamCA, "egress-upstream-ca", "", "PEM file of CAs to trust for upstream TLS when injecting secrets (default: the system's)")
	f.IntVar(&o.limits.MaxConns, "egress-max-conns", egress.DefaultMaxConns, "concurrent egress connections per sandbox (per proxy replica)")
	f.Int64Var(&o.limits.MaxBytes, "egress-max-bytes", egress.DefaultMaxBytes, "egress bytes up+down per sandbox over its life (per proxy replica)")
	f.IntVar(&o.limits.RequestsPerMinute, "egress-rpm", egress.DefaultRequestsPerMinute, "egress requests per minute per sandbox (per proxy replica)")
	f.Var(logLevelFlag{&o.logLevel}, "log-level", "debug, info, warn or error")
	return cmd
}

func runEgressProxy(ctx context.Context, o egressProxyOptions, log *slog.Logger) error {
	var rc *rest.Config
	var err error
	if o.kubeconfig == "" {
		rc, err = rest.InClusterConfig()
	} else {
		rc, err = clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	}
	if err != nil {
		return fmt.Errorf("egress-proxy: cluster configuration: %w", err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("egress-proxy: %w", err)
	}
	st, err := store.Open(o.store)
	if err != nil {
		return err
	}
	defer st.Close()
	// Secret values never reach an event; still, the log and the audit
	// log redact every value registered when the proxy started.
	red := &egress.Redactor{}
	secrets, err := st.ListSecrets(ctx, "")
	if err != nil {
		return fmt.Errorf("egress-proxy: %w", err)
	}
	for _, s := range secrets {
		_ = red.AddFor(s.Team, s.Name, s.Value)
	}
	log = slog.New(egress.NewSlogHandler(log.Handler(), red))
	al := audit.New(st, red, log)
	defer al.Close()
	cfg := egressd.Config{Store: st, Audit: al, Limits: o.limits, Log: log}
	if o.caDir != "" {
		if cfg.CA, err = egress.LoadOrCreateCA(o.caDir); err != nil {
			return err
		}
	}
	if o.resolver != "" {
		addr := o.resolver
		cfg.Resolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}}
	}
	if o.upstreamCA != "" {
		pem, err := os.ReadFile(o.upstreamCA)
		if err != nil {
			return fmt.Errorf("egress upstream CA: %w", err)
		}
		cfg.UpstreamRoots = x509.NewCertPool()
		if !cfg.UpstreamRoots.AppendCertsFromPEM(pem) {
			return fmt.Errorf("egress upstream CA %s: no certificates", o.upstreamCA)
		}
	}
	var srvp atomic.Pointer[egressd.Server] // Pod events may come before New
	pods, err := kube.WatchPodIPs(ctx, client, o.namespace, func(id string) {
		if s := srvp.Load(); s != nil {
			s.Forget(id)
		}
	})
	if err != nil {
		return err
	}
	defer pods.Close()
	cfg.Pods = pods
	srv, err := egressd.New(cfg)
	if err != nil {
		return err
	}
	srvp.Store(srv)
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("egress-proxy: %w", err)
	}
	var udp net.PacketConn
	var tcp net.Listener
	if o.dnsListen != "" {
		if udp, err = net.ListenPacket("udp", o.dnsListen); err != nil {
			ln.Close()
			return fmt.Errorf("egress-proxy: DNS: %w", err)
		}
		if tcp, err = net.Listen("tcp", o.dnsListen); err != nil {
			ln.Close()
			udp.Close()
			return fmt.Errorf("egress-proxy: DNS: %w", err)
		}
	}
	log.Info("egress proxy serving", "proxy", ln.Addr(), "dns", o.dnsListen, "namespace", o.namespace, "intercept", cfg.CA != nil)
	return srv.Serve(ctx, ln, udp, tcp)
}
