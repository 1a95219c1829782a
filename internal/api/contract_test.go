package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/govern"
	"github.com/corralhq/corral/internal/runtime"
	"github.com/corralhq/corral/internal/sandbox"
	"github.com/corralhq/corral/internal/store"
	"github.com/corralhq/corral/internal/template"
	"github.com/corralhq/corral/internal/template/registry"
	corral "github.com/corralhq/corral/sdk/go"
)

// wirePairs pairs every JSON object the native REST API answers with the
// Go SDK type that decodes it. Views the SDK has no call for are listed in
// noSDKView instead, with the reason.
var wirePairs = []struct {
	name     string
	api, sdk any // pointers to zero values
}{
	{"sandbox", new(sandboxView), new(corral.Sandbox)},
	{"exec", new(execResponse), new(corral.ExecResult)},
	{"network", new(networkView), new(corral.Network)},
	{"secret", new(secretView), new(corral.Secret)},
	{"audit event", new(store.Event), new(corral.Event)},
	{"pool", new(poolView), new(corral.Pool)},
	{"snapshot", new(snapshotView), new(corral.SnapshotInfo)},
	{"task", new(taskView), new(corral.Task)},
	{"template", new(templateView), new(corral.TemplateInfo)},
	{"template import", new(importView), new(corral.ImportedTemplate)},
	{"template layer", new(registry.LayerInspection), new(corral.TemplateLayer)},
	{"volume", new(volumeView), new(corral.Volume)},
	{"key", new(keyView), new(corral.KeyInfo)},
	{"new key", new(newKeyView), new(corral.NewKey)},
	{"usage", new(usageReportView), new(corral.UsageReport)},
	{"team", new(teamView), new(corral.Team)},
}

// noSDKView lists the native API's views that have no exported SDK type,
// each with the reason (and, where the SDK decodes them inside a call,
// the test that checks that call).
var noSDKView = map[any]string{
	new(commandView):        "GET /v1/sandboxes/{id}/commands is for the CLI and operators; the SDK has no call for it",
	new(sampleView):         "GET /v1/sandboxes/{id}/metrics is for the CLI and operators; the SDK has no call for it (the sample a list or get carries as current is checked inside the sandbox pair, as corral.Sample)",
	new(runtime.Process):    "GET /v1/sandboxes/{id}/processes is for the CLI; the SDK lists processes through the agent (ProcessInfo)",
	new(template.LayerInfo): "image_layers of /inspect: the SDK's InspectTemplate returns the template's own layers only",
	new(forkView):           "decoded inside Client.Fork, which returns the sandboxes and a *ForkError; TestForkPartialFailureReachesSDK",
}

// wireAllow is the short list of deliberate differences between an API
// view and its SDK type, keyed "pair: direction path", each with its
// reason. An entry that no longer matches a difference fails the test, so
// that the list only shrinks.
// (Today there is none: a template's config and an event's data, which
// the SDK keeps as raw JSON, are not differences but opaque objects.)
var wireAllow = map[string]string{}

// TestWireContract is the contract between the native API and the Go SDK
// (issue 11): for every view the API answers, it fills every field of the
// API type, encodes it, decodes the JSON into the SDK type and encodes
// that again; a field the SDK lacks (it drops it) or decodes as another
// JSON kind fails. In the other direction it fills every field of the SDK
// type and fails on a field the API does not send. Defends against the SDK
// and the server drifting apart silently: a field added to the server that
// SDK users never see, or an SDK field that is always zero.
func TestWireContract(t *testing.T) {
	used := map[string]bool{}
	for _, p := range wirePairs {
		t.Run(p.name, func(t *testing.T) {
			apiJSON := mustMarshal(t, filled(p.api))
			sdkFromAPI := reflect.New(reflect.TypeOf(p.sdk).Elem()).Interface()
			if err := json.Unmarshal(apiJSON, sdkFromAPI); err != nil {
				t.Fatalf("the SDK's %T cannot decode the API's %T: %v\nJSON: %s", p.sdk, p.api, err, apiJSON)
			}
			apiShape := shapeOf(t, apiJSON)
			keptShape := shapeOf(t, mustMarshal(t, sdkFromAPI))
			sdkShape := shapeOf(t, mustMarshal(t, filled(p.sdk)))

			var diffs []string
			for path, kind := range apiShape {
				key := p.name + ": sdk lacks " + path
				switch k, ok := keptShape[path]; {
				case !ok && !coveredByOpaque(path, keptShape):
					if _, allowed := wireAllow[key]; allowed {
						used[key] = true
						continue
					}
					diffs = append(diffs, fmt.Sprintf("the SDK's %T drops %s (%s) of the API's %T\x00%s", p.sdk, path, kind, p.api, path))
				case ok && k != kind:
					diffs = append(diffs, fmt.Sprintf("%s: the API sends %s, the SDK's %T sends back %s", path, kind, p.sdk, k))
				}
			}
			for path, kind := range sdkShape {
				key := p.name + ": api lacks " + path
				switch k, ok := apiShape[path]; {
				case !ok && !coveredByOpaque(path, apiShape) && !isOpaque(sdkShape, path):
					if _, allowed := wireAllow[key]; allowed {
						used[key] = true
						continue
					}
					diffs = append(diffs, fmt.Sprintf("the SDK's %T has %s (%s), which the API's %T does not send\x00%s", p.sdk, path, kind, p.api, path))
				case ok && k != kind && kind != "opaque":
					diffs = append(diffs, fmt.Sprintf("%s: the SDK's %T has %s, the API sends %s", path, p.sdk, kind, k))
				}
			}
			diffs = dropNested(diffs)
			sort.Strings(diffs)
			for _, d := range diffs {
				t.Error(d)
			}
		})
	}
	for key := range wireAllow {
		if !used[key] {
			t.Errorf("wireAllow entry %q matches no difference; remove it", key)
		}
	}
}

