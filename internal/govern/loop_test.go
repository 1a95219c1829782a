package govern

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// ok, fail and running build calls.
func ok(cmd string) Call             { return Call{Command: cmd, ExitCode: 0} }
func fail(cmd string, code int) Call { return Call{Command: cmd, ExitCode: code, Failed: true} }
func running(cmd string) Call        { return Call{Command: cmd, ExitCode: -1} }

// observeAll feeds calls to a fresh detector and returns the verdicts.
func observeAll(cfg LoopConfig, calls []Call) []LoopVerdict {
	d := NewLoopDetector(cfg)
	out := make([]LoopVerdict, len(calls))
	for i, c := range calls {
		out[i] = d.Observe(c)
	}
	return out
}

// firstIndex returns the 1-based number of the first call whose verdict
// satisfies f, or 0.
func firstIndex(vs []LoopVerdict, f func(LoopVerdict) bool) int {
	for i, v := range vs {
		if f(v) {
			return i + 1
		}
	}
	return 0
}

func suspected(v LoopVerdict) bool { return v.Suspected }
func detected(v LoopVerdict) bool  { return v.Detected }

// searchLoop is seed scenario "a search repeated 60 times with tiny
// variations": the agent keeps querying a search API, rewording the query
// a little or turning the page, and never acts on the results. If
// failFrom > 0, calls from that one on fail with exit 22 (curl -f on an
// HTTP 429).
func searchLoop(n, failFrom int) []Call {
	queries := []string{
		"python+asyncio+timeout",
		"python+asyncio+timeout+error",
		"python+asyncio+timeouterror",
		"python+asyncio+wait_for+timeout",
		"python+asyncio+timeout+example",
		"python3+asyncio+timeout",
		"asyncio+timeout+python",
		"python+asyncio+timeout+fix",
		"python+asyncio+timeout+not+working",
		"python+asyncio+timeout+exception",
		"python+asyncio+timeout+context+manager",
	}
	calls := make([]Call, n)
	for i := range calls {
		q := queries[i%len(queries)]
		page := i/len(queries)%3 + 1
		flags := "-s"
		if i%4 == 3 {
			flags = "-sf"
		}
		cmd := fmt.Sprintf("curl %s 'https://api.search.example/q?query=%s&page=%d'", flags, q, page)
		if i%7 == 5 {
			cmd = fmt.Sprintf(`curl %s "https://api.search.example/q?query=%s&page=%d&limit=10"`, flags, q, page)
		}
		calls[i] = ok(cmd)
		if failFrom > 0 && i+1 >= failFrom {
			calls[i] = fail(cmd, 22)
		}
	}
	return calls
}

// legitSession is a varied, productive session of 60 calls: exploring a
// repository, reading files, trying snippets, installing different
// packages, fixing a bug and committing.
func legitSession() []Call {
	return []Call{
		ok("cd /workspace && ls -la"),
		ok("cat README.md"),
		ok("ls src tests"),
		ok("cat src/app.py"),
		ok("cat src/utils.py"),
		ok("cat requirements.txt"),
		ok("python3 --version"),
		ok("pip install -r requirements.txt"),
		fail("python3 -m pytest -q", 1),
		ok("cat tests/test_app.py"),
		ok("grep -rn 'def parse_date' src"),
		ok("python3 -c 'import datetime; print(datetime.date.today())'"),
		ok("sed -n '40,80p' src/utils.py"),
		ok(`python3 -c "from src.utils import parse_date; print(parse_date('2024-01-05'))"`),
		ok("sed -i 's/%d-%m-%Y/%Y-%m-%d/' src/utils.py"),
		fail("python3 -m pytest -q tests/test_utils.py", 1),
		ok("git diff"),
		ok("sed -n '1,30p' tests/test_utils.py"),
		ok(`sed -i '17s/assert parse_date("05-01-2024")/assert parse_date("2024-01-05")/' tests/test_utils.py`),
		ok("python3 -m pytest -q tests/test_utils.py"),
		fail("python3 -m pytest -q", 1),
		ok("pip install requests"),
		ok("pip install python-dateutil"),
		ok("python3 -m pytest -q"),
		ok("git status"),
		ok("git add src/utils.py tests/test_utils.py"),
		ok(`git commit -m "Fix parse_date format"`),
		ok("wc -l src/*.py"),
		ok("cat src/cli.py"),
		ok("python3 src/cli.py --help"),
		fail("python3 src/cli.py convert data/input.csv", 2),
		ok("ls data"),
		ok("head -n 5 data/sample.csv"),
		ok("python3 src/cli.py convert data/sample.csv --out /tmp/out.json"),
		ok("python3 -c 'import json; print(len(json.load(open(\"/tmp/out.json\"))))'"),
		ok("pip install pandas"),
		ok(`python3 -c "import pandas as pd; print(pd.read_csv('data/sample.csv').describe())"`),
		ok("mkdir -p docs"),
		ok("cat > docs/usage.md <<'EOF'\n# Usage\n\nRun `cli.py convert FILE`.\nEOF"),
		ok("ls docs"),
		ok("find . -name '*.pyc' -delete"),
		ok("du -sh ."),
		ok("env | grep -i python"),
		ok("pip list --outdated"),
		ok("pip install black"),
		ok("black --check src"),
		ok("black src"),
		ok("python3 -m pytest -q"),
		ok("git diff --stat"),
		ok("git add -A"),
		ok(`git commit -m "Format with black, add usage doc"`),
		ok("git log --oneline -n 5"),
		ok("cat setup.cfg"),
		ok("pip install mypy"),
		fail("mypy src", 1),
		ok("sed -i 's/def main(args):/def main(args: list[str]) -> int:/' src/cli.py"),
		ok("mypy src"),
		ok("python3 -m pytest -q"),
		ok("git commit -am 'Add type hints to cli'"),
		ok("git log --oneline -n 3"),
	}
}

