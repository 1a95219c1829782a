package corral

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
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
