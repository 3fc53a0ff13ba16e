package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/hybridrate/hybridrate/outcome"
	"go.yaml.in/yaml/v3"
)

// MaxFileSize is the largest policy file Parse and LoadFile accept, in bytes.
const MaxFileSize = 1 << 20

// LoadFile reads and parses the policy file at path: JSON when its name ends in ".json", YAML
// otherwise. Errors name the file and the line; see [Parse].
func LoadFile(path string) (*Policy, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(data, path)
}

// readFile reads at most MaxFileSize+1 bytes of path.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("policy: read %s: %w", path, err)
	}
	return data, nil
}

// Parse parses a policy in YAML or JSON and validates it ([Policy.Validate]). name is the file name
// used in error messages; a name ending in ".json" makes the data JSON, checked as such, any other
// name YAML (a superset of JSON). docs/policies.md describes the format.
//
// Every error is an [*Error] naming the line (and column) of the offending field: a syntax error, an
// unknown or repeated field, a value of the wrong type or out of range, or an inconsistent rule.
// YAML anchors and aliases are refused.
func Parse(data []byte, name string) (*Policy, error) {
	d := &decoder{file: name}
	if len(data) > MaxFileSize {
		return nil, &Error{File: name, Msg: fmt.Sprintf("file is larger than %d bytes", MaxFileSize)}
	}
	if strings.EqualFold(filepath.Ext(name), ".json") {
		if err := checkJSON(data); err != nil {
			err.File = name
			return nil, err
		}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &Error{File: name, Msg: "empty policy"}
		}
		return nil, d.syntax(err, data)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, &Error{File: name, Line: extra.Line, Column: extra.Column, Msg: "more than one YAML document: want one policy per file"}
	} else if !errors.Is(err, io.EOF) {
		return nil, d.syntax(err, data)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, &Error{File: name, Msg: "empty policy"}
	}
	p, err := d.policy(doc.Content[0])
	if err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return p, nil
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// syntax converts a yaml.v3 syntax error ("yaml: line 3: did not find expected key") to an *Error.
// yaml.v3 often names the line where the enclosing block began rather than the offending line, so
// the line is the later of that and the first line at which a prefix of the document stops parsing.
func (d *decoder) syntax(err error, data []byte) *Error {
	msg := err.Error()
	e := &Error{File: d.file, Msg: "syntax error: " + strings.TrimPrefix(msg, "yaml: ")}
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		e.Line, _ = strconv.Atoi(m[1])
		e.Msg = "syntax error: " + m[2]
	}
	e.Line = max(e.Line, firstBadLine(data))
	return e
}

// firstBadLine returns the smallest k such that the first k lines of data do not parse (found by
// bisection), or 0.
func firstBadLine(data []byte) int {
	lines := bytes.SplitAfter(data, []byte("\n"))
	bad := func(k int) bool {
		var n yaml.Node
		dec := yaml.NewDecoder(bytes.NewReader(bytes.Join(lines[:k], nil)))
		for {
			if err := dec.Decode(&n); err != nil {
				return !errors.Is(err, io.EOF)
			}
		}
	}
	if !bad(len(lines)) {
		return 0
	}
	lo, hi := 0, len(lines) // bad(hi) holds; bad(0) does not
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if bad(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// checkJSON reports a JSON syntax error with its line and column.
func checkJSON(data []byte) *Error {
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		_, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			off := dec.InputOffset()
			var se *json.SyntaxError
			if errors.As(err, &se) {
				off = se.Offset
			}
			line, col := lineCol(data, off)
			return &Error{Line: line, Column: col, Msg: "JSON syntax error: " + err.Error()}
		}
	}
}

// lineCol converts a byte offset to a 1-based line and column.
func lineCol(data []byte, off int64) (int, int) {
	off = min(max(off, 0), int64(len(data)))
	before := data[:off]
	line := bytes.Count(before, []byte("\n")) + 1
	col := int(off) - bytes.LastIndexByte(before, '\n')
	return line, col
}

// decoder walks a yaml.Node tree into a Policy, recording positions for later error messages.
type decoder struct {
	file string
}

func (d *decoder) errAt(n *yaml.Node, format string, args ...any) *Error {
	return &Error{File: d.file, Line: n.Line, Column: n.Column, Msg: fmt.Sprintf(format, args...)}
}

