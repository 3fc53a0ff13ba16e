package dashboard_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/hybridrate/hybridrate/dashboard"
	"github.com/hybridrate/hybridrate/hybrid"
	"github.com/hybridrate/hybridrate/observe"
	"github.com/hybridrate/hybridrate/policy"
)

var (
	screenshot = flag.String("screenshot", "", "write the dashboard's screenshot to this PNG file (e.g. ../docs/img/dashboard.png)")
	traffic    = flag.Duration("traffic", 2*time.Second, "how long traffic runs before the page is checked")
)

// chromium returns the path of Debian's chromium, or skips the test (fails it when CI is "true").
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "chromium not found in PATH: install it (apt-get install -y chromium) to run the browser test"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// cdp is a minimal Chrome DevTools Protocol client over --remote-debugging-pipe: NUL-terminated
// JSON messages, commands written to the browser's fd 3, answers and events read from its fd 4.
type cdp struct {
	w       io.Writer
	mu      sync.Mutex // guards pending and next
	next    int
	pending map[int]chan cdpReply
}

type cdpReply struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Message string `json:"message"`
	} `json:"error"`
}

func newCDP(w io.Writer, r io.Reader) *cdp {
	c := &cdp{w: w, pending: map[int]chan cdpReply{}}
	go func() {
		br := bufio.NewReader(r)
		for {
			msg, err := br.ReadBytes(0)
			if err != nil {
				return
			}
			var m struct {
				ID int `json:"id"`
				cdpReply
			}
			if json.Unmarshal(msg[:len(msg)-1], &m) != nil || m.ID == 0 {
				continue // an event
			}
			c.mu.Lock()
			ch := c.pending[m.ID]
			delete(c.pending, m.ID)
			c.mu.Unlock()
			if ch != nil {
				ch <- m.cdpReply
			}
		}
	}()
	return c
}

// call sends one command (to a page session when session is set) and decodes its result into out.
func (c *cdp) call(ctx context.Context, session, method string, params any, out any) error {
	c.mu.Lock()
	c.next++
	id := c.next
	ch := make(chan cdpReply, 1)
	c.pending[id] = ch
	c.mu.Unlock()
	msg := map[string]any{"id": id, "method": method, "params": params}
	if session != "" {
		msg["sessionId"] = session
	}
	b, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	if _, err := c.w.Write(append(b, 0)); err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	select {
	case r := <-ch:
		if r.Error != nil {
			return fmt.Errorf("%s: %s", method, r.Error.Message)
		}
		if out != nil {
			return json.Unmarshal(r.Result, out)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", method, ctx.Err())
	}
}

// eval evaluates a JavaScript expression in the page and returns its value as a string.
func (c *cdp) eval(ctx context.Context, session, expr string) (string, error) {
	var r struct {
		Result struct {
			Value any `json:"value"`
		} `json:"result"`
		ExceptionDetails any `json:"exceptionDetails"`
	}
	if err := c.call(ctx, session, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true}, &r); err != nil {
		return "", err
	}
	if r.ExceptionDetails != nil {
		return "", fmt.Errorf("evaluate %q: %v", expr, r.ExceptionDetails)
	}
	if r.Result.Value == nil {
		return "", nil
	}
	return fmt.Sprint(r.Result.Value), nil
}

