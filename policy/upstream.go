package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/hybridrate/hybridrate/internal/option"
	"github.com/hybridrate/hybridrate/strict"
)

// This file reads envoyproxy/ratelimit's configuration files unchanged and compiles them to the
// same rules as the native format (one strict UpstreamWindow rule per rate_limit by default), with
// the descriptor tree that picks, for each descriptor of a request, the one rule that applies, as
// upstream's GetLimit does. docs/sidecar.md has the migration guide.

// UpstreamFile is one configuration file of envoyproxy/ratelimit: a domain and its descriptor tree.
// Parse one with [ParseUpstream]; combine several with [NewUpstreamConfig]. The zero UpstreamFile
// names no domain and no descriptors. It is a plain value, safe to copy; not modified by the
// package once returned, so safe to read from several goroutines.
type UpstreamFile struct {
	Name        string // the file name given to ParseUpstream, for error messages
	Domain      string
	Descriptors []UpstreamDescriptor
}

// UpstreamDescriptor is one node of a descriptor tree: it matches an entry of a request's
// descriptor by Key and Value. An empty Value matches any value (the key-only default); a Value
// ending in '*' matches the values that start with what precedes it (a wildcard). The zero
// UpstreamDescriptor has an empty Key, which NewUpstreamConfig refuses. It is a plain value, safe
// to copy; not modified by the package once returned, so safe to read from several goroutines.
type UpstreamDescriptor struct {
	Key            string
	Value          string
	RateLimit      *UpstreamLimit // nil: no limit at this node
	Descriptors    []UpstreamDescriptor
	ShadowMode     bool // the limit counts but never denies
	QuotaMode      bool // accepted and ignored (see docs/sidecar.md)
	DetailedMetric bool // the metric key names the request's values
	ValueToMetric  bool // the metric key names the request's value at this level
	ShareThreshold bool // every value the wildcard matches shares one counter

	line, column int
}

// UpstreamLimit is a descriptor's rate_limit. The zero UpstreamLimit is invalid (no unit). It is a
// plain value, safe to copy; not modified by the package once returned, so safe to read from
// several goroutines.
type UpstreamLimit struct {
	Unit            string // second, minute, hour, day, week, month (30 days) or year (365 days), any case
	RequestsPerUnit uint32
	Unlimited       bool     // the descriptor is never limited (and Unit must be empty)
	Name            string   // the limit's name, which other limits' Replaces refer to
	Replaces        []string // names of limits this one removes from the request when both match

	line, column int
}

// upstreamUnits are upstream's units, as Envoy's RateLimitResponse.RateLimit.Unit names them.
var upstreamUnits = map[string]time.Duration{
	"SECOND": time.Second,
	"MINUTE": time.Minute,
	"HOUR":   time.Hour,
	"DAY":    24 * time.Hour,
	"WEEK":   7 * 24 * time.Hour,
	"MONTH":  30 * 24 * time.Hour,
	"YEAR":   365 * 24 * time.Hour,
}

// UnitPeriod returns the window of an upstream unit name (any case), and whether it is one.
func UnitPeriod(unit string) (time.Duration, bool) {
	d, ok := upstreamUnits[strings.ToUpper(unit)]
	return d, ok
}

// ParseUpstream parses one envoyproxy/ratelimit configuration file, accepting exactly the fields
// upstream accepts (domain, descriptors, key, value, rate_limit with unit, requests_per_unit,
// unlimited, name and replaces, shadow_mode, quota_mode, detailed_metric, value_to_metric,
// share_threshold) and refusing what upstream refuses, with errors (an [*Error]) that name the
// file, the line and the column. YAML anchors and aliases are followed, as upstream's YAML library
// does.
func ParseUpstream(data []byte, name string) (*UpstreamFile, error) {
	d := &decoder{file: name}
	if len(data) > MaxFileSize {
		return nil, &Error{File: name, Msg: fmt.Sprintf("file is larger than %d bytes", MaxFileSize)}
	}
	f := &UpstreamFile{Name: name}
	var doc yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &Error{File: name, Msg: "config file cannot have empty domain"}
		}
		return nil, d.syntax(err, data)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, &Error{File: name, Msg: "config file cannot have empty domain"}
	}
	root := deref(doc.Content[0])
	if root.Kind == yaml.ScalarNode && root.ShortTag() == "!!null" {
		return nil, &Error{File: name, Msg: "config file cannot have empty domain"}
	}
	err := d.upFields(root, "config file", map[string]func(*yaml.Node) error{
		"domain": func(v *yaml.Node) (err error) {
			f.Domain, err = d.upString(v, "domain")
			return err
		},
		"descriptors": func(v *yaml.Node) (err error) {
			f.Descriptors, err = d.upDescriptors(v)
			return err
		},
	})
	if err != nil {
		return nil, err
	}
	if f.Domain == "" {
		return nil, d.errAt(root, "config file cannot have empty domain")
	}
	return f, nil
}

