#!/usr/bin/env bash
# Regenerates the Go code for the agent API. Needs protoc (Debian package
# protobuf-compiler) and the plugins protoc-gen-go and protoc-gen-connect-go
# (make proto installs them). Generated code is committed.
set -euo pipefail
cd "$(dirname "$0")"
protoc -I . -I /usr/include \
  --go_out=. --go_opt=paths=source_relative \
  --connect-go_out=. --connect-go_opt=paths=source_relative \
  process/process.proto filesystem/filesystem.proto
