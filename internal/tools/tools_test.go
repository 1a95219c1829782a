package tools

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
)

// fakeEnv records what a call asked of the API; the real Env (the API's
// sandboxes) is covered by test/integration's TestToolsHTTP and TestMCP*.
type fakeEnv struct {
	calls []string
	exec  ExecRequest
	path  string
	data  string
	use   Use
	named string
	kept  bool
	fail  error
	sbReq SandboxRequest
	max   int64
}

func (f *fakeEnv) Sandbox(_ context.Context, named string, use Use) (string, bool, func(), error) {
	f.calls = append(f.calls, "sandbox")
	f.named, f.use = named, use
	return "sb1", f.kept, func() { f.calls = append(f.calls, "release") }, nil
}

func (f *fakeEnv) Exec(_ context.Context, sb string, req ExecRequest) (*ExecResult, error) {
	f.calls = append(f.calls, "exec "+sb)
	f.exec = req
	if f.fail != nil {
		return nil, f.fail
	}
	return &ExecResult{Stdout: "out"}, nil
}

func (f *fakeEnv) ReadFile(_ context.Context, sb, path string, max int64) (*ReadResult, error) {
	f.calls = append(f.calls, "read "+sb)
	f.path, f.max = path, max
	return &ReadResult{Path: path}, f.fail
}

func (f *fakeEnv) WriteFile(_ context.Context, sb, path string, data []byte) (*WriteResult, error) {
	f.calls = append(f.calls, "write "+sb)
	f.path, f.data = path, string(data)
	return &WriteResult{Path: path}, f.fail
}

func (f *fakeEnv) ListFiles(_ context.Context, sb, path string, max int) (*ListResult, error) {
	f.calls = append(f.calls, "list "+sb)
	f.path, f.max = path, int64(max)
	return &ListResult{Path: path}, f.fail
}

func (f *fakeEnv) CreateSandbox(_ context.Context, req SandboxRequest) (*SandboxResult, error) {
	f.calls = append(f.calls, "create")
	f.sbReq = req
	return &SandboxResult{SandboxID: "sb2"}, f.fail
}

func (f *fakeEnv) KillSandbox(_ context.Context, sb string) (*KillResult, error) {
	f.calls = append(f.calls, "kill "+sb)
	return &KillResult{SandboxID: sb, Killed: true}, f.fail
}

func (f *fakeEnv) Snapshot(_ context.Context, sb, name string) (*SnapshotResult, error) {
	f.calls = append(f.calls, "snapshot "+sb+" "+name)
	return &SnapshotResult{SandboxID: sb, SnapshotID: "sn1"}, f.fail
}

var toolName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// TestSchemas checks that every tool's arguments schema, on both
// surfaces, is a JSON Schema a validator accepts (the MCP SDK's,
// github.com/google/jsonschema-go), of the shape function calling needs
// (an object, every property typed and described, required ones listed,
// nothing else allowed), that names are valid function names and unique,
// and that only MCP's sandbox-bound tools take sandbox_id.
func TestSchemas(t *testing.T) {
	for _, s := range []Surface{FunctionCalling, MCP} {
		seen := map[string]bool{}
		for _, tool := range On(s) {
			name := tool.NameIn(s)
			if !toolName.MatchString(name) || seen[name] {
				t.Errorf("surface %d: tool name %q invalid or repeated", s, name)
			}
			seen[name] = true
			if tool.Description == "" {
				t.Errorf("%s: no description", name)
			}
			raw, err := json.Marshal(tool.Schema(s))
			if err != nil {
				t.Fatal(err)
			}
			var js jsonschema.Schema
			if err := json.Unmarshal(raw, &js); err != nil {
				t.Fatalf("%s: schema %s: %v", name, raw, err)
			}
			if _, err := js.Resolve(nil); err != nil {
				t.Errorf("%s: schema %s does not resolve: %v", name, raw, err)
			}
			if js.Type != "object" || js.AdditionalProperties == nil {
				t.Errorf("%s: schema %s is not a closed object", name, raw)
			}
			for pname, p := range js.Properties {
				if (p.Type != "string" && p.Type != "integer") || p.Description == "" {
					t.Errorf("%s.%s: type %q, description %q", name, pname, p.Type, p.Description)
				}
			}
			for _, r := range js.Required {
				if js.Properties[r] == nil {
					t.Errorf("%s: required %q is no property", name, r)
				}
			}
			_, hasID := js.Properties["sandbox_id"]
			if hasID != (s == MCP && tool.InSandbox) {
				t.Errorf("%s on surface %d: sandbox_id present %v", name, s, hasID)
			}
		}
	}
	var fc []string
	for _, tool := range On(FunctionCalling) {
		fc = append(fc, tool.Name)
	}
	if want := []string{"execute_code", "run_command", "read_file", "write_file", "list_files"}; !slices.Equal(fc, want) {
		t.Errorf("function-calling tools %v, want %v", fc, want)
	}
}

