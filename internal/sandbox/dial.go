package sandbox

import (
	"encoding/base64"
	"net"
)

type netConn = net.Conn

func basic64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