// fields walks a mapping node: every key must be in handlers (else "unknown field"), at most once.
func (d *decoder) fields(n *yaml.Node, what string, positions map[string]pos, handlers map[string]func(v *yaml.Node) error) error {
	if err := d.kind(n, yaml.MappingNode, what, "a mapping"); err != nil {
		return err
	}
	seen := make(map[string]bool, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if err := d.kind(k, yaml.ScalarNode, what+" key", "a field name"); err != nil {
			return err
		}
		h, ok := handlers[k.Value]
		if !ok {
			return d.errAt(k, "%s: unknown field %q (want one of %s)", what, k.Value, keyList(handlers))
		}
		if seen[k.Value] {
			return d.errAt(k, "%s: field %q given twice", what, k.Value)
		}
		seen[k.Value] = true
		if positions != nil {
			positions[k.Value] = pos{k.Line, k.Column}
		}
		if v.Kind == yaml.AliasNode {
			return d.errAt(v, "%s: %s: YAML aliases are not supported", what, k.Value)
		}
		if err := h(v); err != nil {
			return err
		}
	}
	return nil
}

func keyList(m map[string]func(*yaml.Node) error) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sortStrings(keys)
	return strings.Join(keys, ", ")
}

func (d *decoder) kind(n *yaml.Node, k yaml.Kind, what, want string) error {
	if n.Kind == yaml.AliasNode {
		return d.errAt(n, "%s: YAML aliases are not supported", what)
	}
	if n.Kind != k {
		return d.errAt(n, "%s: want %s, got %s", what, want, describe(n))
	}
	return nil
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return "nothing (null)"
		}
		return strconv.Quote(n.Value)
	}
	return "something else"
}

func (d *decoder) str(n *yaml.Node, what string) (string, error) {
	if err := d.kind(n, yaml.ScalarNode, what, "a string"); err != nil {
		return "", err
	}
	if n.ShortTag() != "!!str" {
		return "", d.errAt(n, "%s: want a string, got %s", what, describe(n))
	}
	return n.Value, nil
}

func (d *decoder) integer(n *yaml.Node, what string) (int64, error) {
	if err := d.kind(n, yaml.ScalarNode, what, "an integer"); err != nil {
		return 0, err
	}
	if n.ShortTag() != "!!int" {
		return 0, d.errAt(n, "%s: want an integer, got %s", what, describe(n))
	}
	v, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
	if err != nil {
		return 0, d.errAt(n, "%s: want an integer, got %s", what, describe(n))
	}
	return v, nil
}

func (d *decoder) boolean(n *yaml.Node, what string) (bool, error) {
	if err := d.kind(n, yaml.ScalarNode, what, "true or false"); err != nil {
		return false, err
	}
	if n.ShortTag() != "!!bool" {
		return false, d.errAt(n, "%s: want true or false, got %s", what, describe(n))
	}
	var b bool
	if err := n.Decode(&b); err != nil {
		return false, d.errAt(n, "%s: want true or false, got %s", what, describe(n))
	}
	return b, nil
}

