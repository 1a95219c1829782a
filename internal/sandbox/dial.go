package sandbox

import (
	"bytes"
	"encoding/base64"
	"net"
	"os"
	"strconv"
)

type netConn = net.Conn

// pidAlive reports whether pid runs and is not a zombie.
func pidAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

func basic64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
