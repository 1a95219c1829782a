// Package interpreter holds corral's code-interpreter server: a Python 3
// program (server.py, embedded here) that runs inside sandboxes of the
// code-interpreter template and speaks E2B's code-interpreter protocol
// (health, /execute streaming NDJSON, contexts) over Jupyter kernels. The
// template recipe (package template) installs it into the image; the
// registry records the start command that launches it. See
// docs/interpreter.md.
package interpreter

import _ "embed" // the server source

//go:embed server.py
var server []byte

// Port is the port the server listens on inside the sandbox, the one E2B's
// SDK names (49999).
const Port = 49999

// TemplateName is the name the code-interpreter template is registered
// under.
const TemplateName = "code-interpreter"

// ServerPath is where the template holds the server.
const ServerPath = "/usr/lib/corral/interpreter/server.py"

// Workdir is the working directory of the server and of the default
// context.
const Workdir = "/home/user"

// LogPath is where the server (and whatever its kernels write to their
// standard error outside Python) logs, inside the sandbox.
const LogPath = "/tmp/corral-interpreter.log"

// StartCommand is the template's start command: the server, run by the
// sandbox user at every create (see store.TemplateConfig.Start).
const StartCommand = "exec /usr/bin/python3 -u " + ServerPath + " >>" + LogPath + " 2>&1"

// Server returns the server's source (a copy).
func Server() []byte { return append([]byte(nil), server...) }
