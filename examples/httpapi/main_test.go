package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/internal/logtest"
	"github.com/hybridrate/hybridrate/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// serve runs the example service's handler on a real loopback listener and returns its base URL.
func serve(t *testing.T, cfg config, log io.Writer) string {
	t.Helper()
	svc, err := newService(cfg, slog.New(slog.NewTextHandler(log, nil)))
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: svc.Handler(), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
		assert.NoError(t, svc.Close(ctx))
	})
	return "http://" + ln.Addr().String()
}

// copyPolicy puts the example's policy in a temporary directory, where a test may edit it.
func copyPolicy(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("policy.yaml")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	require.NoError(t, os.WriteFile(path, data, 0o600))
	return path
}

func get(t *testing.T, c *http.Client, url, key string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	require.NoError(t, err)
	req.Header.Set("X-API-Key", key)
	req.Header.Set("X-Tenant", "acme")
	resp, err := c.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func TestBurstsGet429AndAWellBehavedClientSucceeds(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	// A generous sync timeout: on a loaded test machine the default 5ms can expire, and the failure
	// policy (local_fallback) would then admit on its own.
	base := serve(t, config{redisAddr: srv.Addr, policyPath: copyPolicy(t), reloadInterval: time.Second, maxInFlight: 512,
		checkTimeout: time.Second}, io.Discard)
	client := &http.Client{Timeout: 10 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	url := base + "/v1/items/42"

	// A burst of 20 concurrent requests: the items rule admits its burst of 5 (plus what refills at
	// 2 per second while the burst lasts), the rest get 429.
	type answer struct {
		code       int
		retryAfter string
		limit      string
	}
	answers := make([]answer, 20)
	var wg sync.WaitGroup
	burstStart := time.Now()
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := get(t, client, url, "burst-key")
			answers[i] = answer{resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("X-RateLimit-Limit")}
		}()
	}
	wg.Wait()
	burst := time.Since(burstStart)
	ok, denied := 0, 0
	for _, a := range answers {
		switch a.code {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
			denied++
			// Rate 2/s: the next token is at most 500ms away, so Retry-After is 1 second.
			assert.Equal(t, "1", a.retryAfter)
			assert.Equal(t, "5", a.limit, "the denying rule's limit")
		default:
			t.Errorf("unexpected status %d", a.code)
		}
	}
	refill := int(2 * burst.Seconds())
	assert.GreaterOrEqual(t, ok, 5, "the burst")
	assert.LessOrEqual(t, ok, 5+refill, "the burst, plus the refill during its %v", burst)
	assert.Equal(t, 20, ok+denied)
	t.Logf("burst of 20 in %v: %d admitted, %d refused", burst.Round(time.Millisecond), ok, denied)

	// The body names the rule.
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("X-API-Key", "burst-key")
	resp, err := client.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.JSONEq(t, `{"error":"rate_limit_exceeded","rule":"items","retry_after_seconds":1}`, string(body))

	// Honouring Retry-After is enough: the same request after the wait succeeds.
	secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	require.NoError(t, err)
	time.Sleep(time.Duration(secs) * time.Second)
	assert.Equal(t, http.StatusOK, get(t, client, url, "burst-key").StatusCode, "a request sent Retry-After later")

	// A well-behaved client that always honours Retry-After gets every one of its requests through,
	// at the rule's rate after its burst.
	start := time.Now()
	waits := 0
	for i := 0; i < 9; i++ {
		for {
			resp := get(t, client, url, "polite-key")
			if resp.StatusCode == http.StatusOK {
				break
			}
			require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
			secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
			require.NoError(t, err)
			require.Positive(t, secs)
			waits++
			require.Less(t, waits, 10, "too many refusals for a client that waits as told")
			time.Sleep(time.Duration(secs) * time.Second)
		}
	}
	elapsed := time.Since(start)
	t.Logf("9 requests, burst 5 then 2/s: %d waits, %v", waits, elapsed.Round(time.Millisecond))
	assert.GreaterOrEqual(t, waits, 1)
	assert.LessOrEqual(t, waits, 3, "each 1 s wait refills 2 tokens: 4 more requests need 2 waits (3 with timing slack)")
}

