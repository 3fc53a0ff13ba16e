package policy_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/policy"
)

// readmeExample returns the file name of testdata/upstream-readme: one of upstream's README
// examples, unchanged (cmd/hybridrated's oracle test runs them all against upstream).
func readmeExample(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "upstream-readme", name))
	require.NoError(t, err)
	return string(b)
}

// TestUpstreamReadmeExamplesLoad: upstream's README examples, unchanged, load as one configuration
// of their 13 domains (cmd/hybridrated's oracle test compares the answers with upstream's).
func TestUpstreamReadmeExamplesLoad(t *testing.T) {
	ents, err := os.ReadDir(filepath.Join("testdata", "upstream-readme"))
	require.NoError(t, err)
	var docs []string
	for _, e := range ents {
		docs = append(docs, readmeExample(t, e.Name()))
	}
	c := upstreamConfig(t, nil, docs...)
	assert.Len(t, c.Domains(), 13)
	assert.True(t, c.HasDomain("example10_wildcard"))
}

const edgeProxy = `
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0

  - key: path
    value: /foo*
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: path
    value: /foo/bar*
    rate_limit:
      unit: minute
      requests_per_unit: 99
  - key: path
    value: /baz*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 7
  - key: unlimited
    rate_limit:
      unlimited: true
      name: free
  - key: replacer
    rate_limit:
      unit: minute
      requests_per_unit: 20
      name: specific
      replaces:
        - name: general
  - key: general
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 100
      name: general
`

func upstreamConfig(t *testing.T, opts []policy.UpstreamOption, docs ...string) *policy.UpstreamConfig {
	t.Helper()
	var files []*policy.UpstreamFile
	for i, d := range docs {
		f, err := policy.ParseUpstream([]byte(d), "config"+string(rune('a'+i))+".yaml")
		require.NoError(t, err)
		files = append(files, f)
	}
	c, err := policy.NewUpstreamConfig(files, opts...)
	require.NoError(t, err)
	return c
}