// TestWireContractCoversEveryView fails when a view type is added to the
// API without a place in wirePairs or noSDKView: the contract test only
// protects the views it knows.
func TestWireContractCoversEveryView(t *testing.T) {
	known := map[reflect.Type]bool{}
	for _, p := range wirePairs {
		known[reflect.TypeOf(p.api).Elem()] = true
	}
	for v, reason := range noSDKView {
		if reason == "" {
			t.Errorf("noSDKView %T has no reason", v)
		}
		known[reflect.TypeOf(v).Elem()] = true
	}
	// Every named type of this package whose name ends in "View" is a
	// response object; listing them here by hand keeps the check honest
	// without parsing the package's source.
	views := []any{sandboxView{}, commandView{}, networkView{}, usageView{}, secretView{}, poolView{},
		snapshotView{}, taskView{}, templateView{}, importView{}, volumeView{}, sampleView{}, forkView{}, keyView{}, newKeyView{}, usageReportView{}, teamView{}}
	for _, v := range views {
		typ := reflect.TypeOf(v)
		if typ == reflect.TypeOf(usageView{}) {
			continue // nested in networkView
		}
		if !known[typ] {
			t.Errorf("view %s is in neither wirePairs nor noSDKView", typ)
		}
	}
	names := viewTypeNames(t)
	var listed []string
	for _, v := range views {
		listed = append(listed, reflect.TypeOf(v).Name())
	}
	for _, n := range names {
		if !slices.Contains(listed, n) {
			t.Errorf("view type %s (declared in internal/api) is missing from this test's list", n)
		}
	}
}

// filled returns a new value of v's type with every exported field set:
// strings to a timestamp (so that time fields decode), numbers non-zero
// with a fraction for floats (so that an SDK int for an API float fails),
// one element in every slice and map, pointers allocated.
func filled(v any) any {
	rv := reflect.New(reflect.TypeOf(v).Elem())
	fill(rv.Elem(), 0)
	return rv.Interface()
}

var (
	timeType = reflect.TypeOf(time.Time{})
	rawType  = reflect.TypeOf(json.RawMessage{})
)

const filledTime = "2026-01-02T03:04:05.123Z"

func fill(v reflect.Value, depth int) {
	if depth > 8 || !v.CanSet() {
		return
	}
	switch {
	case v.Type() == timeType:
		tm, _ := time.Parse(time.RFC3339Nano, filledTime)
		v.Set(reflect.ValueOf(tm))
		return
	case v.Type() == rawType:
		v.Set(reflect.ValueOf(json.RawMessage(`{}`)))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(filledTime)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(7)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(7.5)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fill(p.Elem(), depth+1)
		v.Set(p)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(s.Index(0), depth+1)
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k := reflect.New(v.Type().Key()).Elem()
		fill(k, depth+1)
		e := reflect.New(v.Type().Elem()).Elem()
		fill(e, depth+1)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), depth+1)
			}
		}
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %T: %v", v, err)
	}
	return b
}

// shapeOf maps every path of a JSON document ("resources.cpu",
// "volumes[].id") to its JSON kind. An empty object is "opaque": the SDK
// keeps it as raw JSON and so keeps whatever the server puts there.
func shapeOf(t *testing.T, b []byte) map[string]string {
	t.Helper()
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	out := map[string]string{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		join := func(k string) string {
			if prefix == "" {
				return k
			}
			return prefix + "." + k
		}
		switch x := v.(type) {
		case map[string]any:
			if prefix != "" {
				out[prefix] = "object"
				if len(x) == 0 {
					out[prefix] = "opaque"
				}
			}
			for k, e := range x {
				walk(join(k), e)
			}
		case []any:
			out[prefix] = "array"
			for _, e := range x {
				walk(prefix+"[]", e)
			}
		case string:
			out[prefix] = "string"
		case float64:
			out[prefix] = "number"
		case bool:
			out[prefix] = "bool"
		case nil:
			out[prefix] = "null"
		}
	}
	walk("", doc)
	return out
}