// TestLoopScenarios runs the seed scenarios through a detector with the
// default configuration.
func TestLoopScenarios(t *testing.T) {
	pipRetry := make([]Call, 10)
	for i := range pipRetry {
		pipRetry[i] = fail("pip install requests==2.99", 1)
	}
	mainRetry := make([]Call, 10)
	for i := range mainRetry {
		mainRetry[i] = fail("python3 main.py", 1)
	}
	// The agent alternates: run the program, it fails on the import, try to
	// install a version that does not exist, run the program again...
	var alternating []Call
	for i := range 6 {
		alternating = append(alternating,
			fail("python3 main.py", 1),
			fail(fmt.Sprintf("pip install requests==2.%d", 99-i%2), 1))
	}
	// Re-running the test suite after every edit, edits of different lines.
	var editTest, editTestFailing []Call
	for i := range 30 {
		edit := fmt.Sprintf("sed -i '%ds/%s/%s/' src/%s.py", 10+7*i, words[i%len(words)], words[(i+3)%len(words)], files[i%len(files)])
		editTest = append(editTest, ok(edit), ok("pytest -q"))
		editTestFailing = append(editTestFailing, ok(edit), fail("pytest -q", 1))
	}
	// Two commands in turn, both succeeding: at most half the window.
	var cycle []Call
	for range 10 {
		cycle = append(cycle, ok("curl -s https://api.search.example/q?query=asyncio"), ok("python3 parse.py /tmp/results.json"))
	}
	pytestOnly := make([]Call, 12)
	for i := range pytestOnly {
		pytestOnly[i] = ok("pytest -q")
	}

	for _, tc := range []struct {
		name  string
		calls []Call
		// 1-based number of the first call that warns / trips; 0 = never.
		warn, trip int
	}{
		{name: "search repeated 60 times", calls: searchLoop(60, 0), warn: 4, trip: 9},
		{name: "search failing with exit 22", calls: searchLoop(60, 3), warn: 4, trip: 6},
		{name: "pip retry", calls: pipRetry, warn: 4, trip: 5},
		{name: "python3 main.py retry", calls: mainRetry, warn: 4, trip: 5},
		{name: "run and reinstall alternating", calls: alternating, warn: 7, trip: 9},
		{name: "legitimate varied session", calls: legitSession()},
		{name: "edit then test, tests pass", calls: editTest},
		{name: "edit then test, tests fail", calls: editTestFailing},
		{name: "same test 12 times in a row", calls: pytestOnly, warn: 4, trip: 9},
		{name: "search and parse in turn", calls: cycle, warn: 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vs := observeAll(LoopConfig{}, tc.calls)
			w, tr := firstIndex(vs, suspected), firstIndex(vs, detected)
			if w != tc.warn || tr != tc.trip {
				t.Errorf("first loop_suspected at call %d, loop_detected at %d; want %d, %d", w, tr, tc.warn, tc.trip)
			}
			if t.Failed() || testing.Verbose() {
				for i, v := range vs {
					t.Logf("%2d %-60.60q repeats=%d score=%g %s", i+1, tc.calls[i].Command, v.Repeats, v.Score, v.Code())
				}
			}
		})
	}
}

