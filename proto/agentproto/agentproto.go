// Package agentproto holds the wire constants the sandbox agent
// (internal/agent) and the control plane's agent client
// (internal/agentclient) share beside the generated proto types: header
// names, the port tunnel's path and upgrade token, the user selector. Each
// is defined here once, so that the two sides cannot drift apart.
package agentproto

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"
)

// AccessTokenHeader carries a sandbox's access token on every agent call
// but GET /health (envd's header, which the E2B SDKs send too).
const AccessTokenHeader = "X-Access-Token"

// PortUpgrade is the Upgrade token of the agent's port tunnel
// (GET PortPath+"{port}" with "Connection: Upgrade").
const PortUpgrade = "corral-tcp"

// PortPath is the path prefix of the agent's port tunnel; the port follows.
const PortPath = "/port/"

// UserAuthScheme is the Authorization scheme that selects the user of an
// agent call: "Basic base64(<user>:)", as envd reads it.
const UserAuthScheme = "Basic "

// Signature is the E2B v1 signature of a /files URL for path, op ("read"
// or "write"), user ("" when the URL names none) and the sandbox's access
// token, with the expiry exp in unix seconds ("" for none):
// "v1_" + base64(sha256("<path>:<op>:<user>:<token>[:<exp>]")) without
// padding. The agent checks it, the control plane routes by it, and the
// SDKs compute it (docs/e2b-protocol.md).
func Signature(path, op, user, token, exp string) string {
	raw := path + ":" + op + ":" + user + ":" + token
	if exp != "" {
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	return FormatSignature(sum[:])
}

// FormatSignature formats the SHA-256 sum of a signed URL's fields as a v1
// signature (for callers that hash the fields incrementally).
func FormatSignature(sum []byte) string {
	return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum), "=")
}

// InitPath is the agent's one-time setup call (POST, JSON InitRequest) of
// an agent that waits for its sandbox: a warm Kubernetes Pod, started
// before the control plane knows which sandbox it will be. It is
// authenticated with the bootstrap token (AccessTokenHeader) and accepted
// once; after it only the sandbox's access token opens the agent.
const InitPath = "/init"

// BootstrapTokenEnv is the environment variable that hands an agent on TCP
// its bootstrap token (the agent removes it from its environment before
// it serves).
const BootstrapTokenEnv = "CORRAL_AGENT_BOOTSTRAP_TOKEN"

// Port is the TCP port an agent in a Kubernetes Pod listens on (envd's).
const Port = 49983

// InitRequest is the body of POST InitPath.
type InitRequest struct {
	// AccessToken is the sandbox's access token; required.
	AccessToken string `json:"accessToken"`
	// EnvVars is the sandbox-global environment of every process.
	EnvVars map[string]string `json:"envVars,omitempty"`
	// TrustCA is the egress CA's certificate (PEM, never its key) for a
	// sandbox that uses secrets: the agent installs it where a local
	// sandbox gets it bind-mounted (CAFile alone, appended to CABundle).
	TrustCA string `json:"trustCA,omitempty"`
}

// Where an agent installs InitRequest.TrustCA (gateway.SandboxCAFile and
// gateway.SandboxCABundle, the paths a local sandbox trusts).
const (
	CABundle = "/etc/ssl/certs/ca-certificates.crt"
	CAFile   = "/usr/local/share/ca-certificates/corral-egress.crt"
)