func (d *decoder) strList(n *yaml.Node, what string) ([]string, error) {
	if err := d.kind(n, yaml.SequenceNode, what, "a list"); err != nil {
		return nil, err
	}
	out := make([]string, 0, len(n.Content))
	for i, c := range n.Content {
		s, err := d.str(c, fmt.Sprintf("%s[%d]", what, i))
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// duration parses "500ms", "1m", "1h30m" or "2d".
func (d *decoder) duration(n *yaml.Node, what string) (time.Duration, error) {
	s, err := d.str(n, what)
	if err != nil {
		if n.Kind == yaml.ScalarNode && (n.ShortTag() == "!!int" || n.ShortTag() == "!!float") {
			return 0, d.errAt(n, "%s: want a duration with a unit, such as \"1m\" or \"500ms\", got %s", what, describe(n))
		}
		return 0, err
	}
	v, ok := parseDuration(s)
	if !ok || v <= 0 {
		return 0, d.errAt(n, "%s: want a positive duration such as \"1m\", \"1h30m\" or \"2d\", got %q", what, s)
	}
	return v, nil
}

func parseDuration(s string) (time.Duration, bool) {
	if strings.HasSuffix(s, "d") {
		days, err := strconv.ParseInt(strings.TrimSuffix(s, "d"), 10, 64)
		if err != nil || days < 0 || days > math.MaxInt64/int64(24*time.Hour) {
			return 0, false
		}
		return time.Duration(days) * 24 * time.Hour, true
	}
	v, err := time.ParseDuration(s)
	return v, err == nil
}

// rate parses a number (tokens per second) or "N/unit": "100/s", "6000/m", "1000/h", "5/d", "10/30s".
func (d *decoder) rate(n *yaml.Node, what string) (float64, error) {
	if err := d.kind(n, yaml.ScalarNode, what, "a rate"); err != nil {
		return 0, err
	}
	bad := func() (float64, error) {
		return 0, d.errAt(n, "%s: want a number of tokens per second or \"N/unit\" such as \"100/s\", \"6000/m\", \"10/30s\", got %s", what, describe(n))
	}
	switch n.ShortTag() {
	case "!!int", "!!float":
		v, err := strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			return bad()
		}
		return v, nil
	case "!!str":
		num, per, ok := strings.Cut(n.Value, "/")
		if !ok {
			return bad()
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			return bad()
		}
		per = strings.TrimSpace(per)
		var p time.Duration
		switch per {
		case "s":
			p = time.Second
		case "m":
			p = time.Minute
		case "h":
			p = time.Hour
		case "d":
			p = 24 * time.Hour
		default:
			if p, ok = parseDuration(per); !ok || p <= 0 {
				return bad()
			}
		}
		return v / p.Seconds(), nil
	}
	return bad()
}

func (d *decoder) policy(n *yaml.Node) (*Policy, error) {
	p := &Policy{file: d.file, positions: map[string]pos{}}
	err := d.fields(n, "policy", p.positions, map[string]func(*yaml.Node) error{
		"version": func(v *yaml.Node) error {
			x, err := d.integer(v, "version")
			if err == nil && x != 1 {
				err = d.errAt(v, "version %d: this library reads version 1", x)
			}
			return err
		},
		"domain": func(v *yaml.Node) (err error) {
			p.Domain, err = d.str(v, "domain")
			return err
		},
		"unknown_domain": func(v *yaml.Node) error {
			s, err := d.str(v, "unknown_domain")
			p.UnknownDomain = UnknownDomain(s)
			if err == nil && !p.UnknownDomain.valid() {
				err = d.errAt(v, "unknown_domain %q: want reject or allow", s)
			}
			return err
		},
		"shadow": func(v *yaml.Node) (err error) {
			p.Shadow, err = d.boolean(v, "shadow")
			return err
		},
		"missing_key": func(v *yaml.Node) error {
			s, err := d.str(v, "missing_key")
			p.MissingKey = MissingKey(s)
			if err == nil && !p.MissingKey.valid() {
				err = d.errAt(v, "missing_key %q: want reject, shared or skip", s)
			}
			return err
		},
		"strict_tag": func(v *yaml.Node) (err error) {
			p.StrictTag, err = d.str(v, "strict_tag")
			return err
		},
		"default_tier": func(v *yaml.Node) (err error) {
			p.DefaultTier, err = d.str(v, "default_tier")
			return err
		},
		"tiers": func(v *yaml.Node) error {
			if err := d.kind(v, yaml.MappingNode, "tiers", "a mapping of tier names to quotas"); err != nil {
				return err
			}
			p.Tiers = make(map[string]Tier, len(v.Content)/2)
			for i := 0; i+1 < len(v.Content); i += 2 {
				k, tv := v.Content[i], v.Content[i+1]
				name, err := d.str(k, "tier name")
				if err != nil {
					return err
				}
				if _, dup := p.Tiers[name]; dup {
					return d.errAt(k, "tier %q given twice", name)
				}
				if !validName(name, 32) {
					return d.errAt(k, "tier %q: want a name of 1 to 32 bytes of [A-Za-z0-9_-]", name)
				}
				t, err := d.tier(tv, name)
				if err != nil {
					return err
				}
				t.positions[""] = pos{k.Line, k.Column}
				p.Tiers[name] = t
			}
			return nil
		},
		"rules": func(v *yaml.Node) error {
			if err := d.kind(v, yaml.SequenceNode, "rules", "a list of rules"); err != nil {
				return err
			}
			if len(v.Content) > MaxRules {
				return d.errAt(v, "rules: %d rules: at most %d", len(v.Content), MaxRules)
			}
			p.Rules = make([]Rule, len(v.Content))
			for i, rn := range v.Content {
				if err := d.rule(rn, i, &p.Rules[i]); err != nil {
					return err
				}
			}
			return nil
		},
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

func (d *decoder) tier(n *yaml.Node, name string) (Tier, error) {
	t := Tier{positions: map[string]pos{}}
	what := fmt.Sprintf("tier %q", name)
	quota := func(dst *int64, field string) func(*yaml.Node) error {
		return func(v *yaml.Node) error {
			x, err := d.integer(v, what+": "+field)
			if err == nil && x < 1 {
				err = d.errAt(v, "%s: %s %d: want at least 1 (leave it out for no quota)", what, field, x)
			}
			*dst = x
			return err
		}
	}
	err := d.fields(n, what, t.positions, map[string]func(*yaml.Node) error{
		"per_second": quota(&t.PerSecond, "per_second"),
		"per_minute": quota(&t.PerMinute, "per_minute"),
		"per_hour":   quota(&t.PerHour, "per_hour"),
		"per_day":    quota(&t.PerDay, "per_day"),
	})
	return t, err
}

func (d *decoder) rule(n *yaml.Node, i int, r *Rule) error {
	r.line, r.column = n.Line, n.Column
	r.positions = map[string]pos{}
	what := func() string {
		if r.ID != "" {
			return fmt.Sprintf("rule %q", r.ID)
		}
		return fmt.Sprintf("rules[%d]", i)
	}
	// Read the id first, so that messages about other fields can name the rule.
	if n.Kind == yaml.MappingNode {
		for j := 0; j+1 < len(n.Content); j += 2 {
			if n.Content[j].Value == "id" && n.Content[j+1].Kind == yaml.ScalarNode && n.Content[j+1].ShortTag() == "!!str" {
				r.ID = n.Content[j+1].Value
			}
		}
	}
	enabled := true
	err := d.fields(n, what(), r.positions, map[string]func(*yaml.Node) error{
		"id": func(v *yaml.Node) (err error) {
			r.ID, err = d.str(v, what()+": id")
			return err
		},
		"algorithm": func(v *yaml.Node) error {
			s, err := d.str(v, what()+": algorithm")
			r.Algorithm = Algorithm(s)
			if err == nil && !r.Algorithm.valid() {
				err = d.errAt(v, "%s: algorithm %q: want hybrid, token_bucket, gcra, fixed_window, sliding_window, sliding_log or upstream_window", what(), s)
			}
			return err
		},
		"dimensions": func(v *yaml.Node) (err error) {
			r.Dimensions, err = d.strList(v, what()+": dimensions")
			return err
		},
		"match": func(v *yaml.Node) error {
			return d.fields(v, what()+": match", nil, map[string]func(*yaml.Node) error{
				"routes": func(v *yaml.Node) (err error) {
					r.Match.Routes, err = d.strList(v, what()+": match: routes")
					return err
				},
				"methods": func(v *yaml.Node) (err error) {
					r.Match.Methods, err = d.strList(v, what()+": match: methods")
					return err
				},
				"tiers": func(v *yaml.Node) (err error) {
					r.Match.Tiers, err = d.strList(v, what()+": match: tiers")
					return err
				},
			})
		},
		"rate": func(v *yaml.Node) (err error) {
			r.Rate, err = d.rate(v, what()+": rate")
			if err == nil && !(r.Rate > 0) {
				err = d.errAt(v, "%s: rate %v: want a number above 0", what(), r.Rate)
			}
			return err
		},
		"burst": func(v *yaml.Node) (err error) {
			r.Burst, err = d.integer(v, what()+": burst")
			if err == nil && r.Burst < 1 {
				err = d.errAt(v, "%s: burst %d: want at least 1", what(), r.Burst)
			}
			return err
		},
		"limit": func(v *yaml.Node) (err error) {
			r.Limit, err = d.integer(v, what()+": limit")
			if err == nil && r.Limit < 1 {
				err = d.errAt(v, "%s: limit %d: want at least 1", what(), r.Limit)
			}
			return err
		},
		"period": func(v *yaml.Node) (err error) {
			if _, dup := r.positions["window"]; dup {
				return d.errAt(v, "%s: give period or window, not both", what())
			}
			r.Period, err = d.duration(v, what()+": period")
			return err
		},
		"window": func(v *yaml.Node) (err error) { // an alias of period, for window algorithms
			if _, dup := r.positions["period"]; dup {
				return d.errAt(v, "%s: give period or window, not both", what())
			}
			r.Period, err = d.duration(v, what()+": window")
			r.positions["period"] = pos{v.Line, v.Column}
			return err
		},
		"tiered": func(v *yaml.Node) (err error) {
			r.Tiered, err = d.boolean(v, what()+": tiered")
			return err
		},
		"cost": func(v *yaml.Node) error { return d.cost(v, what()+": cost", &r.Cost) },
		"on_failure": func(v *yaml.Node) error {
			s, err := d.str(v, what()+": on_failure")
			if err != nil {
				return err
			}
			switch s {
			case "local_fallback":
				r.OnFailure = outcome.LocalFallback
			case "fail_open":
				r.OnFailure = outcome.FailOpen
			case "fail_closed":
				r.OnFailure = outcome.FailClosed
			default:
				return d.errAt(v, "%s: on_failure %q: want local_fallback, fail_open or fail_closed", what(), s)
			}
			return nil
		},
		"enabled": func(v *yaml.Node) (err error) {
			enabled, err = d.boolean(v, what()+": enabled")
			return err
		},
		"shadow": func(v *yaml.Node) (err error) {
			r.Shadow, err = d.boolean(v, what()+": shadow")
			return err
		},
		"missing_key": func(v *yaml.Node) error {
			s, err := d.str(v, what()+": missing_key")
			r.MissingKey = MissingKey(s)
			if err == nil && !r.MissingKey.valid() {
				err = d.errAt(v, "%s: missing_key %q: want reject, shared or skip", what(), s)
			}
			return err
		},
	})
	r.Disabled = !enabled
	if err == nil && r.ID == "" {
		err = d.errAt(n, "%s: id is required", what())
	}
	return err
}

// cost parses `cost: 5`, `cost: {GET: 1, POST: 5, default: 2}` or `cost: {func: name}`.
func (d *decoder) cost(n *yaml.Node, what string, c *Cost) error {
	if n.Kind == yaml.ScalarNode {
		v, err := d.integer(n, what)
		if err == nil && v < 1 {
			err = d.errAt(n, "%s %d: want at least 1", what, v)
		}
		c.Fixed = v
		return err
	}
	if err := d.kind(n, yaml.MappingNode, what, "an integer, a mapping of methods to costs, or {func: name}"); err != nil {
		return err
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key, err := d.str(k, what+" key")
		if err != nil {
			return err
		}
		switch {
		case key == "func":
			if len(n.Content) != 2 {
				return d.errAt(k, "%s: func cannot be combined with per-method costs", what)
			}
			if c.FuncName, err = d.str(v, what+": func"); err != nil {
				return err
			}
			if c.FuncName == "" {
				return d.errAt(v, "%s: func: want a function name", what)
			}
		case key == "default":
			if c.Fixed != 0 {
				return d.errAt(k, "%s: default given twice", what)
			}
			if c.Fixed, err = d.integer(v, what+": default"); err != nil {
				return err
			}
			if c.Fixed < 1 {
				return d.errAt(v, "%s: default %d: want at least 1", what, c.Fixed)
			}
		default:
			m := strings.ToUpper(key)
			if m != key || m == "" || strings.ContainsAny(m, " \t") {
				return d.errAt(k, "%s: key %q: want an upper-case HTTP method, default or func", what, key)
			}
			if c.PerMethod == nil {
				c.PerMethod = map[string]int64{}
			}
			if _, dup := c.PerMethod[m]; dup {
				return d.errAt(k, "%s: method %s given twice", what, m)
			}
			x, err := d.integer(v, what+": "+m)
			if err != nil {
				return err
			}
			if x < 1 {
				return d.errAt(v, "%s: %s %d: want at least 1", what, m, x)
			}
			c.PerMethod[m] = x
		}
	}
	return nil
}
