package main

import (
	"testing"
	"time"
)

func TestParseSizeMiB(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{"256", 256, false},
		{"256m", 256, false},
		{"256M", 256, false},
		{"100MB", 100, false},
		{"512MiB", 512, false},
		{"512mib", 512, false},
		{"1g", 1024, false},
		{"1G", 1024, false},
		{"2GiB", 2048, false},
		{"1.5g", 1536, false},
		{"1t", 1 << 20, false},
		{"2048k", 2, false},
		{"1536KiB", 2, false}, // rounded up
		{" 64m ", 64, false},
		{"0", 0, true},
		{"0m", 0, true},
		{"", 0, true},
		{"m", 0, true},
		{"-5m", 0, true},
		{"10x", 0, true},
		{"10b", 0, true},
		{"1.2.3m", 0, true},
		{"99999999999g", 0, true},
	} {
		got, err := parseSizeMiB(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("parseSizeMiB(%q) = %d, want error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("parseSizeMiB(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestParseDurationArg(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		bad  bool
	}{
		{"30", 30 * time.Second, false},
		{"1.5", 1500 * time.Millisecond, false},
		{"0", 0, false},
		{"90s", 90 * time.Second, false},
		{"5m", 5 * time.Minute, false},
		{"1h30m", 90 * time.Minute, false},
		{"250ms", 250 * time.Millisecond, false},
		{"", 0, true},
		{"-1", 0, true},
		{"-5s", 0, true},
		{"5 minutes", 0, true},
		{"abc", 0, true},
		{"NaN", 0, true},
	} {
		got, err := parseDurationArg(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("parseDurationArg(%q) = %v, want error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("parseDurationArg(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseKV(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want map[string]string
		bad  bool
	}{
		{nil, nil, false},
		{[]string{"A=1"}, map[string]string{"A": "1"}, false},
		{[]string{"A=1", "B="}, map[string]string{"A": "1", "B": ""}, false},
		{[]string{"URL=a=b,c"}, map[string]string{"URL": "a=b,c"}, false},
		{[]string{"A=1", "A=2"}, map[string]string{"A": "2"}, false},
		{[]string{"A"}, nil, true},
		{[]string{"=x"}, nil, true},
	} {
		got, err := parseKV(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("parseKV(%q) = %v, want error", tc.in, got)
			}
			continue
		}
		if err != nil || len(got) != len(tc.want) {
			t.Errorf("parseKV(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			continue
		}
		for k, v := range tc.want {
			if got[k] != v {
				t.Errorf("parseKV(%q)[%q] = %q, want %q", tc.in, k, got[k], v)
			}
		}
	}
}

func TestParseCopyTarget(t *testing.T) {
	for _, tc := range []struct {
		in       string
		id, path string
		bad      bool
	}{
		{"sb123:/tmp/a.txt", "sb123", "/tmp/a.txt", false},
		{"sb123:rel/a", "sb123", "rel/a", false},
		{"sb123:a:b", "sb123", "a:b", false},
		{"./a:b", "", "./a:b", false},
		{"/abs/a:b", "", "/abs/a:b", false},
		{"dir/x:y", "", "dir/x:y", false},
		{"local.txt", "", "local.txt", false},
		{"-", "", "-", false},
		{":x", "", ":x", false},
		{"sb123:", "", "", true},
		{"", "", "", true},
	} {
		got, err := parseCopyTarget(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("parseCopyTarget(%q) = %+v, want error", tc.in, got)
			}
			continue
		}
		if err != nil || got.ID != tc.id || got.Path != tc.path {
			t.Errorf("parseCopyTarget(%q) = %+v, %v; want %q %q", tc.in, got, err, tc.id, tc.path)
		}
	}
}

func TestArgvFrom(t *testing.T) {
	if got := argvFrom([]string{"--", "ls", "--", "-l"}); len(got) != 3 || got[0] != "ls" || got[1] != "--" {
		t.Fatalf("argvFrom = %q", got)
	}
	if got := argvFrom([]string{"ls", "-l"}); len(got) != 2 {
		t.Fatalf("argvFrom = %q", got)
	}
}

// TestSandboxFlagsPorts: --private-ports asks for private ports,
// --public-ports for public ones, neither leaves the server's default.
func TestSandboxFlagsPorts(t *testing.T) {
	for _, tc := range []struct {
		f    sandboxFlags
		want string
	}{{sandboxFlags{}, "default"}, {sandboxFlags{privatePorts: true}, "private"}, {sandboxFlags{publicPorts: true}, "public"}} {
		o, err := tc.f.options()
		if err != nil {
			t.Fatal(err)
		}
		got := "default"
		if o.PublicTraffic != nil {
			got = map[bool]string{true: "public", false: "private"}[*o.PublicTraffic]
		}
		if got != tc.want {
			t.Errorf("%+v: ports %s, want %s", tc.f, got, tc.want)
		}
	}
}

func TestSandboxFlagsOptions(t *testing.T) {
	f := sandboxFlags{memory: "1g", disk: "200", ttl: "10m", env: []string{"A=1"}, metadata: []string{"k=v"}, tier: "medium", cpu: 1.5}
	o, err := f.options()
	if err != nil {
		t.Fatal(err)
	}
	if o.Resources.MemoryMB != 1024 || o.Resources.DiskMB != 200 || o.Resources.CPU != 1.5 ||
		o.Timeout != 10*time.Minute || o.Env["A"] != "1" || o.Metadata["k"] != "v" || o.Tier != "medium" {
		t.Fatalf("options %+v", o)
	}
	for _, bad := range []sandboxFlags{
		{runtime: "docker"}, {tier: "huge"}, {network: "host"}, {memory: "lots"},
		{ttl: "0"}, {env: []string{"nope"}}, {cpu: -1}, {privatePorts: true, publicPorts: true},
	} {
		if _, err := bad.options(); err == nil {
			t.Errorf("options(%+v): want error", bad)
		}
	}
}
