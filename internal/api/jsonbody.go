package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// parseJSON decodes data, one JSON value, into v: the one JSON rule of
// every request body (native routes, E2B's, code runs, template
// builds). Trailing data is refused, and so is an object that names a
// key twice (at any depth: {"timeout":5,"timeout":6}, a metadata key
// given twice): encoding/json would keep the last silently, and a
// client, a proxy or an audit reader that keeps the first would see
// another request than the one the server acted on. With strict,
// fields v does not have are refused too (native routes); E2B's routes
// tolerate them, as the SDK adds fields over time.
func parseJSON(data []byte, v any, strict bool) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return io.EOF
	}
	if err := noDuplicateKeys(data); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("unexpected data after the JSON value")
	}
	return nil
}

// noDuplicateKeys refuses data when an object in it names a key twice
// (duplicateKey); a syntax error is left to the decoder.
func noDuplicateKeys(data []byte) error {
	if key, err := duplicateKey(data); err == nil && key != "" {
		return fmt.Errorf("key %q is given twice in one object", key)
	}
	return nil
}

// jsonFrame is an object or an array duplicateKey is inside.
type jsonFrame struct {
	keys    map[string]bool // the object's keys so far; nil for an array
	key     string          // the key whose value is being read
	wantKey bool            // the next token is a key or the closing brace
}

// duplicateKey returns the path of the first key that an object of data
// names twice ("metadata.a" for key a of the object under metadata), or
// "". A syntax error is returned, for the decoder to report.
func duplicateKey(data []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var stack []*jsonFrame
	// done marks the value of the innermost object's key as read.
	done := func() {
		if n := len(stack); n > 0 && stack[n-1].keys != nil {
			stack[n-1].wantKey = true
		}
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return "", nil
		}
		if err != nil {
			return "", err
		}
		if n := len(stack); n > 0 && stack[n-1].keys != nil && stack[n-1].wantKey {
			top := stack[n-1]
			if tok == json.Delim('}') {
				stack = stack[:n-1]
				done()
				continue
			}
			k, _ := tok.(string)
			if top.keys[k] {
				var parts []string
				for _, f := range stack[:n-1] {
					if f.keys != nil {
						parts = append(parts, f.key)
					}
				}
				return strings.Join(append(parts, k), "."), nil
			}
			top.keys[k], top.key, top.wantKey = true, k, false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &jsonFrame{keys: map[string]bool{}, wantKey: true})
		case json.Delim('['):
			stack = append(stack, &jsonFrame{})
		case json.Delim(']'):
			stack = stack[:len(stack)-1]
			done()
		default:
			done()
		}
	}
}
