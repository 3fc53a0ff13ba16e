// Package docs_test checks the documentation against the code, so that the two cannot drift apart:
// key layouts, the identifiers the pages name, and the words of Decision.Source.
package docs_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/hybridrate/hybridrate/central"
	"github.com/hybridrate/hybridrate/concurrency"
	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/outcome"
	"github.com/hybridrate/hybridrate/strict"
)

// page is one Markdown file of the repository's documentation.
type page struct {
	name  string
	lines []string
}

// pages reads README.md and docs/*.md.
func pages(t *testing.T) []page {
	t.Helper()
	files, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{"../README.md"}, files...)
	var out []page
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, page{name: filepath.Base(f), lines: strings.Split(string(b), "\n")})
	}
	return out
}

// historical reports whether a heading starts a section about earlier versions (upgrade notes,
// changelogs), where old key layouts and removed names are quoted on purpose.
func historical(heading string) bool {
	h := strings.ToLower(heading)
	return strings.Contains(h, "upgrading from") || strings.Contains(h, "behaviour changes") ||
		strings.Contains(h, "api changes")
}

// current calls f with every line of the pages outside historical sections.
func current(t *testing.T, f func(p page, n int, line string)) {
	t.Helper()
	for _, p := range pages(t) {
		skip, fenced := false, false
		for i, line := range p.lines {
			if strings.HasPrefix(line, "```") {
				fenced = !fenced
			}
			if !fenced && strings.HasPrefix(line, "#") {
				skip = historical(line)
			}
			if !skip {
				f(p, i+1, line)
			}
		}
	}
}

// layoutRE matches a key layout in the docs: "<prefix>:v4:b:", "hr:v1:{", "<prefix>:v1:c:{".
var layoutRE = regexp.MustCompile(`(?:<prefix>|\bhr):(v\d+):(b:|x:|c:|\{)`)

// TestKeyLayoutsMatchTheCode: every key layout quoted in the docs (outside upgrade notes) carries
// the version the code writes in its namespace.
func TestKeyLayoutsMatchTheCode(t *testing.T) {
	version := func(key string) string { return strings.Split(key, ":")[1] }
	want := map[string]string{
		"b:": central.Version,               // hybrid's buckets
		"x:": version(central.BansKey("p")), // hybrid's own structures
		"c:": concurrency.Layout,            // concurrency's lease sets
		"{":  strict.Version,                // the strict algorithms
	}
	if got := central.BucketKey("p", "k"); got != "p:"+central.Version+":b:{k}" {
		t.Fatalf("BucketKey = %q: update this test and docs/design.md's layout", got)
	}
	found := 0
	current(t, func(p page, n int, line string) {
		for _, m := range layoutRE.FindAllStringSubmatch(line, -1) {
			found++
			if m[1] != want[m[2]] {
				t.Errorf("%s:%d: %q: the code writes %s in this namespace", p.name, n, m[0], want[m[2]])
			}
		}
	})
	if found < 10 {
		t.Fatalf("only %d key layouts found in the docs: is the pattern still right?", found)
	}
}

// exported is what the module's packages export, by package name: top-level identifiers, and
// "Type.Member" for methods and struct fields.
type exported map[string]map[string]bool