func entries(kv ...string) []policy.DescriptorEntry {
	var out []policy.DescriptorEntry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, policy.DescriptorEntry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func TestUpstreamLookupMatchesAsGetLimit(t *testing.T) {
	c := upstreamConfig(t, nil, readmeExample(t, "01-messaging.yaml"), edgeProxy)
	type want struct {
		rpu    uint32
		unit   string
		metric string
	}
	for _, tc := range []struct {
		name    string
		domain  string
		entries []policy.DescriptorEntry
		want    *want
	}{
		{"exact value, then the key-only child", "messaging", entries("message_type", "marketing", "to_number", "2061111111"), &want{5, "day", "messaging.message_type_marketing.to_number"}},
		{"key-only default", "messaging", entries("to_number", "2061111111"), &want{100, "day", "messaging.to_number"}},
		{"stops short of the limit", "messaging", entries("message_type", "marketing"), nil},
		{"deeper than the tree", "messaging", entries("to_number", "1", "extra", "x"), nil},
		{"no backtracking: value matched, its subtree lacks the key", "messaging", entries("message_type", "marketing", "other", "x"), nil},
		{"unknown key", "messaging", entries("nope", "x"), nil},
		{"unknown domain", "nope", entries("to_number", "1"), nil},
		{"exact value before the default", "edge_proxy_per_ip", entries("remote_address", "50.0.0.5"), &want{0, "second", "edge_proxy_per_ip.remote_address_50.0.0.5"}},
		{"default for other values", "edge_proxy_per_ip", entries("remote_address", "10.0.0.1"), &want{10, "second", "edge_proxy_per_ip.remote_address"}},
		{"first wildcard in file order", "edge_proxy_per_ip", entries("path", "/foo/bar/x"), &want{3, "minute", "edge_proxy_per_ip.path_/foo*"}},
		{"wildcard matches the bare prefix", "edge_proxy_per_ip", entries("path", "/foo"), &want{3, "minute", "edge_proxy_per_ip.path_/foo*"}},
		{"no wildcard, no default", "edge_proxy_per_ip", entries("path", "/fo"), nil},
		{"detailed_metric names the values", "edge_proxy_per_ip", entries("general", "g1"), &want{100, "minute", "edge_proxy_per_ip.general_g1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, ok := c.Lookup(tc.domain, tc.entries)
			if tc.want == nil {
				require.False(t, ok, "%+v", m)
				return
			}
			require.True(t, ok)
			require.Equal(t, tc.want.rpu, m.Limit.RequestsPerUnit)
			require.Equal(t, tc.want.unit, m.Limit.Unit)
			require.Equal(t, tc.want.metric, m.Metric)
			require.Equal(t, tc.want.rpu == 0, m.Rule == "", "a rule exactly when the limit counts")
		})
	}
	// share_threshold: every value under the wildcard shares one counter; others count per value.
	a, _ := c.Lookup("edge_proxy_per_ip", entries("path", "/baz/1"))
	b, _ := c.Lookup("edge_proxy_per_ip", entries("path", "/baz/2"))
	require.Equal(t, a.Subject, b.Subject)
	require.Equal(t, "path_/baz*_", a.Subject)
	x, _ := c.Lookup("edge_proxy_per_ip", entries("path", "/foo/1"))
	y, _ := c.Lookup("edge_proxy_per_ip", entries("path", "/foo/2"))
	require.NotEqual(t, x.Subject, y.Subject)
	require.Equal(t, x.Rule, y.Rule)
	// unlimited and replaces are reported, for the caller to apply across descriptors.
	u, ok := c.Lookup("edge_proxy_per_ip", entries("unlimited", "x"))
	require.True(t, ok)
	require.True(t, u.Limit.Unlimited)
	require.Empty(t, u.Rule)
	r, _ := c.Lookup("edge_proxy_per_ip", entries("replacer", "x"))
	require.Equal(t, []string{"general"}, r.Limit.Replaces)
}

func TestUpstreamValidationNamesFileAndLine(t *testing.T) {
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"unknown key", "domain: d\ndescriptors:\n  - key: a\n    bogus: 1\n", "c.yaml:4:5: config error, unknown key 'bogus'"},
		{"native field", "domain: d\nrules: []\n", "c.yaml:2:1: config error, unknown key 'rules'"},
		{"empty domain", "descriptors: []\n", "c.yaml:1:1: config file cannot have empty domain"},
		{"empty key", "domain: d\ndescriptors:\n  - value: v\n", "c.yaml:3:5: descriptor has empty key"},
		{"duplicate key", "domain: d\ndescriptors:\n  - key: a\n  - key: a\n", "c.yaml:4:5: duplicate descriptor composite key 'd.a'"},
		{"bad unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n", "c.yaml:5:7: invalid rate limit unit 'fortnight'"},
		{"unit with unlimited", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      unit: second\n", "c.yaml:5:7: should not specify rate limit unit when unlimited"},
		{"replaces itself", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      name: n\n      replaces: [{name: n}]\n", "c.yaml:5:7: replaces should not contain name of same descriptor"},
		{"empty replaces", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: \"\"\n", "c.yaml:8:11: should not have an empty replaces entry"},
		{"share_threshold without wildcard", "domain: d\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n", "c.yaml:3:5: share_threshold can only be used with wildcard values"},
		{"negative requests", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n", "c.yaml:6:26: config error, requests_per_unit"},
		{"list of scalars", "domain: d\ndescriptors:\n  - a\n", "c.yaml:3:5: config error, yaml file contains list of type other than map"},
		{"syntax", "domain: d\ndescriptors:\n  - key: a\n   value: b\n", "c.yaml:4: syntax error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := policy.ParseUpstream([]byte(tc.doc), "c.yaml")
			if err == nil {
				_, err = policy.NewUpstreamConfig([]*policy.UpstreamFile{f})
			}
			require.Error(t, err)
			require.ErrorIs(t, err, policy.ErrInvalid)
			require.True(t, strings.HasPrefix(err.Error(), tc.want), "got %q, want prefix %q", err, tc.want)
		})
	}
}

func TestUpstreamAcceptsEveryUpstreamField(t *testing.T) {
	doc := `domain: all
descriptors:
  - key: k
    value: "v*"
    shadow_mode: true
    quota_mode: false
    detailed_metric: true
    value_to_metric: true
    share_threshold: true
    rate_limit:
      unit: YEAR
      requests_per_unit: 4294967295
      name: big
      replaces:
        - name: other
    descriptors:
      - key: n
        value: 42
        rate_limit: {unit: week, requests_per_unit: 1}
  - key: month
    rate_limit: {unit: month, requests_per_unit: 3}
`
	c := upstreamConfig(t, nil, doc)
	p := c.Policy()
	require.True(t, p.Select)
	require.Len(t, p.Rules, 3)
	for _, r := range p.Rules {
		require.Equal(t, policy.UpstreamWindow, r.Algorithm)
		require.Equal(t, []string{policy.DimDescriptor}, r.Dimensions)
	}
	m, ok := c.Lookup("all", entries("k", "v1", "n", "42"))
	require.True(t, ok)
	require.Equal(t, 7*24*time.Hour, m.Period)
	m, ok = c.Lookup("all", entries("month", "x"))
	require.True(t, ok)
	require.Equal(t, 30*24*time.Hour, m.Period)
	m, ok = c.Lookup("all", entries("k", "vv"))
	require.True(t, ok)
	require.True(t, m.Shadow)
	require.Equal(t, 365*24*time.Hour, m.Period)
}

func TestUpstreamDomainsMergeOnlyWhenAsked(t *testing.T) {
	a := "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	b := "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 2}\n"
	fa, err := policy.ParseUpstream([]byte(a), "a.yaml")
	require.NoError(t, err)
	fb, err := policy.ParseUpstream([]byte(b), "b.yaml")
	require.NoError(t, err)
	_, err = policy.NewUpstreamConfig([]*policy.UpstreamFile{fa, fb})
	require.ErrorContains(t, err, "b.yaml: duplicate domain 'd' in config file")
	c, err := policy.NewUpstreamConfig([]*policy.UpstreamFile{fa, fb}, policy.WithMergeDomains())
	require.NoError(t, err)
	_, ok := c.Lookup("d", entries("b", "x"))
	require.True(t, ok)
	// A key given in both files is refused even when merging, as upstream refuses it.
	_, err = policy.NewUpstreamConfig([]*policy.UpstreamFile{fa, fa}, policy.WithMergeDomains())
	require.ErrorContains(t, err, "duplicate descriptor composite key 'd.a'")
}

