package archtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
)

const module = "github.com/corralhq/corral"

// pkg is the part of `go list -json` these tests read.
type pkg struct {
	ImportPath string
	Dir        string
	Name       string
	Imports    []string // direct, of the package's non-test files
	Deps       []string // transitive, of the package's non-test files
}

var (
	listOnce sync.Once
	listed   map[string]*pkg // by path relative to the module ("internal/api")
	listErr  error
)

// packages lists every package of the module with `go list`, keyed by its
// path inside the module.
func packages(t *testing.T) map[string]*pkg {
	t.Helper()
	listOnce.Do(func() {
		cmd := exec.Command("go", "list", "-json", module+"/...")
		cmd.Dir = moduleRoot(t)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			listErr = err
			if stderr.Len() > 0 {
				listErr = &listError{err, stderr.String()}
			}
			return
		}
		listed = map[string]*pkg{}
		dec := json.NewDecoder(bytes.NewReader(out))
		for dec.More() {
			var p pkg
			if err := dec.Decode(&p); err != nil {
				listErr = err
				return
			}
			listed[rel(p.ImportPath)] = &p
		}
	})
	if listErr != nil {
		t.Fatalf("go list: %v", listErr)
	}
	return listed
}

type listError struct {
	err    error
	stderr string
}

func (e *listError) Error() string { return e.err.Error() + ": " + e.stderr }

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("module root: %v", err)
	}
	return dir
}

// rel returns an import path relative to the module ("internal/api"), or
// the path itself when it is outside the module.
func rel(path string) string {
	if path == module {
		return "."
	}
	if r, ok := strings.CutPrefix(path, module+"/"); ok {
		return r
	}
	return path
}

func inModule(path string) bool { return path == module || strings.HasPrefix(path, module+"/") }

// under reports whether path is dir or a package below it.
func under(path, dir string) bool { return path == dir || strings.HasPrefix(path, dir+"/") }

// isTestSupport reports whether a package only helps tests (by Go's
// convention its name ends in "test", as net/http/httptest's does):
// runtime/runtimetest, runtime/drivertest, test/....
func isTestSupport(path string) bool {
	return strings.HasSuffix(filepath.Base(path), "test") || under(path, "test")
}

// TestDependencyRules enforces the dependency rules of
// docs/ARCHITECTURE.md ("Dependency rules") on the import graph of the
// non-test code. Defends against the layers melting into each other
// unnoticed: a driver that grows an HTTP server or a database handle (so
// that the Kubernetes driver would need them too), a package reaching
// into the API's handlers, or the in-sandbox agent linking the control
// plane's code (and its SQLite) into every sandbox.
func TestDependencyRules(t *testing.T) {
	pkgs := packages(t)
	leaf := func(path string) bool {
		p := pkgs[path]
		if p == nil {
			return false
		}
		for _, imp := range p.Imports {
			if inModule(imp) {
				return false
			}
		}
		return true
	}
	for _, path := range slices.Sorted(maps.Keys(pkgs)) {
		p := pkgs[path]
		// deps holds full import paths: std has internal/... paths too.
		deps := map[string]bool{}
		for _, d := range p.Deps {
			deps[d] = true
		}
		dependsOn := func(x string) bool {
			if x == "net/http" {
				return deps[x]
			}
			return deps[module+"/"+x]
		}
		// 1. Drivers know nothing of HTTP or of the store.
		if under(path, "internal/runtime") && !isTestSupport(path) {
			banned := []string{"net/http", "internal/store", "internal/sandbox", "internal/api", "internal/server"}
			if under(path, "internal/runtime/kube") {
				// The Kubernetes driver's platform is an HTTP API
				// (client-go) and its agents are reached over TCP; it
				// still serves nothing and keeps no records.
				banned = banned[1:]
			}
			for _, banned := range banned {
				if dependsOn(banned) {
					t.Errorf("%s (a driver or the driver contract) depends on %s; drivers import no store and no net/http (ARCHITECTURE.md)", path, banned)
				}
			}
		}
		// 2. Nothing but the server (and the CLI, for the API's defaults)
		// imports the API.
		if slices.Contains(p.Imports, module+"/internal/api") && path != "internal/server" && path != "cmd/corral" && !isTestSupport(path) {
			t.Errorf("%s imports internal/api; only internal/server and cmd/corral may (ARCHITECTURE.md)", path)
		}
		// 3. Only the CLI and the test harness wire the server.
		if slices.Contains(p.Imports, module+"/internal/server") && path != "cmd/corral" && !isTestSupport(path) {
			t.Errorf("%s imports internal/server; only cmd/corral and test support may (ARCHITECTURE.md)", path)
		}
		// 4. Dependencies point inward: the manager knows no HTTP front.
		if under(path, "internal/sandbox") {
			for _, banned := range []string{"internal/api", "internal/server"} {
				if dependsOn(banned) {
					t.Errorf("%s depends on %s; dependencies point inward, api → sandbox → runtime (ARCHITECTURE.md)", path, banned)
				}
			}
		}
		// 5. The agent and the SDK share only the wire with the control
		// plane: the proto packages and leaf packages (constants, a
		// bounded buffer) that import no other package of corral.
		if path == "internal/agent" || path == "sdk/go" {
			for _, full := range slices.Sorted(maps.Keys(deps)) {
				d := rel(full)
				if !inModule(full) || under(d, "proto") || leaf(d) {
					continue
				}
				t.Errorf("%s depends on %s; the agent and the SDK may depend only on proto/... and leaf packages (ARCHITECTURE.md)", path, d)
			}
		}
	}
}