// LoadUpstreamFile reads and parses the file at path with [ParseUpstream]. Errors: the read's (an
// *fs.PathError), or ParseUpstream's (an [*Error] naming the line).
func LoadUpstreamFile(path string) (*UpstreamFile, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return ParseUpstream(data, path)
}

// LoadUpstreamDir parses every regular file under dir, recursively, in lexical order, as upstream
// reads its runtime directory (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY): whatever the
// files' names, dot files included unless ignoreDot. Symbolic links are followed, so a directory
// swapped by a symlink (as Kubernetes mounts a ConfigMap) is read whole, old or new. Errors: the
// walk's or a read's, wrapped, or the first file's ParseUpstream error (an [*Error] naming the file
// and line).
func LoadUpstreamDir(dir string, ignoreDot bool) ([]*UpstreamFile, error) {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	var paths []string
	err = filepath.WalkDir(real, func(path string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if ignoreDot && path != real && strings.HasPrefix(de.Name(), ".") {
			if de.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if de.IsDir() {
			return nil
		}
		fi, err := os.Stat(path) // follows links
		if err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			paths = append(paths, path)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	sort.Strings(paths)
	files := make([]*UpstreamFile, 0, len(paths))
	for _, p := range paths {
		data, err := readFile(p)
		if err != nil {
			return nil, err
		}
		name := p
		if rel, err := filepath.Rel(real, p); err == nil {
			name = filepath.Join(dir, rel)
		}
		f, err := ParseUpstream(data, name)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

func deref(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 64; i++ {
		n = n.Alias
	}
	return n
}

// upFields walks a mapping with upstream's keys; an unknown key is refused as upstream refuses it.
func (d *decoder) upFields(n *yaml.Node, what string, handlers map[string]func(*yaml.Node) error) error {
	n = deref(n)
	if n.Kind != yaml.MappingNode {
		return d.errAt(n, "config error, %s: want a mapping, got %s", what, describe(n))
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), deref(n.Content[i+1])
		if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
			if err := d.upFields(v, what, handlers); err != nil {
				return err
			}
			continue
		}
		if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
			return d.errAt(k, "config error, key is not of type string: %s", describe(k))
		}
		h, ok := handlers[k.Value]
		if !ok {
			if upstreamKeys[k.Value] {
				return d.errAt(k, "config error, %s: key '%s' does not belong here", what, k.Value)
			}
			return d.errAt(k, "config error, unknown key '%s'", k.Value)
		}
		if seen[k.Value] {
			return d.errAt(k, "config error, %s: key '%s' given twice", what, k.Value)
		}
		seen[k.Value] = true
		if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!null" {
			continue // upstream's YAML leaves the field at its zero value
		}
		if err := h(v); err != nil {
			return err
		}
	}
	return nil
}

// upstreamKeys are every key upstream accepts somewhere.
var upstreamKeys = map[string]bool{"domain": true, "key": true, "value": true, "descriptors": true,
	"rate_limit": true, "unit": true, "requests_per_unit": true, "unlimited": true, "shadow_mode": true,
	"quota_mode": true, "name": true, "replaces": true, "detailed_metric": true, "value_to_metric": true,
	"share_threshold": true}

// upString reads a scalar as upstream's YAML reads it into a string: numbers and booleans too.
func (d *decoder) upString(n *yaml.Node, what string) (string, error) {
	n = deref(n)
	if n.Kind != yaml.ScalarNode {
		return "", d.errAt(n, "config error, %s: want a string, got %s", what, describe(n))
	}
	return n.Value, nil
}

func (d *decoder) upBool(n *yaml.Node, what string) (bool, error) {
	n = deref(n)
	if n.Kind == yaml.ScalarNode {
		switch strings.ToLower(n.Value) {
		case "true", "yes", "on", "y":
			return true, nil
		case "false", "no", "off", "n":
			return false, nil
		}
	}
	return false, d.errAt(n, "config error, %s: want true or false, got %s", what, describe(n))
}

func (d *decoder) upDescriptors(n *yaml.Node) ([]UpstreamDescriptor, error) {
	n = deref(n)
	if n.Kind != yaml.SequenceNode {
		return nil, d.errAt(n, "config error, descriptors: want a list, got %s", describe(n))
	}
	out := make([]UpstreamDescriptor, len(n.Content))
	for i, c := range n.Content {
		c = deref(c)
		if c.Kind != yaml.MappingNode {
			return nil, d.errAt(c, "config error, yaml file contains list of type other than map: %s", describe(c))
		}
		if err := d.upDescriptor(c, &out[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (d *decoder) upDescriptor(n *yaml.Node, u *UpstreamDescriptor) error {
	u.line, u.column = n.Line, n.Column
	flag := func(dst *bool, name string) func(*yaml.Node) error {
		return func(v *yaml.Node) (err error) {
			*dst, err = d.upBool(v, name)
			return err
		}
	}
	return d.upFields(n, "descriptor", map[string]func(*yaml.Node) error{
		"key": func(v *yaml.Node) (err error) {
			u.Key, err = d.upString(v, "key")
			return err
		},
		"value": func(v *yaml.Node) (err error) {
			u.Value, err = d.upString(v, "value")
			return err
		},
		"descriptors": func(v *yaml.Node) (err error) {
			u.Descriptors, err = d.upDescriptors(v)
			return err
		},
		"rate_limit": func(v *yaml.Node) error {
			v = deref(v)
			l := &UpstreamLimit{line: v.Line, column: v.Column}
			u.RateLimit = l
			return d.upFields(v, "rate_limit", map[string]func(*yaml.Node) error{
				"unit": func(v *yaml.Node) (err error) {
					l.Unit, err = d.upString(v, "unit")
					return err
				},
				"requests_per_unit": func(v *yaml.Node) error {
					v = deref(v)
					x, err := strconv.ParseUint(strings.ReplaceAll(v.Value, "_", ""), 0, 32)
					if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!int" || err != nil {
						return d.errAt(v, "config error, requests_per_unit: want an integer from 0 to %d, got %s", uint32(1<<32-1), describe(v))
					}
					l.RequestsPerUnit = uint32(x)
					return nil
				},
				"unlimited": flag(&l.Unlimited, "unlimited"),
				"name": func(v *yaml.Node) (err error) {
					l.Name, err = d.upString(v, "name")
					return err
				},
				"replaces": func(v *yaml.Node) error {
					v = deref(v)
					if v.Kind != yaml.SequenceNode {
						return d.errAt(v, "config error, replaces: want a list of {name: ...}, got %s", describe(v))
					}
					for _, c := range v.Content {
						c = deref(c)
						if c.Kind != yaml.MappingNode {
							return d.errAt(c, "config error, yaml file contains list of type other than map: %s", describe(c))
						}
						var name string
						err := d.upFields(c, "replaces", map[string]func(*yaml.Node) error{
							"name": func(v *yaml.Node) (err error) {
								name, err = d.upString(v, "name")
								return err
							},
						})
						if err != nil {
							return err
						}
						if name == "" {
							return d.errAt(c, "should not have an empty replaces entry")
						}
						l.Replaces = append(l.Replaces, name)
					}
					return nil
				},
			})
		},
		"shadow_mode":     flag(&u.ShadowMode, "shadow_mode"),
		"quota_mode":      flag(&u.QuotaMode, "quota_mode"),
		"detailed_metric": flag(&u.DetailedMetric, "detailed_metric"),
		"value_to_metric": flag(&u.ValueToMetric, "value_to_metric"),
		"share_threshold": flag(&u.ShareThreshold, "share_threshold"),
	})
}

// upstreamSettings is NewUpstreamConfig's settings, from its options (options.go).
type upstreamSettings struct {
	MergeDomains bool      // WithMergeDomains
	Algorithm    Algorithm // WithUpstreamAlgorithm
}

// UpstreamConfig is a set of envoyproxy/ratelimit configuration files ready to serve: the rules
// they compile to ([UpstreamConfig.Policy]) and the trees that pick a descriptor's rule
// ([UpstreamConfig.Lookup]). It is immutable and safe for concurrent use. The zero UpstreamConfig
// is not usable: build one with [NewUpstreamConfig].
type UpstreamConfig struct {
	domains map[string]*unode
	policy  *Policy
}

// unode is a node of a compiled descriptor tree.
type unode struct {
	children  map[string]*unode // by "key_value", or "key" for a key-only default
	wildcards []string          // the children's keys that end in '*', in file order
	limit     *UpstreamLimit    // nil: none
	rule      string            // the compiled rule's id; empty when unlimited or 0 per unit
	period    time.Duration
	fullKey   string // "domain.key_value.key", upstream's stats key of the node
	shadow    bool
	detailed  bool
	toMetric  bool
	shared    string // the wildcard ("key_prefix*") when share_threshold is set
}

// NewUpstreamConfig compiles files (in order) as upstream loads them, refusing what upstream
// refuses: an empty key, a descriptor key given twice at one level, a unit with unlimited or an
// invalid unit without, an empty replaces entry or one naming its own limit, share_threshold on a
// value that is not a wildcard, a domain given twice unless [WithMergeDomains]. Errors name the file
// and line; an invalid option's wraps [ErrBadOption]. Without options, the configuration is
// upstream's defaults.
func NewUpstreamConfig(files []*UpstreamFile, opts ...UpstreamOption) (*UpstreamConfig, error) {
	var set upstreamSettings
	if err := option.Apply(&set, ErrBadOption, opts); err != nil {
		return nil, err
	}
	algo := set.Algorithm
	if algo == "" {
		algo = UpstreamWindow
	}
	if !algo.valid() {
		return nil, &Error{Msg: fmt.Sprintf("algorithm %q: want hybrid, token_bucket, gcra, fixed_window, sliding_window, sliding_log or upstream_window", algo)}
	}
	c := &UpstreamConfig{domains: map[string]*unode{}, policy: &Policy{Select: true}}
	for _, f := range files {
		if f == nil {
			continue
		}
		d := &decoder{file: f.Name}
		if f.Domain == "" {
			return nil, &Error{File: f.Name, Msg: "config file cannot have empty domain"}
		}
		root, ok := c.domains[f.Domain]
		if ok && !set.MergeDomains {
			return nil, &Error{File: f.Name, Msg: fmt.Sprintf("duplicate domain '%s' in config file", f.Domain)}
		}
		if !ok {
			root = &unode{children: map[string]*unode{}}
			c.domains[f.Domain] = root
		}
		if err := c.load(d, algo, f.Domain, root, f.Domain+".", f.Descriptors); err != nil {
			return nil, err
		}
	}
	if len(c.policy.Rules) > MaxSelectRules {
		return nil, &Error{Msg: fmt.Sprintf("%d limits: at most %d", len(c.policy.Rules), MaxSelectRules)}
	}
	if err := c.policy.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *UpstreamConfig) load(d *decoder, algo Algorithm, domain string, parent *unode, parentKey string, descs []UpstreamDescriptor) error {
	for i := range descs {
		u := &descs[i]
		at := &yaml.Node{Line: u.line, Column: u.column}
		if u.Key == "" {
			return d.errAt(at, "descriptor has empty key")
		}
		key := u.Key
		if u.Value != "" {
			key += "_" + u.Value
		}
		full := parentKey + key
		if _, dup := parent.children[key]; dup {
			return d.errAt(at, "duplicate descriptor composite key '%s'", full)
		}
		n := &unode{children: map[string]*unode{}, fullKey: full, shadow: u.ShadowMode,
			detailed: u.DetailedMetric, toMetric: u.ValueToMetric}
		if l := u.RateLimit; l != nil {
			lat := &yaml.Node{Line: l.line, Column: l.column}
			period, valid := UnitPeriod(l.Unit)
			switch {
			case l.Unlimited && valid:
				return d.errAt(lat, "should not specify rate limit unit when unlimited")
			case !l.Unlimited && !valid:
				return d.errAt(lat, "invalid rate limit unit '%s'", l.Unit)
			}
			for _, r := range l.Replaces {
				if r == "" {
					return d.errAt(lat, "should not have an empty replaces entry")
				}
				if r == l.Name {
					return d.errAt(lat, "replaces should not contain name of same descriptor")
				}
			}
			n.limit, n.period = l, period
			if !l.Unlimited && l.RequestsPerUnit > 0 {
				n.rule = upstreamRuleID(domain, full, l.Unit)
				c.policy.Rules = append(c.policy.Rules, Rule{
					ID: n.rule, Algorithm: algo, Dimensions: []string{DimDescriptor},
					// Above strict.MaxLimit (10⁹), a limit counts as 10⁹: docs/sidecar.md.
					// shadow_mode is applied by the caller (UpstreamMatch.Shadow), not by the rule:
					// upstream counts and reads a shadow limit as any other, then answers OK.
					Limit: min(int64(l.RequestsPerUnit), strict.MaxLimit), Period: period,
					MissingKey: MissingSkip, line: l.line, column: l.column,
				})
			}
		}
		if u.ShareThreshold {
			if !strings.HasSuffix(key, "*") {
				return d.errAt(at, "share_threshold can only be used with wildcard values (ending with '*'), but found key '%s'", key)
			}
			n.shared = key
		}
		if strings.HasSuffix(key, "*") {
			parent.wildcards = append(parent.wildcards, key)
		}
		if err := c.load(d, algo, domain, n, full+".", u.Descriptors); err != nil {
			return err
		}
		parent.children[key] = n
	}
	return nil
}

// upstreamRuleID names the rule of a tree node: stable while the node's path and unit are, so a
// reload that changes a limit keeps its counters, as upstream's keys do.
func upstreamRuleID(domain, path, unit string) string {
	h := sha256.Sum256([]byte(domain + "\x00" + path + "\x00" + strings.ToUpper(unit)))
	return "rl-" + hex.EncodeToString(h[:12])
}

// Policy returns the rules the files compile to: one per rate_limit that limits (not unlimited,
// requests_per_unit above 0), counting per DimDescriptor, with Select set. Give it to
// [Enforcer.SetPolicy], and name each request's rule with [UpstreamConfig.Lookup]. It does no I/O;
// the Policy is shared, not to be modified.
func (c *UpstreamConfig) Policy() *Policy { return c.policy }

// HasDomain reports whether a file configures domain. It does no I/O.
func (c *UpstreamConfig) HasDomain(domain string) bool { return c.domains[domain] != nil }

// Domains returns the domains configured, sorted. It does no I/O; the slice is the caller's.
func (c *UpstreamConfig) Domains() []string {
	out := make([]string, 0, len(c.domains))
	for d := range c.domains {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// DescriptorEntry is one entry of a request's descriptor. The zero DescriptorEntry has an empty
// key, which matches no tree node. It is a plain value, safe to copy.
type DescriptorEntry struct{ Key, Value string }

// UpstreamMatch is the limit [UpstreamConfig.Lookup] finds for a descriptor. The zero UpstreamMatch
// is what Lookup returns with false. It is a plain value, safe to copy; not modified by the package
// once returned, so safe to read from several goroutines.
type UpstreamMatch struct {
	// Rule is the id of the rule to check (Request.Rule); empty when the limit is unlimited or
	// admits 0 per unit.
	Rule string
	// Subject is the descriptor as its counter is keyed (Request.Dims' DimDescriptor): every
	// entry's key and value, a shared wildcard in place of the values share_threshold groups.
	Subject string
	// Limit is the node's rate_limit.
	Limit *UpstreamLimit
	// Period is the window of Limit.Unit.
	Period time.Duration
	// Shadow is the node's shadow_mode.
	Shadow bool
	// Metric is upstream's stats key of the limit: the node's path, or with detailed_metric the
	// request's own keys and values, with value_to_metric the values of the levels that set it.
	Metric string
}

// Lookup returns the limit of a descriptor of domain, found as upstream's GetLimit finds it, and
// whether there is one. Each entry descends one level of the tree: to the child of the entry's key
// and value, else to the first wildcard child (in file order) whose prefix the value starts with,
// else to the key-only child; there is no backtracking. The limit is that of the node the last
// entry reaches; a descriptor that stops short of a limit or goes past the tree's depth has none.
// It does no I/O.
func (c *UpstreamConfig) Lookup(domain string, entries []DescriptorEntry) (UpstreamMatch, bool) {
	root := c.domains[domain]
	if root == nil || len(entries) == 0 {
		return UpstreamMatch{}, false
	}
	var found *unode
	var shared map[int]string // entry index → the shared wildcard value
	var metricArr [8]string
	toMetric := metricArr[:0]
	var keyArr [128]byte
	node := root
	for i, e := range entries {
		// key is e.Key + "_" + e.Value, built as a string only where it is kept (m = key).
		kb := append(append(append(keyArr[:0], e.Key...), '_'), e.Value...)
		next := node.children[string(kb)]
		wild := ""
		if next == nil {
			for _, w := range node.wildcards {
				if p := strings.TrimSuffix(w, "*"); len(kb) >= len(p) && string(kb[:len(p)]) == p {
					next, wild = node.children[w], w
					break
				}
			}
		}
		byValue := next != nil
		if next == nil {
			next = node.children[e.Key]
		}
		// value_to_metric's path, as upstream builds it.
		var m string
		switch {
		case next == nil:
			m = e.Key
		case wild != "" && next.shared != "":
			m = e.Key + "_" + strings.TrimPrefix(next.shared, e.Key+"_")
		case wild != "" && next.toMetric:
			m = e.Key + "_" + e.Value
		case wild != "":
			m = wild
		case byValue:
			m = string(kb)
		case next.toMetric && e.Value != "":
			m = string(kb)
		default:
			m = e.Key
		}
		toMetric = append(toMetric, m)
		if wild != "" && next != nil && next.shared != "" {
			if shared == nil {
				shared = map[int]string{}
			}
			shared[i] = strings.TrimPrefix(next.shared, e.Key+"_")
		}
		if next != nil && next.limit != nil && i == len(entries)-1 {
			found = next
		}
		if next == nil || len(next.children) == 0 {
			break
		}
		node = next
	}
	if found == nil {
		return UpstreamMatch{}, false
	}
	var sb strings.Builder
	size := 0
	for _, e := range entries {
		size += len(e.Key) + len(e.Value) + 2
	}
	sb.Grow(size) // a hint: a shared value's length may differ from the value's
	for i, e := range entries {
		v := e.Value
		if s, ok := shared[i]; ok {
			v = s
		}
		sb.WriteString(e.Key)
		sb.WriteByte('_')
		sb.WriteString(v)
		sb.WriteByte('_')
	}
	m := UpstreamMatch{Rule: found.rule, Subject: sb.String(), Limit: found.limit, Period: found.period,
		Shadow: found.shadow, Metric: found.fullKey}
	switch {
	case found.detailed:
		var b strings.Builder
		b.WriteString(domain)
		for i, e := range entries {
			b.WriteByte('.')
			b.WriteString(e.Key)
			v := e.Value
			if s, ok := shared[i]; ok {
				v = s
			}
			if v != "" {
				b.WriteByte('_')
				b.WriteString(v)
			}
		}
		m.Metric = b.String()
	default:
		// Most often the node's own key: then no new string.
		var buf [128]byte
		b := append(buf[:0], domain...)
		for _, t := range toMetric {
			b = append(append(b, '.'), t...)
		}
		if string(b) != found.fullKey {
			m.Metric = string(b)
		}
	}
	return m, true
}
