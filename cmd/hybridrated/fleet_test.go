package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridrate/hybridrate/internal/browsertest"
	"github.com/hybridrate/hybridrate/internal/logtest"
	"github.com/hybridrate/hybridrate/internal/redistest"
)

var fleetScreenshot = flag.String("fleet-screenshot", "", "write the fleet dashboard's screenshot to this PNG file")

// fleetPolicy's rule is exact across instances (a strict GCRA in Redis), so that each instance's
// denials are known.
const fleetPolicy = `
version: 1
rules:
  - id: per-key
    algorithm: gcra
    dimensions: [api_key]
    limit: 3
    period: 1m
`

// sidecarProcess is one hybridrated process started by startProcess.
type sidecarProcess struct {
	cmd    *exec.Cmd
	base   string // http://host:port
	grpc   string // host:port
	stderr *logtest.Buffer
	exited chan error
}

// startProcess runs bin with args (and env added to the test's environment), JSON logs, and waits
// for its serving line.
func startProcess(t testing.TB, bin string, env []string, args ...string) *sidecarProcess {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"-grpc", "127.0.0.1:0", "-http", "127.0.0.1:0", "-log-format", "json"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	p := &sidecarProcess{cmd: cmd, stderr: &logtest.Buffer{}, exited: make(chan error, 1)}
	cmd.Stderr = p.stderr
	require.NoError(t, cmd.Start())
	go func() { p.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-p.exited
		}
	})
	require.Eventually(t, func() bool {
		sc := bufio.NewScanner(strings.NewReader(p.stderr.String()))
		for sc.Scan() {
			var line struct{ Msg, HTTP, GRPC string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "hybridrated serving" {
				p.base, p.grpc = "http://"+line.HTTP, line.GRPC
				return true
			}
		}
		return false
	}, 20*time.Second, 20*time.Millisecond, "the serving line: %s", p.stderr)
	return p
}