// TestPackageDocs fails on a package without a package doc comment:
// a reader who lands in a directory learns in one line what it is for.
func TestPackageDocs(t *testing.T) {
	root := moduleRoot(t)
	pkgs := packages(t)
	for _, path := range slices.Sorted(maps.Keys(pkgs)) {
		p := pkgs[path]
		if !hasPackageDoc(t, p.Dir) {
			t.Errorf("package %s (%s) has no package doc comment (// Package %s ...); add one, in doc.go if the files are generated",
				path, strings.TrimPrefix(p.Dir, root+"/"), p.Name)
		}
	}
	// Directories of test files only (test/integration) are not in go
	// list's output of non-test packages; check them too.
	filepath.WalkDir(root, func(dir string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if n := d.Name(); n == "node_modules" || n == "testdata" || strings.HasPrefix(n, ".") && dir != root {
			return filepath.SkipDir
		}
		if tests, _ := filepath.Glob(filepath.Join(dir, "*_test.go")); len(tests) > 0 && !hasPackageDoc(t, dir) {
			t.Errorf("test package in %s has no package doc comment", strings.TrimPrefix(dir, root+"/"))
		}
		return nil
	})
}

// hasPackageDoc reports whether a .go file of dir (test files included,
// for test-only packages) has a doc comment on its package clause.
func hasPackageDoc(t *testing.T, dir string) bool {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	fset := token.NewFileSet()
	for _, f := range files {
		af, err := parser.ParseFile(fset, f, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if af.Doc != nil && strings.TrimSpace(af.Doc.Text()) != "" {
			return true
		}
	}
	return false
}

// tableRow matches a row of ARCHITECTURE.md's package table.
var tableRow = regexp.MustCompile("^\\| `([^`]+)` \\|")

// TestArchitecturePackageTable checks that docs/ARCHITECTURE.md's package
// table has exactly one row for every package of the module and no row
// for a package that does not exist. A row "`dir/...`" covers dir and
// every package below it. Defends against the map of the code going stale:
// a new package nobody can find, or a row for code that moved.
func TestArchitecturePackageTable(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(moduleRoot(t), "docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	inTable := false
	sc := bufio.NewScanner(bytes.NewReader(doc))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			inTable = line == "## Packages"
		case inTable:
			if m := tableRow.FindStringSubmatch(line); m != nil {
				rows = append(rows, m[1])
			}
		}
	}
	if len(rows) == 0 {
		t.Fatal(`docs/ARCHITECTURE.md has no package table under "## Packages"`)
	}
	covers := func(row, path string) bool {
		if dir, ok := strings.CutSuffix(row, "/..."); ok {
			return under(path, dir)
		}
		return row == path
	}
	var all []string
	for path := range packages(t) {
		all = append(all, path)
	}
	// Test-only packages (test/integration) are packages too.
	all = append(all, testOnlyPackages(t)...)
	sort.Strings(all)
	used := map[string]bool{}
	for _, path := range all {
		var by []string
		for _, r := range rows {
			if covers(r, path) {
				by = append(by, r)
			}
		}
		switch len(by) {
		case 0:
			t.Errorf("package %s has no row in docs/ARCHITECTURE.md's package table; add \"| `%s` | <its job> |\"", path, path)
		case 1:
			used[by[0]] = true
		default:
			t.Errorf("package %s has %d rows in docs/ARCHITECTURE.md's package table (%s); keep one", path, len(by), strings.Join(by, ", "))
			for _, r := range by {
				used[r] = true
			}
		}
	}
	for _, r := range rows {
		if !used[r] {
			t.Errorf("docs/ARCHITECTURE.md's package table has a row for %s, which is no package of the module; remove it", r)
		}
	}
}

