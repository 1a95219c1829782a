package integration

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corral "github.com/corralhq/corral/sdk/go"
)

// TestTemplateBuildVersions: a spec build (files, commands as root and
// user, env, start command) makes an immutable version that sandboxes pin;
// a new build does not change running sandboxes; a version can be made
// current again (rollback); a version in use cannot be deleted; a failed
// build registers nothing and leaves no files.
func TestTemplateBuildVersions(t *testing.T) {
	need(t)
	ctx := context.Background()
	c := corral.New(env.url, env.key)
	name := "tbuild" + strings.ToLower(randHex(3))
	spec := func(version, marker string) corral.TemplateSpec {
		return corral.TemplateSpec{Name: name, Version: version, Base: "base",
			Files: []corral.TemplateFile{{Path: "/home/user/app.txt", ContentBase64: base64.StdEncoding.EncodeToString([]byte(marker)), Owner: "user", Mode: "0640"}},
			Run:   []corral.TemplateCommand{{Command: "echo " + marker + " > /opt/marker"}, {Command: "echo $(id -un) > /home/user/who", User: "user"}},
			Env:   map[string]string{"TEMPLATE_MARK": marker}, Start: "sleep 600"}
	}
	var lines []string
	v1, err := c.BuildTemplate(ctx, spec("1", "one"), func(l string) { lines = append(lines, l) })
	if err != nil {
		t.Fatal(err)
	}
	if v1.Ref != name+":1" || !v1.Current || v1.Source != "build" || v1.Layers != 2 || !strings.HasPrefix(v1.Digest, "sha256:") {
		t.Fatalf("v1 %+v", v1)
	}
	if len(lines) < 5 || !strings.HasPrefix(lines[0], "[1/") {
		t.Fatalf("progress lines %q", lines)
	}
	a, err := c.Create(ctx, corral.CreateOptions{Template: name, Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), a.ID) })
	check := func(sb *corral.Sandbox, want string) {
		t.Helper()
		res, err := sb.Run(ctx, "cat /opt/marker /home/user/app.txt; echo; cat /home/user/who; echo $TEMPLATE_MARK; stat -c '%U %a' /home/user/app.txt; pgrep -x sleep >/dev/null && echo started", corral.RunOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Stdout != want+"\n"+want+"\nuser\n"+want+"\nuser 640\nstarted\n" {
			t.Fatalf("sandbox of %s sees %q", want, res.Stdout)
		}
	}
	waitFor(t, "the start command", 30*time.Second, func() bool {
		res, _ := a.Run(ctx, "pgrep -x sleep", corral.RunOptions{})
		return res != nil && res.ExitCode == 0
	})
	check(a, "one")

	v2, err := c.BuildTemplate(ctx, spec("2", "two"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !v2.Current {
		t.Fatal("a new build is not current")
	}
	check(a, "one") // the running sandbox keeps its version
	b, err := c.Create(ctx, corral.CreateOptions{Template: name, Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), b.ID) })
	waitFor(t, "the start command", 30*time.Second, func() bool {
		res, _ := b.Run(ctx, "pgrep -x sleep", corral.RunOptions{})
		return res != nil && res.ExitCode == 0
	})
	check(b, "two")

	// Immutable: the same version cannot be built twice.
	if _, err := c.BuildTemplate(ctx, spec("2", "again"), nil); err == nil {
		t.Fatal("rebuilding an existing version was accepted")
	}
	// In use: refused.
	if err := c.DeleteTemplate(ctx, name+":1"); err == nil {
		t.Fatal("deleting a version a running sandbox uses was accepted")
	}
	// Rollback.
	if _, err := c.UseTemplate(ctx, name+":1"); err != nil {
		t.Fatal(err)
	}
	cSb, err := c.Create(ctx, corral.CreateOptions{Template: name, Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), cSb.ID) })
	res, err := cSb.Run(ctx, "cat /opt/marker", corral.RunOptions{})
	if err != nil || res.Stdout != "one\n" {
		t.Fatalf("after rollback: %q %v", res.Stdout, err)
	}
	// Unused now: v2 can go, and its files with it.
	if _, err := c.Kill(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteTemplate(ctx, name+":2"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(env.dataDir, "template-versions", name, "2")); !os.IsNotExist(err) {
		t.Fatalf("files of the deleted version remain: %v", err)
	}

	// A failing build registers nothing and leaves nothing.
	bad := spec("3", "three")
	bad.Run = append(bad.Run, corral.TemplateCommand{Command: "echo about to fail; exit 7"})
	var badLines []string
	if _, err := c.BuildTemplate(ctx, bad, func(l string) { badLines = append(badLines, l) }); err == nil || !strings.Contains(err.Error(), "exit 7") {
		t.Fatalf("failing build: %v", err)
	}
	if !strings.Contains(strings.Join(badLines, "\n"), "about to fail") {
		t.Fatalf("the failing command's output was not streamed: %q", badLines)
	}
	list, err := c.Templates(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	for _, tv := range list {
		if tv.Version == "3" {
			t.Fatal("a failed build was registered")
		}
	}
	if _, err := os.Stat(filepath.Join(env.dataDir, "template-versions", name, "3")); !os.IsNotExist(err) {
		t.Fatalf("a failed build left files: %v", err)
	}
	// The CLI prints name:version last.
	specPath := filepath.Join(t.TempDir(), "spec.yaml")
	if err := os.WriteFile(specPath, []byte("name: "+name+"\nversion: cli\nrun:\n  - echo cli > /opt/marker\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := corralCLI(t, "", "template", "build", "--server", env.url, "--api-key", env.key, "-f", specPath)
	if code != 0 || strings.TrimSpace(out) != name+":cli" || !strings.Contains(stderr, "[1/") {
		t.Fatalf("corral template build: exit %d stdout %q stderr %q", code, out, stderr)
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
