package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/corralhq/corral/proto/process/processconnect"
)

// evil is a string a server, a sandbox or an API client could put in
// what the CLI prints (an error message, a file name, a template name,
// metadata, audit data): an OSC 52 clipboard write, a screen clear and
// cursor move, BEL, the 8-bit CSI, a bidi override, NUL, DEL, and a
// newline and tab that would forge a line or a table cell.
const evil = "evil\x1b]52;c;Y3VybCBldmlsfHNo\x07\x1b[2J\x1b[1;1H\x07\u009b31m\u202egnp.exe\x00\x7f\r\nFAKE\tROW"

// termControl returns the first thing in out that can drive a terminal
// (a control character other than a newline ending a line, a C1 control,
// a Unicode format character, an invalid UTF-8 byte), or "".
func termControl(out string) string {
	for i, r := range out {
		switch {
		case r == utf8.RuneError:
			return "invalid UTF-8 at " + string(rune('0'+i%10))
		case r == '\n':
		case r < 0x20 || (r >= 0x7f && r <= 0x9f) || unicode.Is(unicode.Cf, r):
			return strings.ToValidUTF8(out[max(0, i-10):i], "?") + "<" + string(r) + ">"
		}
	}
	return ""
}

// hostileServer answers the CLI's calls with evil in every string it can
// carry: error messages, a sandbox's template, state and metadata, audit
// events' kind and data, and a file's name in an error; the agent's
// echo writes evil to stdout.
func hostileServer(t *testing.T) *httptest.Server {
	t.Helper()
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	sb := `{"id":"sbh","template":` + q(evil) + `,"runtime":"runc","state":"running","tier":"light",
"resources":{"cpu":1,"memory_mb":512,"disk_mb":1024,"pids":256,"nofile":1024},"command_timeout":30,
"network":"none","metadata":{"k":` + q(evil) + `},"created_at":"2026-01-01T00:00:00Z","expires_at":"2099-01-01T00:00:00Z","ended_at":null,"end_reason":""}`
	fail := func(w http.ResponseWriter, status int, code string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, `{"code":"`+code+`","message":`+q("no such thing: "+evil)+`}`)
	}
	mux := http.NewServeMux()
	p, h := processconnect.NewProcessHandler(&fakeAgent{})
	mux.Handle("/v1/sandboxes/sbh/agent"+p, http.StripPrefix("/v1/sandboxes/sbh/agent", h))
	mux.HandleFunc("/v1/sandboxes/sbh/agent/files", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(404)
		io.WriteString(w, `{"code":404,"message":`+q("path '"+r.URL.Query().Get("path")+"' not found: "+evil)+`}`)
	})
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"sandboxes":[`+sb+`]}`)
	})
	mux.HandleFunc("GET /v1/sandboxes/sbh", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, sb) })
	mux.HandleFunc("GET /v1/sandboxes/gone", func(w http.ResponseWriter, r *http.Request) { fail(w, 404, "not_found") })
	mux.HandleFunc("DELETE /v1/sandboxes/gone", func(w http.ResponseWriter, r *http.Request) { fail(w, 404, "not_found") })
	mux.HandleFunc("GET /v1/audit", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"events":[{"id":1,"time":"2026-01-01T00:00:00Z","sandbox":"sbh","team":`+q(evil)+
			`,"kind":`+q(evil)+`,"data":{"host":`+q(evil)+`}}]}`)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// TestCLITermSafeOutput defends the operator's terminal against what a