// testOnlyPackages returns the directories holding only test files.
func testOnlyPackages(t *testing.T) []string {
	root := moduleRoot(t)
	pkgs := packages(t)
	var out []string
	filepath.WalkDir(root, func(dir string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if n := d.Name(); n == "node_modules" || n == "testdata" || strings.HasPrefix(n, ".") && dir != root {
			return filepath.SkipDir
		}
		r, _ := filepath.Rel(root, dir)
		if tests, _ := filepath.Glob(filepath.Join(dir, "*_test.go")); len(tests) > 0 && pkgs[r] == nil {
			out = append(out, r)
		}
		return nil
	})
	return out
}

// mdRef matches a file name ending in .md in a comment or a link.
var (
	mdRef   = regexp.MustCompile(`[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.md\b`)
	mdLink  = regexp.MustCompile(`\]\(([^)#\s]+\.md)`)
	protoCm = regexp.MustCompile(`//.*`)
)

// TestDocReferences checks that every .md file the code's comments (Go and
// .proto) and the docs' links cite is a file of the repository: a citation
// of a note that lives outside it (a design draft, a protocol dump) leaves
// the reader with a dead end. Bare names resolve against the citing file's
// directory, the module root and docs/.
func TestDocReferences(t *testing.T) {
	root := moduleRoot(t)
	exists := func(from, ref string) bool {
		for _, dir := range []string{filepath.Dir(from), root, filepath.Join(root, "docs")} {
			if _, err := os.Stat(filepath.Join(dir, ref)); err == nil {
				return true
			}
		}
		return false
	}
	check := func(file string, refs []string) {
		for _, ref := range refs {
			if !exists(file, ref) {
				r, _ := filepath.Rel(root, file)
				t.Errorf("%s cites %s, which is no file of the repository; cite a document under docs/ (write what the code relies on there)", r, ref)
			}
		}
	}
	filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n == "node_modules" || n == "testdata" || strings.HasPrefix(n, ".") && path != root {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case strings.HasSuffix(path, ".go"):
			af, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			for _, cg := range af.Comments {
				check(path, mdRef.FindAllString(cg.Text(), -1))
			}
		case strings.HasSuffix(path, ".proto"):
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range protoCm.FindAllString(string(b), -1) {
				check(path, mdRef.FindAllString(c, -1))
			}
		case strings.HasSuffix(path, ".md"):
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range mdLink.FindAllStringSubmatch(string(b), -1) {
				if !strings.Contains(m[1], "://") {
					check(path, []string{m[1]})
				}
			}
		}
		return nil
	})
}