func TestHotReloadOverHTTP(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	path := copyPolicy(t)
	var log logtest.Buffer
	base := serve(t, config{redisAddr: srv.Addr, policyPath: path, reloadInterval: 10 * time.Millisecond, maxInFlight: 512}, &log)
	client := &http.Client{Timeout: 10 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	limit := func() string { return get(t, client, base+"/v1/items/1", "reload-key").Header.Get("X-RateLimit-Limit") }
	waitFor := func(cond func() bool, what string) {
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			require.False(t, time.Now().After(deadline), "within 5s: %s\nlog:\n%s", what, log.String())
			time.Sleep(10 * time.Millisecond)
		}
	}
	// The headers show the counter closest to its limit: the items rule's (burst 5). Once, in CI,
	// the first request's headers showed the per-hour counter's (1000): decisions made before the
	// limiter has read the ban list go to Redis (issue 23, item 6), and one that times out on a
	// loaded machine falls back with another remaining (the likely cause; not reproduced here).
	waitFor(func() bool { return limit() == "5" }, "the items rule's limit in the headers")

	orig, err := os.ReadFile(path)
	require.NoError(t, err)
	replace := func(content string) {
		tmp := path + ".tmp"
		require.NoError(t, os.WriteFile(tmp, []byte(content), 0o600))
		require.NoError(t, os.Rename(tmp, path))
	}
	// A valid change: the items burst goes from 5 to 50, without a restart.
	replace(strings.Replace(string(orig), "    rate: 2\n    burst: 5\n", "    rate: 2\n    burst: 50\n", 1))
	waitFor(func() bool { return limit() == "50" }, "the new burst in force")
	assert.Contains(t, log.String(), "policy reloaded")

	// An invalid change is logged with its line; the policy in force stays.
	replace(strings.Replace(string(orig), "    rate: 2\n    burst: 5\n", "    rate: 2\n    burst: many\n", 1))
	waitFor(func() bool { return strings.Contains(log.String(), "policy rejected") }, "the rejection logged")
	assert.Regexp(t, `policy\.yaml:\d+:12: rule \\"items\\": burst: want an integer, got \\"many\\"`, log.String())
	assert.Equal(t, "50", limit())
}

func TestEmbeddedRedisByDefault(t *testing.T) {
	t.Parallel()
	var log logtest.Buffer
	base := serve(t, config{policyPath: copyPolicy(t), reloadInterval: time.Second, maxInFlight: 512}, &log)
	assert.Contains(t, log.String(), "no -redis address given: using an embedded")
	client := &http.Client{Timeout: 10 * time.Second}
	t.Cleanup(client.CloseIdleConnections)

	resp, err := client.Get(base + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "health checks are not rate-limited")

	resp, err = client.Get(base + "/v1/items/1")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "the API needs a key")
	assert.JSONEq(t, `{"error":"missing_rate_limit_key","rule":"items"}`, string(body),
		"the first rule consulted that needs the key: the narrowest")

	req, _ := http.NewRequest("GET", base+"/v1/items/7", nil)
	req.Header.Set("X-API-Key", "demo-pro")
	resp, err = client.Do(req)
	require.NoError(t, err)
	var item struct {
		ID     string           `json:"id"`
		Limits map[string]int64 `json:"limits"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&item))
	resp.Body.Close()
	assert.Equal(t, "7", item.ID)
	assert.Equal(t, int64(599), item.Limits["per-key.minute"], fmt.Sprint("the pro plan, from the context: ", item.Limits))
}

func TestRunServesUntilCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan string, 1)
	errc := make(chan error, 1)
	var log logtest.Buffer
	go func() {
		errc <- run(ctx, config{addr: "127.0.0.1:0", policyPath: copyPolicy(t), reloadInterval: time.Second, maxInFlight: 8}, &log,
			func(addr string) { addrc <- addr })
	}()
	addr := <-addrc
	resp, err := http.Get("http://" + addr + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	http.DefaultClient.CloseIdleConnections()
	cancel()
	require.NoError(t, <-errc)

	err = run(context.Background(), config{addr: "127.0.0.1:0", policyPath: filepath.Join(t.TempDir(), "none.yaml")}, io.Discard, nil)
	assert.ErrorContains(t, err, "none.yaml")
}
