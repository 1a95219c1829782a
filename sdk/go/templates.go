package corral

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// TemplateInfo is one template version.
type TemplateInfo struct {
	Name      string          `json:"name"`
	Version   string          `json:"version"`
	Ref       string          `json:"ref"` // name:version
	Digest    string          `json:"digest"`
	Parent    string          `json:"parent"`
	Source    string          `json:"source"` // debootstrap, build, import
	SizeBytes int64           `json:"size_bytes"`
	Layers    int             `json:"layers"`
	Current   bool            `json:"current"`
	Config    json.RawMessage `json:"config"`
	CreatedAt time.Time       `json:"created_at"`
	// Team is the team that owns it ("" for a template published for every team).
	Team string `json:"team"`
}

// TemplateSpec is a template build (docs/environments.md).
type TemplateSpec struct {
	Name     string            `json:"name"`
	Version  string            `json:"version,omitempty"`
	Base     string            `json:"base,omitempty"`
	Packages []string          `json:"packages,omitempty"`
	Files    []TemplateFile    `json:"files,omitempty"`
	Run      []TemplateCommand `json:"run,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Workdir  string            `json:"workdir,omitempty"`
	Runtime  string            `json:"runtime,omitempty"`
	Tier     string            `json:"tier,omitempty"`
	Start    string            `json:"start,omitempty"`
	Allow    []string          `json:"allow,omitempty"`
	// AptSources replace the apt sources for the package step only
	// (sources.list lines); their hosts replace the Debian mirrors in
	// the build's allowlist.
	AptSources []string `json:"apt_sources,omitempty"`
}

// TemplateFile is a file copied into a template.
type TemplateFile struct {
	Path          string `json:"path"`
	ContentBase64 string `json:"content_base64"`
	Mode          string `json:"mode,omitempty"`
	Owner         string `json:"owner,omitempty"`
}

// TemplateCommand is a build command.
type TemplateCommand struct {
	Command string `json:"command"`
	User    string `json:"user,omitempty"`
}

// Templates lists template versions (of name, when not "").
func (c *Client) Templates(ctx context.Context, name string) ([]TemplateInfo, error) {
	q := url.Values{}
	if name != "" {
		q.Set("name", name)
	}
	var out struct {
		Templates []TemplateInfo `json:"templates"`
	}
	if err := c.do(ctx, "GET", "/v1/templates", q, nil, &out); err != nil {
		return nil, err
	}
	return out.Templates, nil
}

// UseTemplate makes name:version current (POST /v1/templates/{ref}/current).
func (c *Client) UseTemplate(ctx context.Context, ref string) (*TemplateInfo, error) {
	var t TemplateInfo
	if err := c.do(ctx, "POST", "/v1/templates/"+url.PathEscape(ref)+"/current", nil, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// PublishTemplate makes every version of template name usable by every
// team (admin keys only; a member key gets CodeForbidden).
func (c *Client) PublishTemplate(ctx context.Context, name string) (*TemplateInfo, error) {
	var t TemplateInfo
	if err := c.do(ctx, "POST", "/v1/templates/"+url.PathEscape(name)+"/publish", nil, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// DeleteTemplate removes an unused template version.
func (c *Client) DeleteTemplate(ctx context.Context, ref string) error {
	return c.do(ctx, "DELETE", "/v1/templates/"+url.PathEscape(ref), nil, nil, nil)
}

// BuildTemplate builds a template version; onLog receives each progress
// line as it comes. It returns the new version.
func (c *Client) BuildTemplate(ctx context.Context, spec TemplateSpec, onLog func(string)) (*TemplateInfo, error) {
	body, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, "POST", c.baseURL+"/v1/templates/builds", strings.NewReader(string(body)))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, errorFromResponse(resp)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var line struct {
			Log      *string       `json:"log"`
			Template *TemplateInfo `json:"template"`
			Error    *APIError     `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			continue
		}
		switch {
		case line.Log != nil && onLog != nil:
			onLog(*line.Log)
		case line.Template != nil:
			return line.Template, nil
		case line.Error != nil:
			line.Error.Status = http.StatusBadRequest
			return nil, line.Error
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("template build: the stream ended without a result")
}

// ImportedTemplate is the answer of an import.
type ImportedTemplate struct {
	Template TemplateInfo `json:"template"`
	Log      string       `json:"log"`
}

// ImportTemplate imports a `docker save` or OCI image tarball read from r
// as template version ref ("name:version").
func (c *Client) ImportTemplate(ctx context.Context, ref string, r io.Reader) (*ImportedTemplate, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", c.baseURL+"/v1/templates/import?ref="+url.QueryEscape(ref), r)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, errorFromResponse(resp)
	}
	var out ImportedTemplate
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, err
	}
	return &out, nil
}

// PullTemplate imports the registry image image (name[:tag|@digest]) as
// template version ref; insecure allows plain-HTTP registries.
func (c *Client) PullTemplate(ctx context.Context, ref, image string, insecure bool) (*ImportedTemplate, error) {
	body := map[string]any{"ref": ref, "image": image, "insecure": insecure}
	var out ImportedTemplate
	if err := c.do(ctx, "POST", "/v1/templates/import", nil, body, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ImportTemplateLayout imports an OCI layout directory on the server's host.
func (c *Client) ImportTemplateLayout(ctx context.Context, ref, dir string) (*ImportedTemplate, error) {
	body := map[string]any{"ref": ref, "layout": dir}
	var out ImportedTemplate
	if err := c.do(ctx, "POST", "/v1/templates/import", nil, body, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SaveTemplate makes template version ref ("name:version") from a running
// sandbox's files (POST /v1/sandboxes/{id}/template).
func (c *Client) SaveTemplate(ctx context.Context, sandboxID, ref string) (*TemplateInfo, error) {
	body := map[string]string{"ref": ref}
	var t TemplateInfo
	if err := c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/template", nil, body, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// TemplateLayer is one layer of a template inspection.
type TemplateLayer struct {
	Layer   string `json:"layer"`
	Bytes   int64  `json:"bytes"`
	Files   int    `json:"files"`
	Largest []struct {
		Path  string `json:"path"`
		Bytes int64  `json:"bytes"`
	} `json:"largest"`
}

// InspectTemplate returns a template's size by layer and each layer's top
// largest files.
func (c *Client) InspectTemplate(ctx context.Context, ref string, top int) ([]TemplateLayer, error) {
	q := url.Values{}
	if top > 0 {
		q.Set("top", fmt.Sprint(top))
	}
	var out struct {
		Layers []TemplateLayer `json:"layers"`
	}
	if err := c.do(ctx, "GET", "/v1/templates/"+url.PathEscape(ref)+"/inspect", q, nil, &out); err != nil {
		return nil, err
	}
	return out.Layers, nil
}
