package kube

import "crypto/tls"

// insecureTLS accepts the test API server's self-signed certificate (a
// server on 127.0.0.1 this test run started).
func insecureTLS() *tls.Config { return &tls.Config{InsecureSkipVerify: true} }
