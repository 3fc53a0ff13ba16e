package fleetsim

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestArrivals: a scenario's requests have the same keys and times at every fleet size (only the
// nodes differ), come at about the scenario's rate, stay on nodes in range, and the moving scenario
// sends the first half of the run to the first half of the nodes and the rest to the others.
func TestArrivals(t *testing.T) {
	s, err := Pick("moving")
	if err != nil {
		t.Fatal(err)
	}
	const d = 4 * time.Second
	a8, err := arrivals(s[0], 8, d, 3)
	if err != nil {
		t.Fatal(err)
	}
	a64, err := arrivals(s[0], 64, d, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(a8) != len(a64) {
		t.Fatalf("%d requests on 8 nodes, %d on 64", len(a8), len(a64))
	}
	want := s[0].totalRPS() * d.Seconds()
	if n := float64(len(a8)); n < 0.9*want || n > 1.1*want {
		t.Errorf("%v requests, want about %v", n, want)
	}
	for i := range a8 {
		if a8[i].at != a64[i].at || a8[i].key != a64[i].key {
			t.Fatalf("request %d differs: %+v on 8 nodes, %+v on 64", i, a8[i], a64[i])
		}
		for _, c := range []struct {
			a arrival
			n int32
		}{{a8[i], 8}, {a64[i], 64}} {
			first := c.a.at < int64(d)/2
			if c.a.node < 0 || c.a.node >= c.n || first != (c.a.node < c.n/2) {
				t.Fatalf("request %d at %v on node %d of %d: the moving scenario's halves are mixed", i, c.a.at, c.a.node, c.n)
			}
		}
	}
}

func TestPick(t *testing.T) {
	all, err := Pick("all")
	if err != nil || len(all) != len(Scenarios) {
		t.Fatalf("Pick(all) = %d scenarios, %v", len(all), err)
	}
	two, err := Pick("hot, zipf")
	if err != nil || len(two) != 2 || two[1].Name != "zipf" {
		t.Fatalf("Pick(hot, zipf) = %+v, %v", two, err)
	}
	if _, err := Pick("hot,nope"); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("Pick of an unknown scenario: %v", err)
	}
}

// TestOutputs: the table, CSV and every chart are written for a small set of results, with a
// row per result and a line per scenario.
func TestOutputs(t *testing.T) {
	rs := []Result{
		{Scenario: "hot", Nodes: 8, Local: 1, CPURatio: 0.01, WorstKey: 0.8, P99us: 1},
		{Scenario: "hot", Nodes: 64, Local: 0.99, CPURatio: 0.02, WorstKey: 0.8, P99us: 2},
		{Scenario: "zipf", Nodes: 8, Local: 0.98, CPURatio: 0.1, WorstKey: 1.05, P99us: 3},
		{Scenario: "zipf", Nodes: 64, Local: 0.5, CPURatio: 0.6, WorstKey: 0.99, P99us: 150},
	}
	var b bytes.Buffer
	if err := WriteTable(&b, Meta{Duration: time.Second}, rs); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(b.String(), "\n| "); got != 1+len(rs) {
		t.Errorf("table: %d rows, want a header and %d:\n%s", got, len(rs), b.String())
	}
	b.Reset()
	if err := WriteCSV(&b, Meta{}, rs); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(b.String(), "\n"); got != 1+len(rs) {
		t.Errorf("CSV: %d lines, want %d", got, 1+len(rs))
	}
	for _, ch := range Charts {
		b.Reset()
		if err := WriteSVG(&b, ch, rs); err != nil {
			t.Fatal(err)
		}
		svg := b.String()
		if !strings.HasPrefix(svg, "<svg") || strings.Count(svg, "<polyline") != 2 || strings.Contains(svg, "NaN") {
			t.Errorf("%s: not an SVG with a line per scenario:\n%s", ch.File, svg)
		}
	}
}
