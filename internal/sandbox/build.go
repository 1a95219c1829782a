package sandbox

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template/registry"
	"github.com/corralhq/corral/proto/process"
)

// BuildCommandTimeout bounds one build command.
const BuildCommandTimeout = 30 * time.Minute

// checkSpec validates a spec (registry.Spec.Check, and the tier, a
// sandbox notion); it changes nothing.
func checkSpec(s *registry.Spec) error {
	if err := s.Check(); err != nil {
		return err
	}
	if _, ok := Tiers[s.Tier]; s.Tier != "" && !ok {
		return invalid("tier must be light, medium or heavy")
	}
	return nil
}

// BuildTemplate builds a new template version from spec inside a sandbox
// of its base: files are written, packages installed (with egress only to
// the Debian mirrors and spec.Allow), commands run; then the sandbox's
// writable layer becomes the version's layer on top of the base's. Output
// goes to progress line by line. A failed build registers nothing.
func (m *Manager) BuildTemplate(ctx context.Context, spec registry.Spec, progress func(string)) (tv *store.TemplateVersion, err error) {
	if progress == nil {
		progress = func(string) {}
	}
	if err := checkSpec(&spec); err != nil {
		return nil, err
	}
	if spec.Base == "" || spec.Base == "debian:bookworm" {
		spec.Base = "base"
	}
	base, err := m.resolveTemplate(ctx, spec.Base, spec.Team)
	if err != nil {
		return nil, err
	}
	if spec.Version == "" {
		spec.Version = time.Now().UTC().Format("20060102-150405")
	}
	if _, _, err := m.templates.CheckNew(ctx, spec.Name+":"+spec.Version, spec.Team); err != nil {
		return nil, err
	}
	dir, err := m.templates.NewLayerDir(spec.Name, spec.Version)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	logf, err := os.OpenFile(filepath.Join(dir, "build.log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	say := func(format string, args ...any) {
		line := fmt.Sprintf(format, args...)
		fmt.Fprintln(logf, line)
		progress(line)
	}
	steps := 2 + len(spec.Run)
	if len(spec.Files) > 0 {
		steps++
	}
	if len(spec.Packages) > 0 {
		steps++
	}
	step := 0
	next := func(what string) { step++; say("[%d/%d] %s", step, steps, what) }

	// The build sandbox: its own task (builds make many calls), egress
	// only where the spec needs it.
	req := CreateRequest{Template: base.Ref(), Tier: "medium", Timeout: ptr(int64(2 * time.Hour / time.Second)),
		Metadata: map[string]string{"corral": "template-build", "template": spec.Name + ":" + spec.Version}, Agent: "corral-template-build",
		Team: teamOr(spec.Team)}
	allow := append([]string{}, spec.Allow...)
	switch {
	case len(spec.AptSources) > 0:
		for _, src := range spec.AptSources {
			h, _ := registry.AptSourceHost(src) // checked in checkSpec
			allow = append(allow, h)
		}
	case len(spec.Packages) > 0:
		allow = append(allow, registry.DebianMirrors...)
	}
	if len(allow) > 0 {
		req.Network, req.Allow = "allow", allow
	}
	if m.cfg.Governor != nil {
		t, err := m.cfg.Governor.Create(ctx, govern.TaskRequest{Team: req.Team, Agent: "corral-template-build", MaxCalls: 1000, MaxDurationS: 7200, MaxSandboxes: 1})
		if err != nil {
			return nil, err
		}
		req.Task = t.ID
		defer m.cfg.Governor.EndTask(context.WithoutCancel(ctx), t.ID)
	}
	next("start a build sandbox from " + req.Template)
	sb, err := m.Create(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("start build sandbox: %w", err)
	}
	defer func() { _, _ = m.Kill(context.WithoutCancel(ctx), sb.ID) }()

	if len(spec.Files) > 0 {
		next(fmt.Sprintf("copy %d files", len(spec.Files)))
		for _, f := range spec.Files {
			data, err := base64.StdEncoding.DecodeString(f.ContentBase64)
			if err != nil {
				return nil, invalid("file %s: content is not base64", f.Path)
			}
			if err := m.writeFile(ctx, sb.ID, f.Path, data); err != nil {
				return nil, fmt.Errorf("copy %s: %w", f.Path, err)
			}
			mode, owner := f.Mode, f.Owner
			if mode == "" {
				mode = "0644"
			}
			if owner == "" {
				owner = "root"
			}
			if err := m.buildRun(ctx, sb.ID, fmt.Sprintf("chown %s:%s %s && chmod %s %s", owner, owner, shellQuote(f.Path), mode, shellQuote(f.Path)), "root", say); err != nil {
				return nil, err
			}
		}
	}
	if len(spec.Packages) > 0 {
		next("install packages: " + strings.Join(spec.Packages, " "))
		apt := "apt-get"
		if len(spec.AptSources) > 0 {
			// The spec's sources, for this step only: a list file and an
			// empty parts directory outside /etc/apt, removed afterwards.
			list := strings.Join(spec.AptSources, "\n") + "\n"
			if err := m.writeFile(ctx, sb.ID, aptBuildList, []byte(list)); err != nil {
				return nil, fmt.Errorf("write apt sources: %w", err)
			}
			if err := m.buildRun(ctx, sb.ID, "chmod 0644 "+aptBuildList+" && mkdir -p "+aptBuildParts, "root", say); err != nil {
				return nil, err
			}
			apt = "apt-get -o Dir::Etc::SourceList=" + aptBuildList + " -o Dir::Etc::SourceParts=" + aptBuildParts
		}
		cmd := apt + " update && DEBIAN_FRONTEND=noninteractive " + apt + " install -y --no-install-recommends " + strings.Join(spec.Packages, " ") +
			" && apt-get clean && rm -rf /var/lib/apt/lists/* " + aptBuildList + " " + aptBuildParts
		if err := m.buildRun(ctx, sb.ID, cmd, "root", say); err != nil {
			return nil, err
		}
	}
	for _, c := range spec.Run {
		next("run: " + clipCommand(c.Command))
		user := c.User
		if user == "" {
			user = "root"
		}
		if err := m.buildRun(ctx, sb.ID, c.Command, user, say); err != nil {
			return nil, err
		}
	}
	next("save the layer")
	layer := filepath.Join(dir, "layer")
	size, err := m.driver.Snapshot(ctx, sb.ID, layer)
	if err != nil {
		return nil, fmt.Errorf("save layer: %w", err)
	}
	digest, err := registry.LayerDigest(base.Digest, layer)
	if err != nil {
		return nil, err
	}
	tv = &store.TemplateVersion{Name: spec.Name, Version: spec.Version, Digest: digest, Parent: base.Ref(), Source: registry.SourceBuild,
		RootFS: base.RootFS, Layers: append([]string{layer}, base.Layers...), SizeBytes: base.SizeBytes + size,
		BuildLog: filepath.Join(dir, "build.log"), CreatedAt: time.Now().UTC(),
		Config: store.TemplateConfig{Env: spec.Env, Workdir: spec.Workdir, Start: spec.Start, Runtime: spec.Runtime, Tier: spec.Tier},
		Team:   spec.Team}
	if err := m.templates.Add(ctx, tv); err != nil {
		return nil, err
	}
	m.auditBy(ctx, "", "template.built", map[string]any{"template": tv.Ref(), "parent": tv.Parent, "digest": digest, "bytes": size})
	say("built %s (%s, layer %d bytes)", tv.Ref(), digest[:19], size)
	return tv, nil
}

func ptr[T any](v T) *T { return &v }

// buildRun runs one build command, streaming its output; a non-zero exit
// fails the build.
func (m *Manager) buildRun(ctx context.Context, id, command, user string, say func(string, ...any)) error {
	p, err := m.StartProcess(ctx, id, &process.StartRequest{Process: &process.ProcessConfig{
		Cmd: "/bin/bash", Args: []string{"-l", "-c", command}}}, user, BuildCommandTimeout)
	if err != nil {
		return fmt.Errorf("start %q: %w", clipCommand(command), err)
	}
	defer p.Close()
	var partial bytes.Buffer
	flush := func(b []byte, final bool) {
		partial.Write(b)
		for {
			line, err := partial.ReadString('\n')
			if err != nil {
				if final && line != "" {
					say("  %s", line)
				} else {
					partial.WriteString(line)
				}
				return
			}
			say("  %s", strings.TrimRight(line, "\n"))
		}
	}
	for {
		msg, err := p.Receive()
		if err != nil || msg == nil {
			return fmt.Errorf("%q: the command's stream broke: %v", clipCommand(command), err)
		}
		ev := msg.GetEvent()
		if d := ev.GetData(); d != nil {
			flush(append(d.GetStdout(), d.GetStderr()...), false)
		}
		if end := ev.GetEnd(); end != nil {
			flush(nil, true)
			if !end.GetExited() || end.GetExitCode() != 0 {
				return &BuildError{Command: command, ExitCode: int(end.GetExitCode()), Status: end.GetStatus()}
			}
			return nil
		}
	}
}

// BuildError is a build command that failed.
type BuildError struct {
	Command  string
	ExitCode int
	Status   string
}

func (e *BuildError) Error() string {
	return fmt.Sprintf("build command %q failed: %s (exit %d)", clipCommand(e.Command), e.Status, e.ExitCode)
}

// writeFile writes data at path in sandbox id as root through the agent.
func (m *Manager) writeFile(ctx context.Context, id, path string, data []byte) error {
	u := "http://agent/files?path=" + url.QueryEscape(path) + "&username=root"
	req, err := http.NewRequestWithContext(ctx, "POST", u, bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := m.AgentHTTP(id).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("agent answered %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}
	return nil
}

// Where a build with apt_sources keeps them while it installs packages.
const (
	aptBuildList  = "/run/corral-build-sources.list"
	aptBuildParts = "/run/corral-build-sources.d"
)

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
