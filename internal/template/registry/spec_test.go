package registry

import (
	"errors"
	"strings"
	"testing"
)

func TestAptSourceHost(t *testing.T) {
	tests := []struct {
		src     string
		host    string // "" means refused
		wantErr string
	}{
		{"deb http://deb.debian.org/debian bookworm main", "deb.debian.org", ""},
		{"deb [trusted=yes] http://mirror.internal.example/repo ./", "mirror.internal.example", ""},
		{"deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] https://Apt.Example.com:8443/x stable main", "apt.example.com", ""},
		{"deb-src http://deb.debian.org/debian bookworm main", "", "want `deb"},
		{"deb http://deb.debian.org/debian", "", "want `deb"},
		{"deb [trusted=yes http://x.example/ ./", "", "not closed"},
		{"deb [trusted=yes] http://x.example/", "", "URI and a suite"},
		{"deb ftp://x.example/ ./", "", "http:// or https://"},
		{"deb file:/srv/repo ./", "", "http:// or https://"},
		{"deb http://user:pw@x.example/ ./", "", "http:// or https://"},
		{"deb http://10.0.0.5/debian bookworm main", "", "host name, not address"},
		{"deb http://[::1]/debian bookworm main", "", "host name, not address"},
		{"deb http://localhost/debian bookworm main", "", "single-label"},
		{"deb http://x.example/ ./\ndeb http://evil.example/ ./", "", "one line"},
		{"deb http://x.example/" + strings.Repeat("a", 1100) + " ./", "", "one line"},
	}
	for _, tc := range tests {
		t.Run(tc.src[:min(len(tc.src), 40)], func(t *testing.T) {
			h, err := AptSourceHost(tc.src)
			if tc.wantErr == "" {
				if err != nil || h != tc.host {
					t.Fatalf("got %q, %v; want %q", h, err, tc.host)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.As(err, new(*InvalidError)) {
				t.Fatalf("got %q, %v; want an invalid-argument error with %q", h, err, tc.wantErr)
			}
		})
	}
}

func TestCheckSpecAptSources(t *testing.T) {
	ok := "deb [trusted=yes] http://repo.example/ ./"
	tests := []struct {
		name    string
		spec    Spec
		wantErr string
	}{
		{"with packages", Spec{Name: "t", Packages: []string{"jq"}, AptSources: []string{ok}}, ""},
		{"without packages", Spec{Name: "t", AptSources: []string{ok}}, "needs packages"},
		{"too many", Spec{Name: "t", Packages: []string{"jq"}, AptSources: make([]string, MaxAptSources+1)}, "at most"},
		{"bad entry", Spec{Name: "t", Packages: []string{"jq"}, AptSources: []string{ok, "deb http://127.0.0.1/ ./"}}, "not address"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.spec.Check()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got %v; want %q", err, tc.wantErr)
			}
		})
	}
}