var (
	words = []string{"timeout", "retries", "delay", "url", "session", "verbose", "limit"}
	files = []string{"client", "config", "cli", "parser"}
)

// TestLoopLegitSessionWarnings: a legitimate session is never detected
// (checked above) and warns rarely, if ever.
func TestLoopLegitSessionWarnings(t *testing.T) {
	calls := legitSession()
	if len(calls) != 60 {
		t.Fatalf("legit session has %d calls, want 60", len(calls))
	}
	warns := 0
	for i, v := range observeAll(LoopConfig{}, calls) {
		if v.Detected {
			t.Errorf("call %d %q: loop_detected (%s)", i+1, calls[i].Command, v.Reason)
		}
		if v.Suspected {
			warns++
			t.Logf("call %d %q: loop_suspected (%s)", i+1, calls[i].Command, v.Reason)
		}
	}
	if warns > 0 {
		t.Errorf("%d warnings in a legitimate session, want none", warns)
	}
}

// TestLoopSearchStaysDetected: once the search loop is detected, the
// calls that follow are detected too, bar the odd wording that resembles
// no other call of the window (the breaker has opened at the first
// detection anyway), and the reason names the command.
func TestLoopSearchStaysDetected(t *testing.T) {
	calls := searchLoop(60, 0)
	vs := observeAll(LoopConfig{}, calls)
	first := firstIndex(vs, detected)
	var missed []int
	for i := first; i < len(vs); i++ {
		if !vs[i].Detected {
			missed = append(missed, i+1)
		}
	}
	if len(missed) > 2 {
		t.Errorf("calls %v not detected after detection at %d", missed, first)
	}
	last := vs[len(vs)-1]
	if !strings.Contains(last.Reason, `of the last 10 calls repeat "curl -s`) {
		t.Errorf("reason %q", last.Reason)
	}
}

// TestLoopReason checks the verdict text and fields on a failing retry.
func TestLoopReason(t *testing.T) {
	d := NewLoopDetector(LoopConfig{})
	var v LoopVerdict
	for range 3 {
		v = d.Observe(ok("curl -fsS https://api.search.example/v1/search?q=x"))
	}
	for range 7 {
		v = d.Observe(fail("curl -fsS https://api.search.example/v1/search?q=x", 22))
	}
	want := LoopVerdict{
		Suspected: true, Detected: true, Repeats: 9, Score: 6*2 + 3,
		Reason: `10 of the last 10 calls repeat "curl -fsS https://api.search.example/v1/..." (7 failing with exit 22)`,
	}
	if v != want {
		t.Errorf("verdict\n got %+v\nwant %+v", v, want)
	}
	if v.Code() != "loop_detected" {
		t.Errorf("Code() = %q", v.Code())
	}
	d.Reset()
	v = d.Observe(fail("timeout 5 ./server", -1))
	v = d.Observe(fail("timeout 5 ./server", -1))
	v = d.Observe(fail("timeout 5 ./server", -1))
	v = d.Observe(fail("timeout 5 ./server", -1))
	if want := `4 of the last 4 calls repeat "timeout 5 ./server" (4 failing the same way)`; v.Reason != want || v.Code() != "loop_suspected" {
		t.Errorf("after Reset: %+v, want reason %q", v, want)
	}
	if (LoopVerdict{}).Code() != "" {
		t.Error("zero verdict has a code")
	}
}