// TestFleetDashboardInChromium runs two hybridrated processes on one real redis-server and loads
// one's dashboard in headless Chromium: the fleet view lists both instances and both instances'
// denials, per rule and per subject; a subject denied on both has one id (the shared
// HYBRIDRATED_DASHBOARD_HASH_KEY) and its denials added up; its readable value shows only where
// that instance saw it (-dashboard-reveal), and never reaches Redis; an instance that stops leaves
// the view (issue 23, item 8).
func TestFleetDashboardInChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary, and a browser")
	}
	browsertest.Binary(t) // skip (or fail under CI) before building anything
	srv := redistest.Start(t)
	bin := buildBinary(t)
	path := writePolicy(t, t.TempDir(), fleetPolicy)
	env := []string{"HYBRIDRATED_DASHBOARD_HASH_KEY=fleet-wide-secret", "HYBRIDRATED_DASHBOARD_REVEAL=100"}
	// -check-timeout also bounds the strict rule's calls (50ms by default): on a loaded machine a
	// call that timed out was answered by the rule's failure policy, and alice got a fourth
	// admission (CI, load average 19).
	common := []string{"-redis", srv.Addr, "-policy", path, "-fleet-interval", "500ms", "-shutdown-grace", "0s", "-check-timeout", "5s"}
	a := startProcess(t, bin, env, append(common, "-instance", "pod-a")...)
	b := startProcess(t, bin, env, append(common, "-instance", "pod-b")...)

	// alice: 10 on pod-a (3 admitted, 7 denied) then 4 on pod-b (one limit in Redis: 4 denied);
	// bob: 8 on pod-b (3 admitted, 5 denied).
	require.Equal(t, 3, admitted(t, a.base, "alice", 10))
	require.Equal(t, 0, admitted(t, b.base, "alice", 4))
	require.Equal(t, 3, admitted(t, b.base, "bob", 8))

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	page := browsertest.Start(ctx, t, 1280, 1500)
	require.NoError(t, page.Navigate(ctx, a.base+"/dashboard/?span=60"))
	wait := func(what, expr string, ok func(string) bool) string {
		t.Helper()
		return page.WaitFor(ctx, t, 20*time.Second, what, expr, ok)
	}
	is := func(want string) func(string) bool { return func(v string) bool { return v == want } }
	cells := func(table string) string { // a table's rows, cells joined by "|", rows by "\n"
		return `Array.from(document.querySelectorAll("#` + table + ` tbody tr")).map(tr => ` +
			`Array.from(tr.cells).map(td => td.textContent).join("|")).join("\n")`
	}

	wait("both instances in the fleet view", `document.querySelectorAll("#instances tbody tr").length`, is("2"))
	wait("each instance's denials", `Array.from(document.querySelectorAll("#instances tbody tr")).map(tr => tr.cells[0].textContent + "=" + tr.cells[4].textContent).join(",")`,
		is("pod-a (this one)=7,pod-b=9"))
	wait("the fleet's per-rule denials", cells("fleet-rules"), func(v string) bool {
		c := strings.Split(v, "|")
		return len(c) == 4 && c[0] == "per-key" && c[2] == "16"
	})
	assert.Equal(t, "1", must(page.Eval(ctx, `document.querySelectorAll("#fleet-rules tbody svg.spark path").length`)),
		"a trend line")
	subjects := wait("the fleet's subjects, added up across instances", cells("fleet-subjects"), func(v string) bool {
		return len(strings.Split(v, "\n")) == 2
	})
	rows := strings.Split(subjects, "\n")
	alice, bob := strings.Split(rows[0], "|"), strings.Split(rows[1], "|")
	require.Len(t, alice, 5, subjects)
	assert.Equal(t, []string{"api_key=alice", "per-key", "11", "pod-a, pod-b"}, alice[1:], "one id on both instances; pod-a saw alice")
	assert.Regexp(t, `^[0-9a-f]{16}$`, alice[0], "a hashed id")
	assert.Equal(t, []string{"", "per-key", "5", "pod-b"}, bob[1:], "pod-a never saw bob: no readable value here")

	// One instance: pod-b's own rules and subjects.
	_, err := page.Eval(ctx, `document.querySelector("#instances tbody tr:nth-child(2)").click()`)
	require.NoError(t, err)
	wait("pod-b selected", `document.getElementById("fleet-scope").textContent`, is("pod-b"))
	wait("pod-b's subjects", cells("fleet-subjects"), func(v string) bool {
		return strings.Contains(v, "|per-key|5|pod-b") && strings.Contains(v, "|api_key=alice|per-key|4|pod-b")
	})
	wait("pod-b's rule", cells("fleet-rules"), func(v string) bool { return strings.HasPrefix(v, "per-key|") && strings.Split(v, "|")[2] == "9" })
	// This instance's own view, with its per-rule trend.
	wait("pod-a's own per-rule trend", cells("rules"), func(v string) bool { return strings.HasPrefix(v, "per-key|") && strings.Split(v, "|")[2] == "7" })
	assert.Contains(t, must(page.Eval(ctx, cells("keys"))), "|per-key|7|api_key=alice")

	png, err := page.Screenshot(ctx)
	require.NoError(t, err)
	shot := *fleetScreenshot
	if shot == "" {
		shot = filepath.Join(t.TempDir(), "fleet.png")
	}
	require.NoError(t, os.WriteFile(shot, png, 0o644))
	t.Logf("screenshot: %s", shot)

	// pod-b's dashboard reveals bob, whom it saw.
	require.NoError(t, page.Navigate(ctx, b.base+"/dashboard/"))
	wait("bob, readable where he was denied", cells("fleet-subjects"), func(v string) bool {
		return strings.Contains(v, "|api_key=bob|per-key|5|pod-b")
	})

	// What Redis holds: one index and one report per instance, with TTLs, small, and no raw key.
	rdb := srv.Client(t)
	keys, err := rdb.Keys(ctx, "hr:v3:x:{dashboard}*").Result()
	require.NoError(t, err)
	assert.Len(t, keys, 3, "%q", keys)
	for _, k := range keys {
		ttl, err := rdb.PTTL(ctx, k).Result()
		require.NoError(t, err)
		assert.Positive(t, ttl, k)
		if k == "hr:v3:x:{dashboard}" {
			continue
		}
		v, err := rdb.Get(ctx, k).Result()
		require.NoError(t, err)
		assert.Less(t, len(v), 4096, "%s is small", k)
		assert.NotContains(t, v, "alice", k)
		assert.NotContains(t, v, "bob", k)
	}

	// An instance that stops removes its report: the fleet view drops it.
	require.NoError(t, b.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-b.exited:
		require.NoError(t, err, "pod-b's exit: %s", b.stderr)
	case <-time.After(15 * time.Second):
		t.Fatal("pod-b did not exit")
	}
	require.NoError(t, page.Navigate(ctx, a.base+"/dashboard/"))
	wait("pod-b left the fleet", `document.querySelectorAll("#instances tbody tr").length + " " + document.getElementById("fleet-meta").textContent`,
		func(v string) bool { return strings.HasPrefix(v, "1 1 live instance") })
	_ = page.Close(ctx)
}

// must returns v, failing on err in the caller's test through a panic-free path: it is used where
// an evaluation error shows as a mismatch anyway.
func must(v string, err error) string {
	if err != nil {
		return fmt.Sprintf("error: %v", err)
	}
	return v
}
