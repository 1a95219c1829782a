package main

import (
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// What the CLI prints that it did not write itself (error messages from
// the server, names, metadata, audit data, build logs, command output
// echoed in an error) goes through one of two paths, whatever the
// command:
//
//   - human output (error and warning lines, tables, `corral audit`,
//     `corral sandbox ls`, `corral top`): termPrintf / termPrintln /
//     termPrintLines, which pass every argument through termSafe;
//   - --json output: writeJSON, exact JSON whose strings escape every
//     character termSafe would replace (jsonSafe).
//
// Raw streams the user asked for (a command's stdout and stderr in
// `corral run` and `corral sandbox exec`, a file downloaded to stdout by
// `corral sandbox cp ID:PATH -`) stay byte-exact: they are the data
// itself, and a caller piping them needs every byte (docs/cli.md).

// termSafe returns s as text that cannot drive a terminal. ANSI/VT
// escape sequences (CSI, OSC, DCS, SOS, PM, APC and two-byte ESC
// sequences) are removed whole; every other control character (C0, DEL,
// C1, among them the 8-bit CSI U+009B), every Unicode format character
// (bidirectional overrides, zero-width characters) and every invalid
// UTF-8 byte becomes '?'; tabs, newlines and line separators become a
// space.
//
// It defends the operator's terminal against what the CLI shows of
// sandboxes and of the server: metadata, agent names, template names,
// file names and error messages are chosen by API clients or by code in
// a sandbox, and incident details carry host names a sandbox asked for.
// Printed raw, an escape sequence there could move the cursor and forge
// lines or rows (hide a runaway sandbox behind a fake line, fake a
// success after an error), set the window title, write the clipboard
// (OSC 52), plant a hyperlink (OSC 8), reorder text (bidi overrides) or
// answer the terminal's queries into the input of the shell or of
// corral top. A newline or tab inside a value cannot forge a row or a
// column either.
func termSafe(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			b.WriteByte('?')
			i++
			continue
		case r == 0x1b:
			i += size + escapeLen(s[i+size:])
			continue
		case r == '\t' || r == '\n' || r == '\r' || r == 0x2028 || r == 0x2029:
			b.WriteByte(' ')
		case r < 0x20 || (r >= 0x7f && r <= 0x9f) || unicode.Is(unicode.Cf, r):
			b.WriteByte('?')
		default:
			b.WriteRune(r)
		}
		i += size
	}
	return b.String()
}

// escapeLen returns how many bytes of rest (what follows an ESC) belong
// to the escape sequence: a CSI's parameters and final byte, a string
// sequence (OSC, DCS, SOS, PM, APC) up to its terminator (BEL, ESC \ or
// U+009C; the end of rest when unterminated), or the one character of a
// two-byte sequence.
func escapeLen(rest string) int {
	if rest == "" {
		return 0
	}
	switch rest[0] {
	case '[': // CSI: parameter and intermediate bytes, then a final byte
		for i := 1; i < len(rest); i++ {
			switch c := rest[i]; {
			case c >= 0x40 && c <= 0x7e:
				return i + 1
			case c < 0x20 || c > 0x7e:
				return i // not a CSI byte: the sequence ends here
			}
		}
		return len(rest)
	case ']', 'P', 'X', '^', '_': // string sequences
		for i := 1; i < len(rest); i++ {
			switch {
			case rest[i] == 0x07:
				return i + 1
			case rest[i] == 0x1b && i+1 < len(rest) && rest[i+1] == '\\':
				return i + 2
			case strings.HasPrefix(rest[i:], "\u009c"):
				return i + len("\u009c")
			}
		}
		return len(rest)
	}
	if c := rest[0]; c >= 0x20 && c <= 0x7e {
		return 1
	}
	return 0
}

// termArgs returns args with every value that can carry text passed
// through termSafe: strings and string types, errors, byte slices, and
// anything else fmt would print through a String method or as a
// composite. Numbers, booleans, durations and times keep their type (and
// so their verbs), since their formatting cannot produce a control
// character.
func termArgs(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		out[i] = termArg(a)
	}
	return out
}

func termArg(a any) any {
	switch v := a.(type) {
	case nil, bool, time.Duration, time.Time:
		return a
	case string:
		return termSafe(v)
	case error:
		return termSafe(v.Error())
	case []byte:
		return termSafe(string(v))
	case json.RawMessage:
		return termSafe(string(v))
	}
	switch rv := reflect.ValueOf(a); rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128, reflect.Bool:
		if _, ok := a.(fmt.Stringer); !ok {
			return a
		}
	case reflect.String:
		if _, ok := a.(fmt.Stringer); !ok {
			return termSafe(rv.String())
		}
	}
	return termSafe(fmt.Sprint(a))
}

// termPrintf is fmt.Fprintf for human output: every argument passes
// through termSafe (termArgs); the format, which the CLI wrote, is
// printed as it is.
func termPrintf(w io.Writer, format string, args ...any) (int, error) {
	return fmt.Fprintf(w, format, termArgs(args)...)
}

// termPrintln is fmt.Fprintln for human output, every argument through
// termSafe.
func termPrintln(w io.Writer, args ...any) (int, error) {
	return fmt.Fprintln(w, termArgs(args)...)
}

// termPrintLines prints s, text of many lines (a build log), line by
// line through termSafe: its newlines stay line ends, nothing else of
// it reaches the terminal as a control.
func termPrintLines(w io.Writer, s string) error {
	s = strings.TrimSuffix(s, "\n")
	if s == "" {
		return nil
	}
	for line := range strings.SplitSeq(s, "\n") {
		if _, err := io.WriteString(w, termSafe(line)+"\n"); err != nil {
			return err
		}
	}
	return nil
}

// writeJSON writes v as JSON and a newline (indented when indent),
// through jsonSafe: the --json output of every command.
func writeJSON(w io.Writer, v any, indent bool) error {
	var b []byte
	var err error
	if indent {
		b, err = json.MarshalIndent(v, "", "  ")
	} else {
		b, err = json.Marshal(v)
	}
	if err != nil {
		return err
	}
	_, err = w.Write(append(jsonSafe(b), '\n'))
	return err
}

// jsonSafe returns the JSON text b with every character termSafe would
// replace written as a \u escape, and every invalid UTF-8 byte as
// \ufffd: the same JSON value, exact for a program reading it, yet
// nothing that drives a terminal it is printed on. encoding/json
// escapes C0 controls, but neither C1 controls (U+009B is an 8-bit
// CSI), DEL, nor bidirectional overrides, and a json.RawMessage from the
// server keeps its bytes. Outside strings JSON text is ASCII without
// controls, so every byte this rewrites is inside a string.
func jsonSafe(b []byte) []byte {
	var out []byte
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		esc := r == utf8.RuneError && size <= 1
		if esc {
			r = utf8.RuneError
		}
		if !esc && (r == 0x7f || (r >= 0x80 && r <= 0x9f) || unicode.Is(unicode.Cf, r)) {
			esc = true
		}
		if !esc {
			if out != nil {
				out = append(out, b[i:i+size]...)
			}
			i += size
			continue
		}
		if out == nil {
			out = append(make([]byte, 0, len(b)+16), b[:i]...)
		}
		for _, u := range utf16.AppendRune(nil, r) {
			out = append(out, `\u`...)
			h := strconv.FormatUint(uint64(u), 16)
			out = append(out, strings.Repeat("0", 4-len(h))+h...)
		}
		i += size
	}
	if out == nil {
		return b
	}
	return out
}
