// Package output bounds what a command's output costs: a Tail keeps the
// last N bytes of a stream and counts everything, so a flood (`yes`) costs
// a fixed amount of memory and the caller learns what was dropped.
package output

import "strings"

// Tail keeps the last Max bytes written to it.
type Tail struct {
	// Max is the number of bytes kept.
	Max int
	// Total counts every byte written.
	Total int64
	buf   []byte
}

// Write keeps the tail of p; it never fails.
func (t *Tail) Write(p []byte) (int, error) {
	t.Total += int64(len(p))
	if t.Max <= 0 {
		return len(p), nil
	}
	if len(p) >= t.Max {
		t.buf = append(t.buf[:0], p[len(p)-t.Max:]...)
		return len(p), nil
	}
	if over := len(t.buf) + len(p) - t.Max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return len(p), nil
}

// Truncated reports whether bytes were dropped.
func (t *Tail) Truncated() bool { return t.Total > int64(len(t.buf)) }

// String returns the kept bytes, with any UTF-8 sequence cut at the front
// removed so the result is valid text where the input was.
func (t *Tail) String() string {
	b := t.buf
	if t.Truncated() {
		for i := 0; i < 3 && len(b) > 0 && b[0]&0xC0 == 0x80; i++ {
			b = b[1:]
		}
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// Bytes returns the kept bytes.
func (t *Tail) Bytes() []byte { return t.buf }
