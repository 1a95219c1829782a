// Package agent is corral's in-sandbox daemon, the envd-compatible agent.
//
// It runs as PID 1 of every sandbox container (started as `corral agent`)
// and serves, over a unix socket that the control plane on the host dials
// with HTTP/1.1:
//
//   - the Connect RPC service process.Process (start, attach to, signal and
//     feed processes, with pipes or a PTY),
//   - the Connect RPC service filesystem.Filesystem (stat, list, mkdir, move,
//     remove, watch),
//   - plain HTTP: GET /health, GET /files (download) and POST /files
//     (upload),
//
// following the wire protocol the e2b SDK speaks (docs/e2b-protocol.md §3,
// §4). An optional access token guards everything but /health; /files also
// accepts v1 URL signatures.
//
// Security: the agent runs inside the sandbox, in the sandbox's own mount
// namespace and root, so every path it resolves — including through
// symlinks and ".." — resolves inside the sandbox's root by construction.
// This is the file-API confinement of threat-model.md #11: there is no host-side path
// handling to escape from. As PID 1 it reaps every orphan (threat-model.md #13), and
// it marks itself non-dumpable so code in the sandbox cannot ptrace it or
// read its memory (threat-model.md #6). Spawned processes get their own session and
// process group, the requested user's credentials, an oom_score_adj of 100
// and only the sandbox-global environment, never the agent's own.
package agent