// TestSchemaAgreesWithCheck checks that the arguments the validator of
// the published schema accepts are the ones Call accepts, so that a
// model following the schema is never refused and one ignoring it never
// gets through.
func TestSchemaAgreesWithCheck(t *testing.T) {
	tool, _ := Lookup(MCP, "run_command")
	raw, _ := json.Marshal(tool.Schema(MCP))
	var js jsonschema.Schema
	_ = json.Unmarshal(raw, &js)
	rs, err := js.Resolve(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range []string{
		`{"command":"ls"}`, `{"command":"ls","timeout":5}`, `{"command":"ls","timeout":600}`,
		`{"command":"ls","timeout":0}`, `{"command":"ls","timeout":601}`, `{"command":"ls","timeout":"5"}`,
		`{"command":"ls","cwd":"/tmp","sandbox_id":"x"}`, `{"command":"ls","extra":1}`, `{}`, `{"command":5}`,
		`{"command":"ls","timeout":2.5}`,
	} {
		var v map[string]any
		_ = json.Unmarshal([]byte(args), &v)
		schemaOK := rs.Validate(v) == nil
		_, checkErr := checkArgs(tool.ParamsIn(MCP), json.RawMessage(args))
		if schemaOK != (checkErr == nil) {
			t.Errorf("%s: schema accepts %v, Call's check says %v", args, schemaOK, checkErr)
		}
	}
}

// TestDefinitions checks the two function-calling formats.
func TestDefinitions(t *testing.T) {
	oa, err := Definitions(FormatOpenAI)
	if err != nil || len(oa) != 5 || oa[0]["type"] != "function" {
		t.Fatalf("openai: %v %v", oa, err)
	}
	fn := oa[0]["function"].(map[string]any)
	if fn["name"] != "execute_code" || fn["parameters"].(map[string]any)["type"] != "object" {
		t.Errorf("openai definition: %v", fn)
	}
	an, err := Definitions(FormatAnthropic)
	if err != nil || len(an) != 5 || an[1]["name"] != "run_command" || an[1]["input_schema"] == nil {
		t.Fatalf("anthropic: %v %v", an, err)
	}
	var te *Error
	if _, err := Definitions("gemini"); !errors.As(err, &te) || te.Code != CodeInvalidArgument {
		t.Errorf("unknown format: %v", err)
	}
}

// TestDispatch checks that each tool's arguments map one to one onto the
// Env's operation (the API call), with the documented defaults.
func TestDispatch(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		surface Surface
		name    string
		args    string
		check   func(t *testing.T, f *fakeEnv)
	}{
		{FunctionCalling, "execute_code", `{"code":"print(1)"}`, func(t *testing.T, f *fakeEnv) {
			want := ExecRequest{Argv: []string{"python3", "-c", "print(1)"}, Timeout: DefaultTimeout, MaxOutput: DefaultMaxOutput}
			if !reflect.DeepEqual(f.exec, want) || f.use != UseFresh {
				t.Errorf("exec %+v use %v", f.exec, f.use)
			}
		}},
		{MCP, "run_code", `{"code":"echo hi","language":"bash","timeout":5,"sandbox_id":"sbX"}`, func(t *testing.T, f *fakeEnv) {
			want := ExecRequest{Argv: []string{"/bin/bash", "-c", "echo hi"}, Timeout: 5 * time.Second, MaxOutput: DefaultMaxOutput}
			if !reflect.DeepEqual(f.exec, want) || f.named != "sbX" {
				t.Errorf("exec %+v named %q", f.exec, f.named)
			}
		}},
		{FunctionCalling, "run_command", `{"command":"ls -l","cwd":"/tmp","timeout":30.0}`, func(t *testing.T, f *fakeEnv) {
			want := ExecRequest{Argv: []string{"/bin/bash", "-l", "-c", "ls -l"}, Cwd: "/tmp", Timeout: 30 * time.Second, MaxOutput: DefaultMaxOutput}
			if !reflect.DeepEqual(f.exec, want) {
				t.Errorf("exec %+v", f.exec)
			}
		}},
		{FunctionCalling, "read_file", `{"path":"a.txt"}`, func(t *testing.T, f *fakeEnv) {
			if f.path != "a.txt" || f.max != MaxReadBytes || f.use != UseDefault {
				t.Errorf("read %q max %d use %v", f.path, f.max, f.use)
			}
		}},
		{FunctionCalling, "write_file", `{"path":"/tmp/x","content":"héllo"}`, func(t *testing.T, f *fakeEnv) {
			if f.path != "/tmp/x" || f.data != "héllo" {
				t.Errorf("write %q %q", f.path, f.data)
			}
		}},
		{FunctionCalling, "list_files", `{}`, func(t *testing.T, f *fakeEnv) {
			if f.path != "/home/user" || f.max != MaxListEntries {
				t.Errorf("list %q max %d", f.path, f.max)
			}
		}},
		{MCP, "create_sandbox", `{"template":"code-interpreter","timeout":120}`, func(t *testing.T, f *fakeEnv) {
			if f.sbReq != (SandboxRequest{Template: "code-interpreter", Timeout: 2 * time.Minute}) || slices.Contains(f.calls, "sandbox") {
				t.Errorf("create %+v calls %v", f.sbReq, f.calls)
			}
		}},
		{MCP, "kill_sandbox", `{}`, func(t *testing.T, f *fakeEnv) {
			if f.use != UseExisting || !slices.Contains(f.calls, "kill sb1") {
				t.Errorf("kill: use %v calls %v", f.use, f.calls)
			}
		}},
		{MCP, "snapshot_sandbox", `{"name":"before"}`, func(t *testing.T, f *fakeEnv) {
			if !slices.Contains(f.calls, "snapshot sb1 before") {
				t.Errorf("snapshot calls %v", f.calls)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeEnv{kept: true}
			res := Call(ctx, f, tc.surface, tc.name, json.RawMessage(tc.args), Options{})
			if res.IsError {
				t.Fatalf("error: %s", res.Content)
			}
			tc.check(t, f)
			if slices.Contains(f.calls, "sandbox") && f.calls[len(f.calls)-1] != "release" {
				t.Errorf("sandbox not released after the call: %v", f.calls)
			}
			var back map[string]any
			if json.Unmarshal([]byte(res.Content), &back) != nil {
				t.Errorf("content is not the result's JSON: %q", res.Content)
			}
		})
	}
}

// TestCallSandboxShown checks that a result names a sandbox that outlives
// the call and not one made for the call alone (killed after it).
func TestCallSandboxShown(t *testing.T) {
	for _, kept := range []bool{true, false} {
		f := &fakeEnv{kept: kept}
		res := Call(context.Background(), f, FunctionCalling, "execute_code", json.RawMessage(`{"code":"1"}`), Options{})
		if got := res.Result.(*ExecResult).SandboxID; (got == "sb1") != kept {
			t.Errorf("kept %v: sandbox_id %q", kept, got)
		}
	}
}

// TestBadArguments defends against calls a model gets wrong: each is an
// invalid_argument result naming the problem, and nothing runs.
func TestBadArguments(t *testing.T) {
	tests := []struct {
		surface    Surface
		name, args string
		want       string
	}{
		{FunctionCalling, "execute_code", `{"code":"1","bogus":true}`, `unknown argument "bogus"`},
		{FunctionCalling, "execute_code", `{}`, `argument "code" is required`},
		{FunctionCalling, "execute_code", `{"code":""}`, `argument "code" must not be empty`},
		{FunctionCalling, "execute_code", `{"code":1}`, `argument "code" must be a string`},
		{FunctionCalling, "execute_code", `{"code":"1","language":"ruby"}`, `must be one of python, bash`},
		{FunctionCalling, "execute_code", `{"code":"1","timeout":0}`, `between 1 and 600`},
		{FunctionCalling, "execute_code", `{"code":"1","timeout":1.5}`, `must be an integer`},
		{FunctionCalling, "execute_code", `{"code":"` + strings.Repeat("x", MaxCode+1) + `"}`, `at most 102400 bytes`},
		{FunctionCalling, "execute_code", `[1]`, `must be a JSON object`},
		{FunctionCalling, "execute_code", `{"code":"1"} {}`, `one JSON object`},
		{FunctionCalling, "run_command", `{"command":"ls","sandbox_id":"x"}`, `unknown argument "sandbox_id"`},
		{FunctionCalling, "create_sandbox", `{}`, `no tool "create_sandbox"`},
		{MCP, "execute_code", `{"code":"1"}`, `no tool "execute_code"; the tools are run_code, run_command`},
		{MCP, "create_sandbox", `{"template":"a","snapshot":"b"}`, `not both`},
	}
	for _, tc := range tests {
		f := &fakeEnv{}
		res := Call(context.Background(), f, tc.surface, tc.name, json.RawMessage(tc.args), Options{})
		wantCode := CodeInvalidArgument
		if strings.HasPrefix(tc.want, "no tool") {
			wantCode = CodeNotFound
		}
		if !res.IsError || res.Code != wantCode || !strings.Contains(res.Content, tc.want) || !strings.HasPrefix(res.Content, wantCode+": ") {
			t.Errorf("%s %.60s: %+v, want %s %q", tc.name, tc.args, res, wantCode, tc.want)
		}
		if len(f.calls) > 0 && tc.name != "create_sandbox" {
			t.Errorf("%s %.60s: the env was called: %v", tc.name, tc.args, f.calls)
		}
	}
	if res := Call(context.Background(), &fakeEnv{}, FunctionCalling, "run_command", json.RawMessage(`{"command":"ls"}`), Options{MaxOutput: MaxMaxOutput + 1}); res.Code != CodeInvalidArgument {
		t.Errorf("max_output over the bound: %+v", res)
	}
}

// TestRefusals checks that a refusal of the task's brakes reaches the
// model as a result it can read: its code and the breaker's message as
// it is (not prefixed twice), and that an unexpected error is an
// internal result that says nothing of its cause (no host detail leaks).
func TestRefusals(t *testing.T) {
	msg := "budget_exhausted: the task's max_calls budget is spent (30 of 30 tool calls made). Stop making tool calls: summarise what you have done and found so far, and finish."
	for _, tc := range []struct {
		err         error
		code, text  string
		notContains string
	}{
		{&Error{Code: "budget_exhausted", Msg: msg}, "budget_exhausted", msg, ""},
		{&Error{Code: "loop_detected", Msg: "loop_detected: the same failing command 8 times. stop"}, "loop_detected", "loop_detected: the same failing command 8 times. stop", ""},
		{&Error{Code: "not_found", Msg: "sandbox not found (it ended)"}, "not_found", "not_found: sandbox not found (it ended)", ""},
		{errors.New("open /var/lib/corral/secret: permission denied"), CodeInternal, "internal: internal error; see the server log", "/var/lib"},
	} {
		f := &fakeEnv{fail: tc.err, kept: true}
		res := Call(context.Background(), f, MCP, "run_code", json.RawMessage(`{"code":"1"}`), Options{})
		if !res.IsError || res.Code != tc.code || res.Content != tc.text || res.Result != nil {
			t.Errorf("%v: %+v", tc.err, res)
		}
		if tc.notContains != "" && strings.Contains(res.Content, tc.notContains) {
			t.Errorf("%v leaks into %q", tc.err, res.Content)
		}
	}
}