// TestLoopScoring checks the weights on small windows.
func TestLoopScoring(t *testing.T) {
	for _, tc := range []struct {
		name    string
		calls   []Call
		repeats int
		score   float64
	}{
		{"single call", []Call{fail("make", 2)}, 0, 0},
		{"same failure counts twice", []Call{fail("make", 2), fail("make", 2)}, 1, 2},
		{"different exit codes count once", []Call{fail("make", 2), fail("make", 1)}, 1, 1},
		{"success after failure counts once", []Call{fail("make", 2), ok("make")}, 1, 1},
		{"failure after success counts once", []Call{ok("make"), fail("make", 2)}, 1, 1},
		{"timeouts alike count twice", []Call{fail("sleep 100", -1), fail("sleep 100", -1)}, 1, 2},
		{"positive exit code is a failure", []Call{{Command: "make", ExitCode: 2}, fail("make", 2)}, 1, 2},
		{"running call takes the last outcome", []Call{fail("make", 2), fail("make", 2), running("make")}, 2, 4},
		{"running after success", []Call{ok("make"), running("make")}, 1, 1},
		{"failed new call is no progress", []Call{fail("make", 2), fail("ls /nope", 2), fail("make", 2)}, 1, 2},
		{"repeated other call is no progress", []Call{fail("make", 2), ok("sleep 5"), fail("make", 2), ok("sleep 5"), fail("make", 2)}, 2, 4},
		{"new successful call is progress", []Call{fail("make", 2), ok("vi main.c"), fail("make", 2)}, 0, 0},
		{"running new call is progress", []Call{fail("make", 2), running("vi main.c"), fail("make", 2)}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vs := observeAll(LoopConfig{}, tc.calls)
			v := vs[len(vs)-1]
			if v.Repeats != tc.repeats || v.Score != tc.score {
				t.Errorf("repeats %d score %g, want %d %g", v.Repeats, v.Score, tc.repeats, tc.score)
			}
		})
	}
}

// TestLoopChain: a call counts as a repeat of the latest through a chain of
// near-identical calls, even when it is not near-identical to the latest
// itself; a call linked to nothing is not counted.
func TestLoopChain(t *testing.T) {
	const (
		a = "curl -s 'https://api.search.example/q?query=asyncio+timeout&page=1'"
		b = "curl -s 'https://api.search.example/q?query=asyncio+timeout+error&page=2'"
		c = "curl -s 'https://api.search.example/q?query=asyncio+timeout+error+handling+python&page=3'"
		x = "curl -s 'https://api.weather.example/v1/forecast?city=berlin'"
	)
	if !(Similarity(a, b) >= 0.85 && Similarity(b, c) >= 0.85 && Similarity(a, c) < 0.85 && Similarity(x, a) < 0.85 && Similarity(x, c) < 0.85) {
		t.Fatalf("precondition: a~b %.2f, b~c %.2f, a~c %.2f", Similarity(a, b), Similarity(b, c), Similarity(a, c))
	}
	vs := observeAll(LoopConfig{}, []Call{fail(a, 22), fail(x, 6), fail(b, 22), fail(c, 22)})
	if v := vs[3]; v.Repeats != 2 || v.Score != 4 {
		t.Errorf("latest c after a, x, b: repeats %d score %g, want 2 and 4", v.Repeats, v.Score)
	}
}

// TestLoopFinish: a detector fed calls as they start, with outcomes
// reported by Finish, judges like one fed finished calls.
func TestLoopFinish(t *testing.T) {
	d := NewLoopDetector(LoopConfig{})
	var v LoopVerdict
	for i := range 5 {
		v = d.Observe(running("pip install requests==2.99"))
		if i < 4 && !d.Finish(fail("pip install requests==2.99", 1)) {
			t.Fatal("Finish found no running call")
		}
	}
	if !v.Detected || v.Score != 8 {
		t.Errorf("fifth start: %+v, want detected with score 8", v)
	}
	if d.Finish(fail("pip install other", 1)) {
		t.Error("Finish matched a command never observed")
	}
	if !d.Finish(fail("pip install requests==2.99", 1)) || d.Finish(fail("pip install requests==2.99", 1)) {
		t.Error("Finish must match each running call once")
	}

	// Without Finish every call stays unknown: no failure weight, and an
	// unknown call is never taken for a failure.
	d = NewLoopDetector(LoopConfig{})
	for range 9 {
		v = d.Observe(running("pytest -q"))
	}
	if !v.Detected || v.Score != 8 {
		t.Errorf("nine running calls: %+v", v)
	}
}

