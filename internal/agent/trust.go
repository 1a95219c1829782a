package agent

import (
	"bytes"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/corralhq/corral/proto/agentproto"
)

// maxCABundle bounds the template CA bundle the agent reads to append the
// egress CA to (Debian's is about 200 KiB).
const maxCABundle = 8 << 20

// checkTrustCA accepts only PEM CERTIFICATE blocks: it defends against a
// private key (the egress CA's, which would let the sandbox forge the
// proxy's certificates) reaching the sandbox's file system by mistake.
func checkTrustCA(ca string) error {
	rest := []byte(ca)
	n := 0
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return fmt.Errorf("trustCA holds a PEM %q block; only CERTIFICATE blocks are accepted", b.Type)
		}
		n++
	}
	if n == 0 || len(bytes.TrimSpace(rest)) != 0 {
		return errors.New("trustCA must be PEM CERTIFICATE blocks and nothing else")
	}
	return nil
}

// installCA makes the sandbox trust the egress CA as a local sandbox does
// (gateway.TrustFiles): the CA alone at agentproto.CAFile and appended to
// the template's bundle at agentproto.CABundle, both under root ("" is
// /). It runs in POST /init, before any sandbox code. A read-only root
// file system is left alone (the template must trust the CA itself) and
// reported as skipped.
func installCA(root string, ca []byte) (skipped bool, err error) {
	file, bundle := filepath.Join(root, agentproto.CAFile), filepath.Join(root, agentproto.CABundle)
	cur, err := readBounded(bundle, maxCABundle)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("read the CA bundle %s: %w", agentproto.CABundle, err)
	}
	if !bytes.Contains(cur, ca) {
		if len(cur) > 0 && cur[len(cur)-1] != '\n' {
			cur = append(cur, '\n')
		}
		cur = append(cur, ca...)
	}
	for _, w := range []struct {
		path string
		data []byte
	}{{file, ca}, {bundle, cur}} {
		if err := writeAtomic(w.path, w.data); err != nil {
			if errors.Is(err, syscall.EROFS) {
				return true, nil
			}
			return false, fmt.Errorf("install the egress CA at %s: %w", w.path, err)
		}
	}
	return false, nil
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("over %d bytes", limit)
	}
	return b, nil
}

// writeAtomic replaces path with data (mode 0644, root's), through a
// temporary file in its directory.
func writeAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".corral-ca-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
