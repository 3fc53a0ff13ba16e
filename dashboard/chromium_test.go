package dashboard_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/hybridrate/hybridrate/dashboard"
	"github.com/hybridrate/hybridrate/internal/browsertest"
	"github.com/hybridrate/hybridrate/policy"
	"github.com/hybridrate/hybridrate/policy/policytest"
)

var (
	screenshot = flag.String("screenshot", "", "write the dashboard's screenshot to this PNG file (e.g. ../docs/img/dashboard.png)")
	traffic    = flag.Duration("traffic", 2*time.Second, "how long traffic runs before the page is checked")
)

const browserPolicy = `
version: 1
default_tier: free
tiers:
  free: {per_minute: 120}
  pro:  {per_minute: 6000}
rules:
  - id: per-key
    dimensions: [api_key]
    rate: 2
    burst: 5
  - id: plan
    dimensions: [api_key]
    tiered: true
  - id: exports
    algorithm: gcra
    dimensions: [api_key]
    match: {routes: ["POST /v1/exports"]}
    limit: 30
    period: 1m
  - id: search-trial
    dimensions: [api_key]
    match: {routes: ["GET /v1/search"]}
    rate: 1
    burst: 2
    shadow: true
`

// TestDashboardInChromium loads the dashboard in a real headless Chromium while traffic runs, then
// checks that the numbers it shows are the metrics' (read through the OTel SDK), and takes a
// screenshot (-screenshot FILE).
func TestDashboardInChromium(t *testing.T) {
	browsertest.Binary(t)
	obs, _, metrics := policytest.Observed(t, "demo-pod-1", browserPolicy, "browser.yaml")
	srv := httptest.NewServer(http.StripPrefix("/dashboard", dashboard.Handler(obs)))
	t.Cleanup(srv.Close)

	// Traffic: a few abusive keys over their limits, honest ones under, on three routes and two tiers.
	var stop atomic.Bool
	var wg sync.WaitGroup
	routes := []string{"GET /v1/items/{id}", "GET /v1/search", "POST /v1/exports"}
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				key, tier := "honest-"+strconv.Itoa(i%50), "pro"
				if i%3 == 0 {
					key, tier = "abuser-"+strconv.Itoa(i%4+g*4), "free"
				}
				route := routes[i%len(routes)]
				method := strings.Fields(route)[0]
				_, err := obs.Check(context.Background(), &policy.Request{Method: method, Tier: tier,
					Dims: policy.Values{"api_key": key, "route": route}})
				if err != nil {
					t.Errorf("check: %v", err)
					return
				}
				time.Sleep(2 * time.Millisecond) // ~400 checks/s per goroutine: a readable chart
			}
		}()
	}
	t.Cleanup(func() { stop.Store(true); wg.Wait() })

	// The browser.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	page := browsertest.Start(ctx, t, 1280, 1250)
	require.NoError(t, page.Navigate(ctx, srv.URL+"/dashboard/?span=60"))

	// While traffic runs, the page updates with it.
	waitFor := func(what, expr string, ok func(string) bool) string {
		t.Helper()
		return page.WaitFor(ctx, t, 15*time.Second, what, expr, ok)
	}
	num := func(v string) int64 {
		n, _ := strconv.ParseInt(strings.ReplaceAll(v, ",", ""), 10, 64)
		return n
	}
	waitFor("the page shows live checks", `document.getElementById("sum-checks").textContent`,
		func(v string) bool { return num(v) > 0 })
	// However slow this run is (a loaded machine, -race), one abuser goes past its burst for sure.
	for i, deniedOnce := 0, false; !deniedOnce; i++ {
		require.Less(t, i, 100, "abuser-x was never denied")
		res, err := obs.Check(context.Background(), &policy.Request{Method: "GET", Tier: "free",
			Dims: policy.Values{"api_key": "abuser-x", "route": "GET /v1/items/{id}"}})
		require.NoError(t, err)
		deniedOnce = !res.Allowed
	}
	time.Sleep(*traffic)
	live, err := page.Eval(ctx, `document.getElementById("rate-checks").textContent`)
	require.NoError(t, err)
	assert.NotEqual(t, "0.0", live, "checks per second while traffic runs")
	stop.Store(true)
	wg.Wait()
	stoppedAt := time.Now()

	// Once traffic stopped, the page settles on exactly the metrics' numbers.
	requests := func(t *testing.T, outcome string) int64 { // hybridrate.requests, read through the SDK
		t.Helper()
		return metrics.Sum(t, "hybridrate.requests", attribute.String("outcome", outcome))
	}
	denied := requests(t, "denied")
	allowed := requests(t, "allowed") + requests(t, "shadow_denied")
	require.Positive(t, denied, "the abusers were denied (%d checks admitted; window: %+v)", allowed, obs.Snapshot(time.Minute).Sum)
	waitFor("a refresh after the traffic stopped", `document.body.dataset.updated`, func(v string) bool {
		at, err := time.Parse(time.RFC3339Nano, v)
		return err == nil && at.After(stoppedAt)
	})
	waitFor("denied since start", `document.getElementById("total-denied").textContent`,
		func(v string) bool { return num(v) == denied })
	waitFor("denied in span", `document.getElementById("sum-denied").textContent`,
		func(v string) bool { return num(v) == denied })
	checks, err := page.Eval(ctx, `document.getElementById("sum-checks").textContent`)
	require.NoError(t, err)
	assert.Equal(t, allowed+denied, num(checks), "checks in span")
	shadow, err := page.Eval(ctx, `document.getElementById("sum-shadow").textContent`)
	require.NoError(t, err)
	assert.Equal(t, requests(t, "shadow_denied"), num(shadow), "shadow would-deny")

	// The tables agree with the window the metrics were counted in.
	snap := obs.Snapshot(time.Minute)
	rows, err := page.Eval(ctx, `document.querySelectorAll("#denied tbody tr").length`)
	require.NoError(t, err)
	assert.Equal(t, strconv.Itoa(len(snap.Denied)), rows)
	first, err := page.Eval(ctx, `Array.from(document.querySelectorAll("#denied tbody tr:first-child td")).slice(0,4).map(td => td.textContent).join("|")`)
	require.NoError(t, err)
	d := snap.Denied[0]
	rule := d.Rule
	if d.Shadow {
		rule += " (shadow)"
	}
	assert.Equal(t, fmt.Sprintf("%s|%s|%s|%d", d.Route, rule, d.Tier, d.N), strings.ReplaceAll(first, ",", ""))
	key, err := page.Eval(ctx, `document.querySelector("#keys tbody td.key").textContent`)
	require.NoError(t, err)
	assert.Equal(t, snap.TopKeys[0].Key, key)
	assert.NotContains(t, key, "abuser", "keys are hashed")
	badge, err := page.Eval(ctx, `document.getElementById("redis").textContent`)
	require.NoError(t, err)
	assert.Contains(t, badge, "Redis OK")
	paths, err := page.Eval(ctx, `document.querySelectorAll("#health tbody tr").length`)
	require.NoError(t, err)
	assert.Equal(t, "2", paths, "the hybrid limiter and the strict client")
	svgPaths, err := page.Eval(ctx, `document.querySelectorAll("#chart path").length`)
	require.NoError(t, err)
	assert.Equal(t, "3", svgPaths, "the chart's three series")

	png, err := page.Screenshot(ctx)
	require.NoError(t, err)
	out := *screenshot
	if out == "" {
		out = t.TempDir() + "/dashboard.png"
	}
	require.NoError(t, os.WriteFile(out, png, 0o644))
	t.Logf("screenshot: %s (%d bytes); denied %d of %d checks", out, len(png), denied, allowed+denied)
	if err := page.Close(ctx); err != nil && !errors.Is(err, io.EOF) {
		t.Logf("Browser.close: %v", err)
	}
}
