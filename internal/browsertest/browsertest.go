// Package browsertest drives a real headless Chromium from Go tests, over the Chrome DevTools
// Protocol on a pipe (--remote-debugging-pipe): no WebDriver, no port, nothing but Debian's
// chromium package. Tests load a page, wait for what its JavaScript draws with [Page.Eval], and
// take screenshots.
//
// Where chromium is missing, [Start] skips the test with a message saying how to install it, except
// under CI=true, where it fails the test.
package browsertest

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/hybridrate/hybridrate/internal/logtest"
)

// Binary returns the path of chromium, or skips tb (fails it when CI is "true").
func Binary(tb testing.TB) string {
	tb.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "chromium not found in PATH: install it (apt-get install -y chromium) to run the browser test"
	if os.Getenv("CI") == "true" {
		tb.Fatal(msg)
	}
	tb.Skip(msg)
	return ""
}

// Page is one tab of a headless Chromium that [Start] launched; the browser is killed in tb's
// cleanup. Its methods are safe for concurrent use.
type Page struct {
	c       *cdp
	session string
	stderr  *logtest.Buffer
}

// Start launches a headless Chromium with a fresh profile and opens one blank tab of width × height
// CSS pixels. ctx bounds the browser's life and every call.
func Start(ctx context.Context, tb testing.TB, width, height int) *Page {
	tb.Helper()
	bin := Binary(tb)
	toBrowser, browserIn, err := os.Pipe()
	if err != nil {
		tb.Fatal(err)
	}
	browserOut, fromBrowser, err := os.Pipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
		"--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+tb.TempDir(), "--remote-debugging-pipe", fmt.Sprintf("--window-size=%d,%d", width, height),
		"--hide-scrollbars", "about:blank")
	cmd.ExtraFiles = []*os.File{toBrowser, fromBrowser} // the browser's fd 3 (commands) and fd 4 (answers)
	stderr := &logtest.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		tb.Fatalf("chromium: %v", err)
	}
	toBrowser.Close()
	fromBrowser.Close()
	tb.Cleanup(func() {
		browserIn.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		browserOut.Close()
	})
	p := &Page{c: newCDP(browserIn, browserOut), stderr: stderr}
	var created struct {
		TargetID string `json:"targetId"`
	}
	if err := p.c.call(ctx, "", "Target.createTarget", map[string]any{"url": "about:blank"}, &created); err != nil {
		tb.Fatalf("chromium: %v (stderr: %s)", err, stderr)
	}
	var attached struct {
		SessionID string `json:"sessionId"`
	}
	if err := p.c.call(ctx, "", "Target.attachToTarget", map[string]any{"targetId": created.TargetID, "flatten": true}, &attached); err != nil {
		tb.Fatalf("chromium: %v", err)
	}
	p.session = attached.SessionID
	if err := p.Call(ctx, "Emulation.setDeviceMetricsOverride",
		map[string]any{"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}, nil); err != nil {
		tb.Fatalf("chromium: %v", err)
	}
	return p
}

// Call sends one DevTools command to the page and decodes its result into out (when not nil).
func (p *Page) Call(ctx context.Context, method string, params, out any) error {
	return p.c.call(ctx, p.session, method, params, out)
}

// Navigate loads url in the page.
func (p *Page) Navigate(ctx context.Context, url string) error {
	return p.Call(ctx, "Page.navigate", map[string]any{"url": url}, nil)
}

// Eval evaluates a JavaScript expression in the page and returns its value as a string ("" for
// null or undefined).
func (p *Page) Eval(ctx context.Context, expr string) (string, error) {
	var r struct {
		Result struct {
			Value any `json:"value"`
		} `json:"result"`
		ExceptionDetails any `json:"exceptionDetails"`
	}
	if err := p.Call(ctx, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true}, &r); err != nil {
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

// WaitFor evaluates expr every 100ms until ok accepts its value, and returns it; it fails tb after
// timeout.
func (p *Page) WaitFor(ctx context.Context, tb testing.TB, timeout time.Duration, what, expr string, ok func(string) bool) string {
	tb.Helper()
	var last string
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		v, err := p.Eval(ctx, expr)
		if err == nil && ok(v) {
			return v
		}
		last = fmt.Sprint(v, err)
	}
	tb.Fatalf("%s: %s is %q", what, expr, last)
	return ""
}

// Screenshot returns a PNG of the page's viewport.
func (p *Page) Screenshot(ctx context.Context) ([]byte, error) {
	var shot struct {
		Data string `json:"data"`
	}
	if err := p.Call(ctx, "Page.captureScreenshot", map[string]any{"format": "png"}, &shot); err != nil {
		return nil, err
	}
	png, err := base64.StdEncoding.DecodeString(shot.Data)
	if err != nil {
		return nil, err
	}
	if len(png) < 8 || string(png[1:4]) != "PNG" {
		return nil, fmt.Errorf("screenshot: not a PNG (%d bytes)", len(png))
	}
	return png, nil
}

// Close asks the browser to close (the cleanup kills it in any case).
func (p *Page) Close(ctx context.Context) error {
	return p.c.call(ctx, "", "Browser.close", map[string]any{}, nil)
}

// cdp is a minimal Chrome DevTools Protocol client over --remote-debugging-pipe: NUL-terminated
// JSON messages, commands written to the browser's fd 3, answers and events read from its fd 4.
type cdp struct {
	w       io.Writer
	mu      sync.Mutex // guards pending and next, and serialises writes
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
	msg := map[string]any{"id": id, "method": method, "params": params}
	if session != "" {
		msg["sessionId"] = session
	}
	b, err := json.Marshal(msg)
	if err == nil {
		_, err = c.w.Write(append(b, 0))
	}
	c.mu.Unlock()
	if err != nil {
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
