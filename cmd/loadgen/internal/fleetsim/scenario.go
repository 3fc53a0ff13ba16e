package fleetsim

import (
	"fmt"
	"strings"

	"github.com/hybridrate/hybridrate/cmd/loadgen/internal/workload"
)

// Scenario is one workload of the simulator: the keys, their limit, how much each is asked for and
// how the requests spread over the nodes. Every scenario runs at the library's defaults.
type Scenario struct {
	Name  string
	About string // one line for the report
	Keys  int
	Rate  float64 // the limit of every key: Rate tokens/s, Burst tokens
	Burst int64
	// Load is each key's demand as a multiple of Rate (uniform keys); with RPS > 0 it is unused and
	// the requests, RPS a second in all, pick their keys by Pattern.
	Load    float64
	RPS     float64
	Pattern workload.Pattern
	ZipfS   float64
	// Affinity is the share of a key's requests that go to its home node (key number mod nodes);
	// the rest go to a node drawn at random.
	Affinity float64
	// Moving sends every request of the first half of the run to the first half of the nodes, and
	// every request of the second half to the other nodes: a key's demand moves from one node set
	// to another.
	Moving bool
}

// totalRPS is the scenario's request rate over all keys and nodes.
func (s Scenario) totalRPS() float64 {
	if s.RPS > 0 {
		return s.RPS
	}
	return s.Load * s.Rate * float64(s.Keys)
}

// Scenarios are the workloads of issue 21, at the library's defaults: issue 10's key mix (hot,
// sparse, sticky, Zipf, 4× overload, churn) with the per-user limits of issue 21's table (medium,
// overload), small per-user bursts, and a key whose demand moves.
var Scenarios = []Scenario{
	{Name: "hot", About: "24 keys, 1500/s, burst 300, 0.8× the limit", Keys: 24, Rate: 1500, Burst: 300, Load: 0.8},
	{Name: "medium", About: "per-user keys: 300 keys, 50/s, burst 60, 0.7×", Keys: 300, Rate: 50, Burst: 60, Load: 0.7},
	{Name: "sparse", About: "2,000 keys, 10/s, burst 20, 0.5×", Keys: 2000, Rate: 10, Burst: 20, Load: 0.5},
	{Name: "sticky", About: "sparse, 90% of each key's requests on its home node", Keys: 2000, Rate: 10, Burst: 20,
		Load: 0.5, Affinity: 0.9},
	{Name: "zipf", About: "2,000 keys, 10/s, burst 20, Zipf s=1.1, 10,000 req/s (0.5× the sum of the limits)",
		Keys: 2000, Rate: 10, Burst: 20, RPS: 10000, Pattern: workload.Zipf, ZipfS: 1.1},
	{Name: "overload", About: "150 keys, 80/s, burst 80, 4× the limit", Keys: 150, Rate: 80, Burst: 80, Load: 4},
	{Name: "churn", About: "new keys: 4,000 req/s over 100,000 keys (10/s, burst 20), 4 hot keys take 10%",
		Keys: 100000, Rate: 10, Burst: 20, RPS: 4000, Pattern: workload.Churn},
	{Name: "moving", About: "50 keys, 100/s, burst 100, 0.8×, moving from half the nodes to the other half at T/2",
		Keys: 50, Rate: 100, Burst: 100, Load: 0.8, Moving: true},
	{Name: "small", About: "small per-user bursts: 3,000 keys, 5/s, burst 10, 0.7×", Keys: 3000, Rate: 5, Burst: 10,
		Load: 0.7},
}

// ScenarioNames lists the scenarios' names, in order.
func ScenarioNames() []string {
	out := make([]string, len(Scenarios))
	for i, s := range Scenarios {
		out[i] = s.Name
	}
	return out
}

// Pick returns the scenarios named in list (comma-separated; "all" or "" for every one).
func Pick(list string) ([]Scenario, error) {
	if list == "" || list == "all" {
		return Scenarios, nil
	}
	var out []Scenario
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		found := false
		for _, s := range Scenarios {
			if s.Name == name {
				out = append(out, s)
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("fleet scenario %q: want one of %s", name, strings.Join(ScenarioNames(), ", "))
		}
	}
	return out, nil
}