// coveredByOpaque reports whether path lies under an opaque (raw JSON)
// object of shape.
func coveredByOpaque(path string, shape map[string]string) bool {
	for p, k := range shape {
		if k == "opaque" && strings.HasPrefix(path, p+".") {
			return true
		}
	}
	return false
}

func isOpaque(shape map[string]string, path string) bool { return shape[path] == "opaque" }

// viewTypeNames returns the names of the types declared in this package's
// non-test files that end in "View".
func viewTypeNames(t *testing.T) []string {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, s := range gd.Specs {
				if n := s.(*ast.TypeSpec).Name.Name; strings.HasSuffix(n, "View") {
					names = append(names, n)
				}
			}
		}
	}
	return names
}

// dropNested removes the differences about fields below a field that is
// itself missing (a missing "warnings" also misses "warnings[]"), and the
// path suffix (after NUL) that messages carry for this.
func dropNested(diffs []string) []string {
	var missing []string
	for _, d := range diffs {
		if _, path, ok := strings.Cut(d, "\x00"); ok {
			missing = append(missing, path)
		}
	}
	var out []string
outer:
	for _, d := range diffs {
		msg, path, ok := strings.Cut(d, "\x00")
		if ok {
			for _, m := range missing {
				if strings.HasPrefix(path, m+".") || strings.HasPrefix(path, m+"[]") {
					continue outer
				}
			}
		}
		out = append(out, msg)
	}
	return out
}

// TestErrorCodesOneSource checks the error codes the native API answers
// with: the API's constants are the SDK's (by definition, see errors.go),
// the codes of a tripped brake, which the API passes on from the governor
// as they are, equal the SDK's, and docs/api.md's error table lists each.
// Defends against a code the server sends that SDK users cannot name, or
// that the documentation does not explain.
func TestErrorCodesOneSource(t *testing.T) {
	brakes := map[string]string{
		govern.CodeBudgetExhausted: corral.CodeBudgetExhausted,
		govern.CodeLoopDetected:    corral.CodeLoopDetected,
		govern.CodeTaskEnded:       corral.CodeTaskEnded,
	}
	for g, c := range brakes {
		if g != c {
			t.Errorf("the governor's code %q is the SDK's %q", g, c)
		}
	}
	answered := []string{CodeInvalidJSON, CodeInvalidArgument, CodeUnauthenticated, CodeNotFound, CodeConflict,
		CodeBodyTooLarge, CodeCapacityExceeded, CodeTooManyStreams, CodeInternal, CodeUnavailable, CodeAgentReply,
		CodeEnvSecret, CodeNetworkUnavailable, CodeVolumesUnavailable, CodeForbidden,
		govern.CodeBudgetExhausted, govern.CodeLoopDetected, govern.CodeTaskEnded}
	doc, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range answered {
		if !regexp.MustCompile("(?m)^\\| [0-9]{3} \\| `" + regexp.QuoteMeta(c) + "` \\|").Match(doc) {
			t.Errorf("docs/api.md's error table has no row for %q", c)
		}
	}
}

// requestPairs pairs the native API's named request types with the SDK
// calls that send them. Each call gets fully filled options (see filled);
// send may make several calls where options exclude each other.
var requestPairs = []struct {
	name string
	api  any // pointer to the type the handler decodes
	send func(ctx context.Context, c *corral.Client)
}{
	{"create", new(sandbox.CreateRequest), func(ctx context.Context, c *corral.Client) {
		c.Create(ctx, *filled(new(corral.CreateOptions)).(*corral.CreateOptions))
	}},
	{"exec", new(execRequest), func(ctx context.Context, c *corral.Client) {
		req := *filled(new(corral.ExecRequest)).(*corral.ExecRequest)
		argv, shell := req, req
		argv.Command, shell.Cmd = "", nil
		c.Exec(ctx, "sbx", argv)
		c.Exec(ctx, "sbx", shell)
	}},
	{"network", new(sandbox.NetworkRequest), func(ctx context.Context, c *corral.Client) {
		c.SetNetwork(ctx, "sbx", "allow", []string{"example.com"})
	}},
	{"task", new(govern.TaskRequest), func(ctx context.Context, c *corral.Client) {
		o := *filled(new(corral.TaskOptions)).(*corral.TaskOptions)
		o.MaxDuration = 7 * time.Second
		c.CreateTask(ctx, o)
	}},
	{"task change", new(govern.BudgetChange), func(ctx context.Context, c *corral.Client) {
		c.ChangeTask(ctx, "task", *filled(new(corral.TaskChange)).(*corral.TaskChange))
	}},
	{"template build", new(registry.Spec), func(ctx context.Context, c *corral.Client) {
		c.BuildTemplate(ctx, *filled(new(corral.TemplateSpec)).(*corral.TemplateSpec), nil)
	}},
	{"key", new(keyRequest), func(ctx context.Context, c *corral.Client) {
		c.CreateKey(ctx, *filled(new(corral.KeyRequest)).(*corral.KeyRequest))
	}},
	{"team quota", new(store.TeamQuota), func(ctx context.Context, c *corral.Client) {
		c.SetTeamQuota(ctx, "t", *filled(new(corral.QuotaOverride)).(*corral.QuotaOverride))
	}},
}

