// Package agentproto holds the wire constants the sandbox agent
// (internal/agent) and the control plane's agent client
// (internal/agentclient) share beside the generated proto types: header
// names, the port tunnel's path and upgrade token, the user selector. Each
// is defined here once, so that the two sides cannot drift apart.
package agentproto

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