// scan parses the module's Go files, testdata left out; of the test files, only those of the
// package itself (export_test.go's test-only options, which the docs call test-only).
func scan(t *testing.T) exported {
	t.Helper()
	ex := exported{}
	add := func(pkg, name string) {
		if ex[pkg] == nil {
			ex[pkg] = map[string]bool{}
		}
		ex[pkg][name] = true
	}
	fset := token.NewFileSet()
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != ".." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkg := f.Name.Name
		if strings.HasSuffix(pkg, "_test") {
			return nil // examples and external tests; export_test.go's test-only names count
		}
		if pkg == "sync" {
			pkg = "ratesync" // the one alias every importer uses (STYLE.md)
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					add(pkg, d.Name.Name)
					continue
				}
				typ := d.Recv.List[0].Type
				if s, ok := typ.(*ast.StarExpr); ok {
					typ = s.X
				}
				if ix, ok := typ.(*ast.IndexExpr); ok {
					typ = ix.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					add(pkg, id.Name+"."+d.Name.Name)
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						add(pkg, s.Name.Name)
						if st, ok := s.Type.(*ast.StructType); ok {
							for _, fld := range st.Fields.List {
								for _, nm := range fld.Names {
									add(pkg, s.Name.Name+"."+nm.Name)
								}
								if len(fld.Names) == 0 { // embedded
									if id, ok := fld.Type.(*ast.Ident); ok {
										add(pkg, s.Name.Name+"."+id.Name)
									}
								}
							}
						}
					case *ast.ValueSpec:
						for _, nm := range s.Names {
							add(pkg, nm.Name)
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ex
}

// The public packages whose names the docs quote as "pkg.Name".
var ourPackages = []string{"hybrid", "strict", "concurrency", "policy", "middleware", "observe", "sidecar",
	"dashboard", "central", "ratesync", "denycache", "redisx"}

var (
	// "pkg.Name", "pkg.Type.Member", "pkg.Prefix*" (a family of names).
	qualifiedRE = regexp.MustCompile(`\b([a-z]+)\.([A-Z]\w*)(?:\.([A-Z]\w*))?(\*?)`)
	// "WithX", or "qual.WithX": another package's (context.WithValue, r.WithContext) is not ours.
	optionRE = regexp.MustCompile(`(?:\b(\w+)\.)?\bWith[A-Z]\w*`)
)

// TestNamesInDocsExist: every "pkg.Name" (and "pkg.Type.Member") the docs quote from one of the
// module's packages exists, and so does every With… option they name, qualified or not.
func TestNamesInDocsExist(t *testing.T) {
	ex := scan(t)
	anyPkg := func(name string) bool {
		for _, names := range ex {
			if names[name] {
				return true
			}
		}
		return false
	}
	checked := 0
	current(t, func(p page, n int, line string) {
		for _, m := range qualifiedRE.FindAllStringSubmatch(line, -1) {
			if !slices.Contains(ourPackages, m[1]) {
				continue
			}
			checked++
			names := ex[m[1]]
			switch {
			case m[4] == "*" && m[3] == "":
				if !slices.ContainsFunc(slices.Collect(maps.Keys(names)), func(nm string) bool { return strings.HasPrefix(nm, m[2]) }) {
					t.Errorf("%s:%d: no name of %s starts with %s", p.name, n, m[1], m[2])
				}
			case !names[m[2]]:
				t.Errorf("%s:%d: %s.%s does not exist", p.name, n, m[1], m[2])
			case m[3] != "" && !names[m[2]+"."+m[3]]:
				t.Errorf("%s:%d: %s.%s.%s does not exist (no such method or field)", p.name, n, m[1], m[2], m[3])
			}
		}
		for _, m := range optionRE.FindAllStringSubmatch(line, -1) {
			if m[1] != "" {
				continue // qualified: checked above when it is one of ours
			}
			checked++
			if !anyPkg(m[0]) {
				t.Errorf("%s:%d: option %s does not exist in any package", p.name, n, m[0])
			}
		}
	})
	if checked < 50 {
		t.Fatalf("only %d names checked: is the pattern still right?", checked)
	}
}

// sourceRE matches the list of Decision.Source words the docs give for the metrics' source
// attribute: "`source` (local, central, deny-cache, fallback".
var sourceRE = regexp.MustCompile("`source` \\(([a-z-]+(?:, [a-z-]+)*)")

// TestSourceWordsMatchTheCode: the words of hybrid's Decision.Source quoted in the docs are those
// Source.String returns, every one of them.
func TestSourceWordsMatchTheCode(t *testing.T) {
	var want []string
	for s := outcome.SourceLocal; s <= outcome.SourceFallback; s++ {
		want = append(want, s.String())
	}
	if got := (hybrid.Decision{}).Source.String(); got != "none" {
		t.Errorf("the zero Decision's Source is %q; Source.String's doc says \"none\"", got)
	}
	found := 0
	current(t, func(p page, n int, line string) {
		for _, m := range sourceRE.FindAllStringSubmatch(line, -1) {
			words := strings.Split(m[1], ", ")
			if len(words) < len(want) || !slices.Equal(words[:len(want)], want) {
				// policy's rule metrics add their own sources after hybrid's.
				t.Errorf("%s:%d: source words %v: hybrid's are %v", p.name, n, words, want)
			}
			found++
		}
	})
	if found == 0 {
		t.Fatal("no list of source words found in the docs")
	}
}
