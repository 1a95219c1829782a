package template

import (
	"bytes"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/corralhq/corral/internal/interpreter"
)

// TestCodeInterpreterDigest checks that the code-interpreter recipe's
// digest is stable (so the cache hits and CI builds it once) and changes
// with everything its image holds, so that a corral with a changed
// interpreter server, package list or base never runs a stale cached
// image: the server's source, the mirror, the uid range base.
func TestCodeInterpreterDigest(t *testing.T) {
	def := CodeInterpreterOptions{}.Digest()
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(def) {
		t.Fatalf("digest %q is not hex sha256", def)
	}
	if def == (BaseOptions{}).Digest() {
		t.Fatal("the code-interpreter digest equals the base's")
	}
	changed := append(interpreter.Server(), "\n# changed\n"...)
	tests := []struct {
		name string
		opts CodeInterpreterOptions
		same bool
	}{
		{"zero value again", CodeInterpreterOptions{}, true},
		{"the built-in server given", CodeInterpreterOptions{Server: interpreter.Server()}, true},
		{"progress and debootstrap ignored", CodeInterpreterOptions{Progress: new(discard), Debootstrap: "/usr/sbin/debootstrap"}, true},
		{"other server source", CodeInterpreterOptions{Server: changed}, false},
		{"empty server", CodeInterpreterOptions{Server: []byte{}}, false},
		{"other mirror", CodeInterpreterOptions{Mirror: "http://ftp.de.debian.org/debian"}, false},
		{"other uid range base", CodeInterpreterOptions{IDBase: 300000}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.opts.Digest(); (got == def) != tt.same {
				t.Errorf("Digest() = %s, default %s, want same=%v", got, def, tt.same)
			}
		})
	}
}

// TestCodeInterpreterRecipe checks what the build is made of: the base's
// debootstrap packages, Debian's Jupyter, matplotlib, pandas and numpy
// packages installed after it, the server at its path, and names and a
// version distinct from the base's.
func TestCodeInterpreterRecipe(t *testing.T) {
	r := CodeInterpreterOptions{IDBase: testBase}.recipe()
	if !slices.Equal(r.packages, (BaseOptions{}).packages()) {
		t.Errorf("debootstrap packages %v, want the base's", r.packages)
	}
	for _, p := range []string{"python3-ipykernel", "python3-jupyter-client", "python3-matplotlib", "python3-pandas", "python3-numpy"} {
		if !slices.Contains(r.extra, p) {
			t.Errorf("package %s missing from %v", p, r.extra)
		}
	}
	if err := validatePackages(r.allPackages()); err != nil {
		t.Error(err)
	}
	if len(r.files) != 1 || r.files[0].Path != interpreter.ServerPath || !bytes.Equal(r.files[0].Content, interpreter.Server()) || r.files[0].Mode != 0o644 {
		t.Errorf("files %+v, want the server at %s", r.files, interpreter.ServerPath)
	}
	if !strings.HasPrefix(r.dirName, "code-interpreter-") || r.name != "code-interpreter" || !strings.HasPrefix(r.version, BaseSuite+"-r") {
		t.Errorf("names %q %q %q", r.name, r.dirName, r.version)
	}
	if !bytes.Contains(interpreter.Server(), []byte("def main(")) {
		t.Error("the embedded server is not the interpreter server")
	}
}