func TestLoadUpstreamDirFollowsASymlinkSwap(t *testing.T) {
	root := t.TempDir()
	v1 := filepath.Join(root, "v1", "config")
	v2 := filepath.Join(root, "v2", "config")
	require.NoError(t, os.MkdirAll(v1, 0o755))
	require.NoError(t, os.MkdirAll(v2, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(v1, "a.yaml"), []byte("domain: one\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(v1, ".hidden"), []byte("not: yaml: at all"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(v2, "b.yaml"), []byte("domain: two\n"), 0o644))
	cur := filepath.Join(root, "current")
	require.NoError(t, os.Symlink(filepath.Join(root, "v1"), cur))

	_, err := policy.LoadUpstreamDir(filepath.Join(cur, "config"), false)
	require.ErrorContains(t, err, ".hidden", "dot files are read unless ignored, as upstream reads them")
	files, err := policy.LoadUpstreamDir(filepath.Join(cur, "config"), true)
	require.NoError(t, err)
	require.Len(t, files, 1)
	require.Equal(t, "one", files[0].Domain)

	tmp := filepath.Join(root, "next")
	require.NoError(t, os.Symlink(filepath.Join(root, "v2"), tmp))
	require.NoError(t, os.Rename(tmp, cur)) // the atomic swap Kubernetes does
	files, err = policy.LoadUpstreamDir(filepath.Join(cur, "config"), true)
	require.NoError(t, err)
	require.Len(t, files, 1)
	require.Equal(t, "two", files[0].Domain)
}

// TestUpstreamPolicyCountsPerDescriptorAndDomain enforces a compiled configuration on real Redis:
// the rule the tree names applies, nothing else, counted per descriptor values and per domain.
func TestUpstreamPolicyCountsPerDescriptorAndDomain(t *testing.T) {
	doc := `domain: d
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: s
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
`
	c := upstreamConfig(t, nil, doc, strings.Replace(doc, "domain: d", "domain: e", 1))
	e := newEnv(t, nil, c.Policy())
	check := func(domain string, es []policy.DescriptorEntry) policy.Result {
		m, ok := c.Lookup(domain, es)
		require.True(t, ok)
		return e.check(t, &policy.Request{Domain: domain, Rule: m.Rule, Dims: policy.Values{policy.DimDescriptor: m.Subject}})
	}
	for i, want := range []bool{true, true, false} {
		res := check("d", entries("k", "a"))
		require.Equal(t, want, res.Allowed, "request %d", i+1)
		require.Len(t, res.Decisions, 1)
		require.Equal(t, int64(2), res.Decisions[0].Limit)
	}
	require.True(t, check("d", entries("k", "b")).Allowed, "another value, another counter")
	require.True(t, check("e", entries("k", "a")).Allowed, "another domain, another counter")
	// shadow_mode counts as any limit, and the caller answers OK: it is the match's, not the rule's.
	for i, want := range []bool{true, false, false} {
		require.Equal(t, want, check("d", entries("s", "a")).Allowed, "shadow request %d", i+1)
	}
	m, ok := c.Lookup("d", entries("s", "a"))
	require.True(t, ok)
	require.True(t, m.Shadow)
	// A request that names no rule, or one that no longer exists, is admitted with no decision.
	res, err := e.enf.Check(context.Background(), &policy.Request{Domain: "d", Rule: "rl-gone"})
	require.NoError(t, err)
	require.True(t, res.Allowed)
	require.Empty(t, res.Decisions)
}

// TestSelectLiftsTheStrictCountBound: more than strict.MaxChecks strict rules are fine when each
// request is checked against one.
func TestSelectLiftsTheStrictCountBound(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for i := range 40 {
		b.WriteString("  - key: k" + string(rune('a'+i%26)) + string(rune('a'+i/26)) + "\n    rate_limit: {unit: second, requests_per_unit: 5}\n")
	}
	c := upstreamConfig(t, nil, b.String())
	require.Len(t, c.Policy().Rules, 40)
	p := *c.Policy()
	p.Select = false
	require.ErrorContains(t, p.Validate(), "strict counters would apply to one request")
}
