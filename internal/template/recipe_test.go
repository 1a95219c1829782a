package template

import (
	"regexp"
	"testing"

	"github.com/corralhq/corral/internal/idrange"
)

// testBase is the uid range base of the builds made by the tests: the one
// a server picks on a host with no delegated ids, so that the shared cache
// holds one build for the template tests and the integration tests.
const testBase = idrange.SearchBase

// TestDigest checks that the recipe digest is stable (so the cache hits)
// and changes with anything that changes the build (so the cache misses).
func TestDigest(t *testing.T) {
	def := BaseOptions{}.Digest()
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(def) {
		t.Fatalf("digest %q is not hex sha256", def)
	}
	tests := []struct {
		name string
		opts BaseOptions
		same bool
	}{
		{"zero value again", BaseOptions{}, true},
		{"explicit defaults", BaseOptions{Mirror: DefaultMirror, Packages: DefaultBasePackages()}, true},
		{"mirror trailing slash", BaseOptions{Mirror: DefaultMirror + "/"}, true},
		{"package order", BaseOptions{Packages: reversed(DefaultBasePackages())}, true},
		{"duplicate package", BaseOptions{Packages: append(DefaultBasePackages(), "git")}, true},
		{"progress writer ignored", BaseOptions{Progress: new(discard)}, true},
		{"debootstrap path ignored", BaseOptions{Debootstrap: "/usr/sbin/debootstrap"}, true},
		{"extra package", BaseOptions{Packages: append(DefaultBasePackages(), "vim")}, false},
		{"fewer packages", BaseOptions{Packages: DefaultBasePackages()[1:]}, false},
		{"no packages", BaseOptions{Packages: []string{}}, false},
		{"other mirror", BaseOptions{Mirror: "http://ftp.de.debian.org/debian"}, false},
		{"other uid range base", BaseOptions{IDBase: 300000}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.opts.Digest()
			if (got == def) != tt.same {
				t.Errorf("Digest() = %s, default %s, want same=%v", got, def, tt.same)
			}
		})
	}
	if baseDirName(def) != "base-"+def[:16] {
		t.Errorf("baseDirName = %s", baseDirName(def))
	}
}

func TestValidatePackages(t *testing.T) {
	tests := []struct {
		pkgs []string
		ok   bool
	}{
		{DefaultBasePackages(), true},
		{[]string{"libstdc++6", "python3.11"}, true},
		{[]string{"--foreign"}, false},
		{[]string{"a,b"}, false},
		{[]string{""}, false},
		{[]string{"a b"}, false},
		{[]string{"../x"}, false},
	}
	for _, tt := range tests {
		if err := validatePackages(tt.pkgs); (err == nil) != tt.ok {
			t.Errorf("validatePackages(%q) = %v, want ok=%v", tt.pkgs, err, tt.ok)
		}
	}
}

func reversed(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[len(s)-1-i] = v
	}
	return out
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