// TestLoopWindow: the window slides, and progress that leaves it stops
// cutting the streak.
func TestLoopWindow(t *testing.T) {
	d := NewLoopDetector(LoopConfig{Window: 4, WarnAt: 3, TripAt: 6})
	steps := []struct {
		call    Call
		repeats int
		score   float64
	}{
		{fail("make", 2), 0, 0},
		{ok("vi main.c"), 0, 0},
		{fail("make", 2), 0, 0}, // vi is progress
		{fail("make", 2), 1, 2},
		{fail("make", 2), 2, 4}, // the first make left the window
		{fail("make", 2), 3, 6}, // vi left the window: no progress in sight
		{ok("vi main.c"), 0, 0}, // unlike every other call
		{fail("make", 2), 0, 0},
		{ok("vi main.c"), 1, 1}, // now vi repeats: no longer progress
		{fail("make", 2), 1, 2}, // window vi make vi make: vi repeats, so not progress
	}
	for i, s := range steps {
		v := d.Observe(s.call)
		if v.Repeats != s.repeats || v.Score != s.score {
			t.Errorf("step %d %q: repeats %d score %g, want %d %g", i+1, s.call.Command, v.Repeats, v.Score, s.repeats, s.score)
		}
	}
}

// TestLoopConfigDefaults checks the defaults and clamps.
func TestLoopConfigDefaults(t *testing.T) {
	for _, tc := range []struct {
		in, want LoopConfig
	}{
		{LoopConfig{}, LoopConfig{Window: 10, Similarity: 0.85, WarnAt: 4, TripAt: 8}},
		{LoopConfig{Window: -1, Similarity: -1, WarnAt: -1, TripAt: -1}, LoopConfig{Window: 10, Similarity: 0.85, WarnAt: 4, TripAt: 8}},
		{LoopConfig{Window: 1000, Similarity: 2, WarnAt: 3, TripAt: 5}, LoopConfig{Window: MaxLoopWindow, Similarity: 1, WarnAt: 3, TripAt: 5}},
		{LoopConfig{Window: 20, Similarity: 0.9, WarnAt: 6, TripAt: 12}, LoopConfig{Window: 20, Similarity: 0.9, WarnAt: 6, TripAt: 12}},
	} {
		if got := NewLoopDetector(tc.in).cfg; got != tc.want {
			t.Errorf("NewLoopDetector(%+v).cfg = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

// TestLoopConcurrent: concurrent use is safe (run with -race) and every
// call is counted.
func TestLoopConcurrent(t *testing.T) {
	d := NewLoopDetector(LoopConfig{Window: 50, TripAt: 1000})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				d.Observe(fail(fmt.Sprintf("worker %d step %d", g, i), 1))
				d.Finish(fail("nothing", 1))
			}
		}()
	}
	wg.Wait()
	v := d.Observe(fail("worker 0 step 0", 1))
	if v.Repeats != 49 || v.Score != 98 {
		t.Errorf("after 400 alike calls: repeats %d score %g, want 49 98", v.Repeats, v.Score)
	}
}

// TestNormalize is a table of normalisations.
func TestNormalize(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"", ""},
		{"  ls   -la\t/tmp \n", "ls -la /tmp"},
		{"LS -LA", "ls -la"},
		{"sleep 5", "sleep <n>"},
		{"pip install requests==2.99", "pip install requests==<n>"},
		{"pip install requests==2.31.0", "pip install requests==<n>"},
		{"head -n 20 file1.txt", "head -n <n> file<n>.txt"},
		{"curl 'https://x/q?page=2&limit=10'", "curl 'https://x/q?page=<n>&limit=<n>'"},
		{"git show 3f2a9c1e7b", "git show <hex>"},
		{"git checkout 3F2A9C1E7B4D5E6F7A8B9C0D1E2F3A4B5C6D7E8F", "git checkout <hex>"},
		{"echo deadbeefcafe", "echo deadbeefcafe"}, // hex without a digit: could be a word
		{"x=0xFF; y=0x1f", "x=<hex>; y=<hex>"},
		{"docker rm 123e4567-e89b-12d3-a456-426614174000", "docker rm <uuid>"},
		{"grep 2024-01-05T10:20:30Z log", "grep <ts> log"},
		{"grep '2024-01-05 10:20:30.123+02:00' log", "grep '<ts>' log"},
		{"date -d 2024-01-05", "date -d <ts>"},
		{"echo 10:20:30", "echo <ts>"},
		{"curl -H 'X-Session: a8Kd93LmQ2xZp7Rt' url", "curl -h 'x-session: <rand>' url"},
		{"export TOKEN=ghp_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5", "export token=<rand>"},
		{"rm -rf /tmp/tmp_k3j4h5g6f7d8s9a0", "rm -rf /tmp/<rand>"},
		{"apt-get install x86_64-linux-gnu-gcc", "apt-get install x<n>_<n>-linux-gnu-gcc"},
		{"pip install python3-asyncio-helpers", "pip install python<n>-asyncio-helpers"},
		{`echo "a   b"`, "echo 'a b'"},
		{`echo "  a b  "`, "echo 'a b'"},
		{`echo '  a b  ' "c"`, "echo 'a b' 'c'"},
		{`echo "it's  x"`, "echo 'it's x'"},
		{`echo a\ \ b`, `echo a\ \ b`},
		{`echo "a \" b"`, `echo 'a \' b'`},
		{"python3 -c 'print(1.5 * 2)'", "python<n> -c 'print(<n> * <n>)'"},
		{"ÉCHO  ÀB", "écho àb"},
	} {
		if got := Normalize(tc.in); got != tc.want {
			t.Errorf("Normalize(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestNormalizeLong: only the first MaxLoopCommandLen bytes count, cut at
// a rune boundary.
func TestNormalizeLong(t *testing.T) {
	long := "echo " + strings.Repeat("é", MaxLoopCommandLen)
	got := Normalize(long)
	if len(got) > MaxLoopCommandLen || !strings.HasSuffix(got, "é") {
		t.Errorf("Normalize(long) has %d bytes, ends %q", len(got), got[len(got)-4:])
	}
	a := strings.Repeat("x", MaxLoopCommandLen) + " tail one"
	b := strings.Repeat("x", MaxLoopCommandLen) + " another tail"
	if s := Similarity(a, b); s != 1 {
		t.Errorf("Similarity of commands alike in the first %d bytes = %g, want 1", MaxLoopCommandLen, s)
	}
}

// TestSimilarity is a table of similarities: near-identical pairs at or
// above the default threshold, distinct pairs below it.
func TestSimilarity(t *testing.T) {
	const base = "curl -s 'https://api.search.example/q?query=python+asyncio+timeout&page=1'"
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{base, base, true},
		{base, strings.Replace(base, "page=1", "page=2", 1), true},
		{base, strings.Replace(base, "timeout", "timeout+error", 1), true},
		{base, strings.Replace(base, "timeout", "timeouterror", 1), true},
		{base, strings.Replace(base, "python", "python3", 1), true},
		{base, strings.Replace(base, "'", `"`, 2), true},
		{base, strings.Replace(base, "-s", "-sf", 1), true},
		{"pip install requests==2.99", "pip install requests==2.31", true},
		{"pip install requests==2.99", "pip  install  requests==2.99", true},
		{"python3 main.py", "python3 main.py", true},
		{"ls", "LS", true},
		{"", "", true},
		{base, "curl -s 'https://api.weather.example/v1/forecast?city=berlin'", false},
		{"pip install requests", "pip install pandas", false},
		{"pip install numpy", "pip install scipy", false},
		{"cat src/app.py", "cat src/utils.py", false},
		{"git status", "git diff", false},
		{"ls", "ls -la", false},
		{"python3 -c 'print(1+1)'", `python3 -c 'import json; print(json.dumps({"a": 1}))'`, false},
		{"sed -i 's/timeout/retries/' src/client.py", "sed -i 's/delay/verbose/' src/cli.py", false},
		{"python3 main.py", "pytest -q", false},
		{"ls", "", false},
	} {
		s := Similarity(tc.a, tc.b)
		if s < 0 || s > 1 {
			t.Errorf("Similarity(%q, %q) = %g, out of [0, 1]", tc.a, tc.b, s)
		}
		if (s >= DefaultLoopSimilarity) != tc.same {
			t.Errorf("Similarity(%q, %q) = %.3f, want same=%v", tc.a, tc.b, s, tc.same)
		}
		if r := Similarity(tc.b, tc.a); r != s {
			t.Errorf("Similarity not symmetric: %g vs %g", s, r)
		}
	}
}