// requestAllow lists the request fields of the API that the SDK cannot
// send, keyed "pair: path", each with its reason. An entry that matches no
// difference fails the test.
var requestAllow = map[string]string{}

// TestRequestContract is the other half of the contract (issue 11): each
// SDK call in requestPairs sends its request, fully filled, to a server
// that records the body; the body must decode into the type the API's
// handler decodes, with unknown fields refused as the handler refuses them
// (an SDK field the API lacks is a 400 invalid_json for every SDK user);
// and every field of the API's type must be one the SDK sends, unless
// requestAllow says why not.
func TestRequestContract(t *testing.T) {
	var mu sync.Mutex
	var bodies []json.RawMessage
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, b)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	c := corral.New(srv.URL, "key")
	used := map[string]bool{}
	for _, p := range requestPairs {
		t.Run(p.name, func(t *testing.T) {
			mu.Lock()
			bodies = nil
			mu.Unlock()
			p.send(t.Context(), c)
			mu.Lock()
			got := bodies
			mu.Unlock()
			if len(got) == 0 {
				t.Fatal("the SDK call sent no request")
			}
			sent := map[string]string{}
			for _, b := range got {
				dec := json.NewDecoder(bytes.NewReader(b))
				dec.DisallowUnknownFields()
				v := reflect.New(reflect.TypeOf(p.api).Elem()).Interface()
				if err := dec.Decode(v); err != nil {
					t.Errorf("the API's %T refuses the SDK's request: %v\nJSON: %s", p.api, err, b)
				}
				maps.Copy(sent, shapeOf(t, b))
			}
			apiShape := shapeOf(t, mustMarshal(t, filled(p.api)))
			var diffs []string
			for path, kind := range apiShape {
				key := p.name + ": " + path
				if k, ok := sent[path]; ok {
					if k != kind {
						diffs = append(diffs, fmt.Sprintf("%s: the API takes %s, the SDK sends %s", path, kind, k))
					}
					continue
				}
				if _, allowed := requestAllow[key]; allowed {
					used[key] = true
					continue
				}
				diffs = append(diffs, fmt.Sprintf("the SDK cannot send %s (%s) of the API's %T\x00%s", path, kind, p.api, path))
			}
			diffs = dropNested(diffs)
			sort.Strings(diffs)
			for _, d := range diffs {
				t.Error(d)
			}
		})
	}
	for key := range requestAllow {
		if !used[key] {
			t.Errorf("requestAllow entry %q matches no difference; remove it", key)
		}
	}
}

// TestForkPartialFailureReachesSDK: a fork of which only some copies
// start answers 201 with the started sandboxes and an "error" (the
// fork's partial failure). The SDK used to drop "error" and return the
// started sandboxes with a nil error, so a caller asking for two copies
// got one and no word of why. It must return the started sandboxes and a
// *corral.ForkError naming the count and the server's reason.
func TestForkPartialFailureReachesSDK(t *testing.T) {
	answer := *filled(new(forkView)).(*forkView) // one sandbox, an error
	answer.Error = "fork 2 of 2: capacity_exceeded: too many sandboxes"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusCreated, answer)
	}))
	defer srv.Close()
	sbs, err := corral.New(srv.URL, "key").Fork(t.Context(), "sbx", 2)
	var fe *corral.ForkError
	if !errors.As(err, &fe) {
		t.Fatalf("Fork of a partly failed fork: err %v, want a *corral.ForkError", err)
	}
	if len(sbs) != 1 || sbs[0].ID != answer.Sandboxes[0].ID {
		t.Fatalf("Fork returned %d sandboxes, want the 1 that started", len(sbs))
	}
	if fe.Started != 1 || fe.Requested != 2 || fe.Message != answer.Error || fe.Snapshot != answer.Snapshot.ID {
		t.Fatalf("ForkError %+v does not carry the counts, the reason and the snapshot", fe)
	}
}