// server, a sandbox or another API client chose: every line corral
// prints that carries such text (error lines, sandbox get and ls, audit)
// holds no control character, escape sequence, C1 control or bidi
// override, and no newline forges a line; --json stays exact JSON (the
// hostile value decodes back byte for byte) with those characters
// escaped; the stdout of a command run in a sandbox stays byte-exact.
func TestCLITermSafeOutput(t *testing.T) {
	srv := hostileServer(t)
	t.Setenv("CORRAL_URL", srv.URL)
	t.Setenv("CORRAL_API_KEY", "k")
	for _, tc := range []struct {
		name string
		args []string
		code int
		// where evil shows (sanitised) and how many lines the output has
		stdout, stderr string
		lines          int
	}{
		{"error line", []string{"sandbox", "get", "gone"}, 1, "", "no such thing: evil", 1},
		{"error line of one kill of many", []string{"sandbox", "kill", "gone", "gone"}, 1, "", "no such thing: evil", 2},
		{"sandbox file error echoing a name", []string{"sandbox", "cp", "sbh:/x\x1b[2J\n", "-"}, 1, "", "not found: evil", 1},
		{"sandbox get", []string{"sandbox", "get", "sbh"}, 0, "evil??31m?gnp.exe??  FAKE ROW\nruntime:", "", 0},
		{"sandbox ls", []string{"sandbox", "ls"}, 0, "evil", "", 2},
		{"audit", []string{"audit"}, 0, "evil", "", 1},
		{"usage error echoing an argument", []string{"sandbox", "ls", "--metadata", evil}, 2, "", "corral: ", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := runCLI(t, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stdout %q stderr %q", code, tc.code, out, errOut)
			}
			for _, s := range []struct{ name, got, want string }{{"stdout", out, tc.stdout}, {"stderr", errOut, tc.stderr}} {
				if c := termControl(s.got); c != "" {
					t.Errorf("%s carries a terminal control: %q in %q", s.name, c, s.got)
				}
				if !strings.Contains(s.got, s.want) {
					t.Errorf("%s %q does not contain %q", s.name, s.got, s.want)
				}
				if strings.Contains(s.got, "\nFAKE") {
					t.Errorf("%s: a newline in a value forged a line: %q", s.name, s.got)
				}
			}
			if tc.lines > 0 {
				if n := strings.Count(out+errOut, "\n"); n != tc.lines {
					t.Errorf("%d lines, want %d: %q", n, tc.lines, out+errOut)
				}
			}
		})
	}

	t.Run("json is exact and escaped", func(t *testing.T) {
		for _, args := range [][]string{{"sandbox", "get", "--json", "sbh"}, {"sandbox", "ls", "--json"}, {"audit", "--json"}} {
			out, errOut, code := runCLI(t, args...)
			if code != 0 {
				t.Fatalf("%q: exit %d: %s", args, code, errOut)
			}
			if c := termControl(out); c != "" {
				t.Errorf("%q: --json output carries a raw terminal control %q: %q", args, c, out)
			}
			// Every JSON document decodes, and evil comes back exactly.
			var found int
			dec := json.NewDecoder(strings.NewReader(out))
			for dec.More() {
				var v any
				if err := dec.Decode(&v); err != nil {
					t.Fatalf("%q: not JSON: %v: %q", args, err, out)
				}
				found += countString(v, evil)
			}
			if found == 0 {
				t.Errorf("%q: the hostile value did not round-trip exactly: %q", args, out)
			}
		}
	})

	t.Run("exec stdout is byte-exact", func(t *testing.T) {
		out, errOut, code := runCLI(t, "sandbox", "exec", "--no-stdin", "sbh", "--", "echo", evil)
		if code != 0 || out != evil+"\n" || errOut != "" {
			t.Fatalf("exec: exit %d stdout %q stderr %q; want the command's bytes %q", code, out, errOut, evil+"\n")
		}
	})
}

// countString counts the strings equal to want in a decoded JSON value.
func countString(v any, want string) int {
	switch v := v.(type) {
	case string:
		if v == want {
			return 1
		}
	case []any:
		n := 0
		for _, e := range v {
			n += countString(e, want)
		}
		return n
	case map[string]any:
		n := 0
		for _, e := range v {
			n += countString(e, want)
		}
		return n
	}
	return 0
}

// TestJSONSafe: jsonSafe escapes exactly what termSafe would replace, and
// the JSON value is unchanged (the document decodes to the same string).
func TestJSONSafe(t *testing.T) {
	for _, in := range []string{"plain é 数据 🙂", evil, "\u009b\u009c\u0085", "\u202e\u200b\ufeff", "\U000e0001 tag", "x\x7f"} {
		b, _ := json.Marshal(in)
		got := jsonSafe(b)
		if c := termControl(string(got)); c != "" {
			t.Errorf("jsonSafe(%q) = %s keeps %q", b, got, c)
		}
		var back string
		if err := json.Unmarshal(got, &back); err != nil || back != in {
			t.Errorf("jsonSafe(%q) = %s decodes to %q, %v; want %q", b, got, back, err, in)
		}
	}
	// Invalid UTF-8 in a raw message the server sent becomes U+FFFD.
	if got := string(jsonSafe([]byte("\"a\x9bb\""))); got != `"a\ufffdb"` {
		t.Errorf("invalid byte: %s", got)
	}
}