const browserPolicy = `
version: 1
default_tier: free
tiers:
  free: {per_minute: 120}
  pro:  {per_minute: 6000}
rules:
  - id: per-key
    dimensions: [api_key]
    rate: 5
    burst: 10
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

// requestsTotal sums hybridrate.requests points with the given outcome, read through the SDK.
func requestsTotal(t *testing.T, reader *sdkmetric.ManualReader, outcome string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "hybridrate.requests" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				if v, ok := dp.Attributes.Value(attribute.Key("outcome")); ok && v.AsString() == outcome {
					n += dp.Value
				}
			}
		}
	}
	return n
}

// TestDashboardInChromium loads the dashboard in a real headless Chromium while traffic runs, then
// checks that the numbers it shows are the metrics' (read through the OTel SDK), and takes a
// screenshot (-screenshot FILE).
func TestDashboardInChromium(t *testing.T) {
	bin := chromium(t)
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	enf, err := policy.NewEnforcer(policy.Config{Redis: rdb, StrictTimeout: time.Second, HybridOptions: []hybrid.Option{
		hybrid.WithCheckTimeout(time.Second), hybrid.WithMeterProvider(mp), hybrid.WithInstance("demo-pod-1")}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = enf.Close(context.Background()) })
	obs, err := observe.New(enf, observe.Config{MeterProvider: mp, Instance: "demo-pod-1"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = obs.Close() })
	p, err := policy.Parse([]byte(browserPolicy), "browser.yaml")
	require.NoError(t, err)
	require.NoError(t, obs.SetPolicy(p))
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

	// The browser, driven over a pipe.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	toBrowser, browserIn, err := os.Pipe()
	require.NoError(t, err)
	browserOut, fromBrowser, err := os.Pipe()
	require.NoError(t, err)
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
		"--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+t.TempDir(), "--remote-debugging-pipe", "--window-size=1280,1250",
		"--hide-scrollbars", "about:blank")
	cmd.ExtraFiles = []*os.File{toBrowser, fromBrowser} // the browser's fd 3 (commands) and fd 4 (answers)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	toBrowser.Close()
	fromBrowser.Close()
	t.Cleanup(func() {
		browserIn.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		browserOut.Close()
	})
	c := newCDP(browserIn, browserOut)

	var created struct {
		TargetID string `json:"targetId"`
	}
	require.NoError(t, c.call(ctx, "", "Target.createTarget", map[string]any{"url": "about:blank"}, &created), "chromium: %s", &stderr)
	var attached struct {
		SessionID string `json:"sessionId"`
	}
	require.NoError(t, c.call(ctx, "", "Target.attachToTarget", map[string]any{"targetId": created.TargetID, "flatten": true}, &attached))
	s := attached.SessionID
	require.NoError(t, c.call(ctx, s, "Emulation.setDeviceMetricsOverride",
		map[string]any{"width": 1280, "height": 1250, "deviceScaleFactor": 1, "mobile": false}, nil))
	require.NoError(t, c.call(ctx, s, "Page.navigate", map[string]any{"url": srv.URL + "/dashboard/?span=60"}, nil))

	// While traffic runs, the page updates with it.
	waitFor := func(what, expr string, ok func(string) bool) string {
		t.Helper()
		var last string
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			v, err := c.eval(ctx, s, expr)
			if err == nil && ok(v) {
				return v
			}
			last = fmt.Sprint(v, err)
		}
		t.Fatalf("%s: %s is %q", what, expr, last)
		return ""
	}
	num := func(v string) int64 {
		n, _ := strconv.ParseInt(strings.ReplaceAll(v, ",", ""), 10, 64)
		return n
	}
	waitFor("the page shows live checks", `document.getElementById("sum-checks").textContent`,
		func(v string) bool { return num(v) > 0 })
	time.Sleep(*traffic)
	live, err := c.eval(ctx, s, `document.getElementById("rate-checks").textContent`)
	require.NoError(t, err)
	assert.NotEqual(t, "0.0", live, "checks per second while traffic runs")
	stop.Store(true)
	wg.Wait()
	stoppedAt := time.Now()

	// Once traffic stopped, the page settles on exactly the metrics' numbers.
	denied := requestsTotal(t, reader, "denied")
	allowed := requestsTotal(t, reader, "allowed") + requestsTotal(t, reader, "shadow_denied")
	require.Positive(t, denied, "the abusers were denied")
	waitFor("a refresh after the traffic stopped", `document.body.dataset.updated`, func(v string) bool {
		at, err := time.Parse(time.RFC3339Nano, v)
		return err == nil && at.After(stoppedAt)
	})
	waitFor("denied since start", `document.getElementById("total-denied").textContent`,
		func(v string) bool { return num(v) == denied })
	waitFor("denied in span", `document.getElementById("sum-denied").textContent`,
		func(v string) bool { return num(v) == denied })
	checks, err := c.eval(ctx, s, `document.getElementById("sum-checks").textContent`)
	require.NoError(t, err)
	assert.Equal(t, allowed+denied, num(checks), "checks in span")
	shadow, err := c.eval(ctx, s, `document.getElementById("sum-shadow").textContent`)
	require.NoError(t, err)
	assert.Equal(t, requestsTotal(t, reader, "shadow_denied"), num(shadow), "shadow would-deny")

	// The tables agree with the window the metrics were counted in.
	snap := obs.Snapshot(time.Minute)
	rows, err := c.eval(ctx, s, `document.querySelectorAll("#denied tbody tr").length`)
	require.NoError(t, err)
	assert.Equal(t, strconv.Itoa(len(snap.Denied)), rows)
	first, err := c.eval(ctx, s, `Array.from(document.querySelectorAll("#denied tbody tr:first-child td")).slice(0,4).map(td => td.textContent).join("|")`)
	require.NoError(t, err)
	d := snap.Denied[0]
	rule := d.Rule
	if d.Shadow {
		rule += " (shadow)"
	}
	assert.Equal(t, fmt.Sprintf("%s|%s|%s|%d", d.Route, rule, d.Tier, d.N), strings.ReplaceAll(first, ",", ""))
	key, err := c.eval(ctx, s, `document.querySelector("#keys tbody td.key").textContent`)
	require.NoError(t, err)
	assert.Equal(t, snap.TopKeys[0].Key, key)
	assert.NotContains(t, key, "abuser", "keys are hashed")
	badge, err := c.eval(ctx, s, `document.getElementById("redis").textContent`)
	require.NoError(t, err)
	assert.Contains(t, badge, "Redis OK")
	paths, err := c.eval(ctx, s, `document.querySelectorAll("#health tbody tr").length`)
	require.NoError(t, err)
	assert.Equal(t, "2", paths, "the hybrid limiter and the strict client")
	svgPaths, err := c.eval(ctx, s, `document.querySelectorAll("#chart path").length`)
	require.NoError(t, err)
	assert.Equal(t, "3", svgPaths, "the chart's three series")

	var shot struct {
		Data string `json:"data"`
	}
	require.NoError(t, c.call(ctx, s, "Page.captureScreenshot", map[string]any{"format": "png"}, &shot))
	png, err := base64.StdEncoding.DecodeString(shot.Data)
	require.NoError(t, err)
	require.True(t, len(png) > 8 && string(png[1:4]) == "PNG", "a PNG")
	out := *screenshot
	if out == "" {
		out = t.TempDir() + "/dashboard.png"
	}
	require.NoError(t, os.WriteFile(out, png, 0o644))
	t.Logf("screenshot: %s (%d bytes); denied %d of %d checks", out, len(png), denied, allowed+denied)
	if err := c.call(ctx, "", "Browser.close", map[string]any{}, nil); err != nil && !errors.Is(err, io.EOF) {
		t.Logf("Browser.close: %v", err)
	}
}
